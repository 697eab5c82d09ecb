"""``solve-verify``: one task, two roles. A solver proposes an answer, a verifier accepts or rejects it.

The pattern for an env whose episode is one task worked on by several roles (docs/environments.md,
"Several roles on one task"): the roles are seats (:attr:`omrl.envs.Env.seats`), each with its own view
and its own reward, so the policy can play every role and is credited per role.

Tasks are the ``dataset`` env's: the same options (``path``, ``prompt_key``, ``answer_key``,
``test_path``, ``test_fraction``, ``seed``, ``instruction``, ``match``, ``rel_tol``, ``abs_tol``), loaded and
checked by :class:`~omrl_plugins.envs.dataset.DatasetEnv` itself. On top:

- ``rounds`` (1): revisions the solver may make after a reject (0: one proposal, one verdict).
- ``solver_accuracy`` (1.0): the share of proposals on which the env's own solver gives the reference
  answer; the others are wrong on purpose (the reference number plus one, else ``not <answer>``), drawn
  per task and round with the task id as seed, so a verifier trained against it sees both kinds.

A game: the solver (seat ``solver``) moves first and proposes an answer (read as the answer rewards read
it: ``answer[42]`` is ``42``). The verifier (seat ``verifier``) sees the task and the proposal and replies
``accept`` or ``reject: REASON``. On a reject with rounds left, the solver sees the reason and proposes
again; an accept, or a reject with none left, ends the game. A verdict that is neither (a reply that did
not parse is stepped as ``""``) is a wrong judgement and ends the game.

Seat rewards: the solver +1 when its final proposal is correct, else -1; the verifier the mean over its
verdicts of +1 for a right one (accept a correct answer, reject a wrong one) and -1 for a wrong one.
The env's own players (``scripted_action``): the solver as ``solver_accuracy`` says, and a verifier that
judges with the reference answer. Every step's info carries ``ground_truth``, ``correct`` (of the
proposal so far), ``round`` and, after a verdict, ``verdict``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from omrl.envs import Env, Observation, StepResult
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.dataset import DatasetEnv, Item
from omrl_plugins.envs.engines.common import check_running
from omrl_plugins.rewards.answers import answer_of, final_number

NAME = "solve-verify"
SEATS = ("solver", "verifier")
MAX_ROUNDS = 10
# "accept", "Reject: 2 + 3 is 5", "reject[the sum is 5]": the verdict word, then the reason
_VERDICT = re.compile(r"^\W*(accept|reject)\b\W*(.*?)\W*$", re.IGNORECASE | re.DOTALL)

SOLVER_VIEW = (
    "You are the solver. Propose your answer to the task above; a verifier will check it. {revisions}"
    "Reply with your answer alone."
)
VERIFIER_VIEW = (
    "You are the verifier. The solver will propose an answer to the task above. Reply accept if it is "
    "correct, or reject: REASON if it is not."
)


@dataclass
class _Game:
    """The live game: the task, the proposal on the table, and the verifier's judgements so far."""

    task: int
    item: Item
    round: int = 0
    proposal: str = ""
    correct: bool = False
    judgements: list[bool] = field(default_factory=list)
    to_move: str = "solver"


class SolveVerifyEnv(Env):
    """A dataset's tasks with two roles: a solver proposes an answer, a verifier accepts or rejects it."""

    action_help = (
        "As the solver: reply with your answer alone. As the verifier: reply accept, or reject: REASON "
        "(why the answer is wrong)."
    )
    action_example = "42"
    seats = SEATS
    max_turns = 4

    def __init__(
        self,
        path: str = "",
        prompt_key: str = "",
        answer_key: str = "",
        test_path: str = "",
        test_fraction: float = 0.0,
        seed: int = 0,
        instruction: str = "",
        match: str = "exact",
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
        rounds: int = 1,
        solver_accuracy: float = 1.0,
    ):
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"the {NAME} env needs plugins.{NAME}.path=FILE: the dataset env's file of prompts and answers "
                "(.jsonl, .parquet or a datasets directory)"
            )
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 0 <= rounds <= MAX_ROUNDS:
            raise ConfigError(f"{NAME} option rounds={rounds!r} is invalid; valid: an integer in 0..{MAX_ROUNDS}")
        number = isinstance(solver_accuracy, (int, float)) and not isinstance(solver_accuracy, bool)
        if not number or not 0.0 <= solver_accuracy <= 1.0:
            raise ConfigError(
                f"{NAME} option solver_accuracy={solver_accuracy!r} is invalid; valid: a number in [0, 1]"
            )
        # the dataset env loads, splits and checks the tasks: its options are refused as it refuses them
        self.tasks = DatasetEnv(
            path=path,
            prompt_key=prompt_key,
            answer_key=answer_key,
            test_path=test_path,
            test_fraction=test_fraction,
            seed=seed,
            instruction=instruction,
            match=match,
            rel_tol=rel_tol,
            abs_tol=abs_tol,
        )
        self.rounds, self.solver_accuracy = rounds, float(solver_accuracy)
        self.max_turns = 2 * (rounds + 1)  # type: ignore[misc]  # per instance: an option
        self._game: _Game | None = None

    def task_ids(self, split: str) -> Sequence[int]:
        return self.tasks.task_ids(split)

    def reset(self, task_id: int) -> Observation:
        item = self.tasks.item(task_id)
        self._game = _Game(task_id, item)
        task = f"{self.tasks.instruction}\n\n{item.prompt}" if self.tasks.instruction else item.prompt
        revisions = f"If it rejects your answer, you may revise it up to {self.rounds} time(s). " if self.rounds else ""
        views = {"solver": SOLVER_VIEW.format(revisions=revisions), "verifier": VERIFIER_VIEW}
        return Observation(views["solver"], task, self._info(), seat="solver", views=views)

    def step(self, action: str) -> StepResult:
        check_running(NAME, self._game is not None and bool(self._game.to_move))
        game = self._game
        assert game is not None
        return self._propose(game, action) if game.to_move == "solver" else self._judge(game, action)

    def _propose(self, game: _Game, action: str) -> StepResult:
        game.proposal = answer_of(action)
        game.correct = bool(game.proposal) and any(self.tasks.is_correct(game.proposal, t) for t in game.item.answers)
        game.to_move = "verifier"
        shown = f"The solver proposes: {game.proposal}" if game.proposal else "The solver proposed no answer."
        views = {"verifier": f"{shown}\nReply accept, or reject: REASON."}
        return StepResult(
            views["verifier"], 0.0, False, self._info(invalid=not game.proposal), seat="verifier", views=views
        )

    def _judge(self, game: _Game, action: str) -> StepResult:
        verdict = _VERDICT.match(action or "")
        word = verdict.group(1).lower() if verdict else ""
        reason = verdict.group(2).strip() if verdict else ""
        game.judgements.append(word == ("accept" if game.correct else "reject"))
        info = self._info(verdict=word or "unreadable", invalid=not word)
        if word == "reject" and game.round < self.rounds:
            game.round += 1
            game.to_move = "solver"
            why = f": {reason}" if reason else " (no reason given)"
            text = (
                f"The verifier rejected your answer {game.proposal or '(none)'}{why}.\n"
                f"Propose a revised answer (revision {game.round} of {self.rounds})."
            )
            return StepResult(text, 0.0, False, info, seat="solver", views={"solver": text})
        game.to_move = ""
        said = {"accept": "accepted", "reject": "rejected"}.get(word, "gave no verdict on")
        outcome = "correct" if game.correct else "wrong"
        end = f"The verifier {said} the answer {game.proposal or '(none)'}, which is {outcome}."
        rewards = {
            "solver": 1.0 if game.correct else -1.0,
            "verifier": sum(1.0 if right else -1.0 for right in game.judgements) / len(game.judgements),
        }
        return StepResult("", 0.0, True, info, views={"solver": end, "verifier": end}, seat_rewards=rewards)

    def _info(self, **extra: Any) -> dict[str, Any]:
        game = self._game
        answers = game.item.answers if game is not None else ()
        return {
            "won": bool(game and game.correct),
            "score": float(bool(game and game.correct)),
            "correct": bool(game and game.correct),
            "round": game.round if game is not None else 0,
            "ground_truth": answers[0] if len(answers) == 1 else list(answers),
            **extra,
        }

    def scripted_action(self, seat: str) -> str | None:
        game = self._game
        if game is None or seat != game.to_move:
            return None
        if seat == "solver" and random.Random(game.task * 1_009 + game.round).random() >= self.solver_accuracy:
            return self._wrong_answer(game.item.answers[0])
        return self._right_move(game)

    def _right_move(self, game: _Game) -> str:
        """The reference answer for the solver; for the verifier, the verdict the reference answer gives."""
        if game.to_move == "solver":
            return game.item.answers[0]
        return "accept" if game.correct else "reject: the answer does not match the reference answer"

    def _wrong_answer(self, reference: str) -> str:
        """An answer the task's check refuses: the reference's last number plus one, else ``not <reference>``."""
        numbers = final_number(reference)
        for wrong in ([str(numbers[0] + 1)] if numbers else []) + [f"not {reference}", "no answer"]:
            if not any(self.tasks.is_correct(wrong, truth) for truth in self._game.item.answers):  # type: ignore[union-attr]
                return wrong
        return ""

    def expert_action(self) -> str | None:
        """The right move of the seat to move (:meth:`_right_move`), whatever ``solver_accuracy`` says."""
        return self._right_move(self._game) if self._game is not None and self._game.to_move else None


@hookimpl
def register_envs(register):
    register(NAME, SolveVerifyEnv)
