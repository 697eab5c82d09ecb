"""``dataset``: RL on any file of prompts and answers, one question an episode (no plugin to write).

Options (config block ``plugins.dataset``):

- ``path`` (required): a ``.jsonl`` file (one JSON object a line; a ``.json`` file may also hold
  a list of objects), a ``.parquet`` file, or a directory written by Hugging Face ``datasets``'
  ``save_to_disk`` (needs ``pip install datasets``; a ``DatasetDict`` gives its ``train`` split,
  and its ``test`` split as the test split unless ``test_path`` or ``test_fraction`` says otherwise).
- ``prompt_key`` and ``answer_key``: the columns holding the prompt and the answer; by default the
  first present of ``prompt``, ``question``, ``problem``, ``input`` and of ``answer``,
  ``ground_truth``, ``solution``, ``target``, ``reward_model.ground_truth``. A dotted key reads a
  nested field (verl's ``reward_model.ground_truth``). A prompt is text, or a chat (a list of
  ``{role, content}`` messages), whose contents become one paragraph each. An answer is text, a
  number (written as text: ``72`` and ``72.0`` become ``"72"``) or a list of those, any of which counts.
- Splits: ``test_path`` (a second file, the test split), or ``test_fraction`` (a share of ``path``'s
  rows drawn at random with ``seed``, 0 by default: the same rows every time). With neither, the test
  split is empty (training then skips its evaluations). Train task ids are 0.. in file order, test
  task ids 1,000,000.. in file order.
- ``max_attempts`` (1): turns per episode; a wrong answer with attempts left is told "Incorrect, try
  again." and gets another turn.
- ``instruction`` (""): text put before every prompt, e.g. "Answer with a number."
- ``match``: how the env scores an answer, ``exact`` (the default: as the ``exact_match`` reward,
  normalised text), ``numeric`` (as ``numeric_match``: the last number, within ``rel_tol`` and
  ``abs_tol``) or ``math`` (as ``math_verify``; ``pip install 'omrl[math]'``).

An answer is read from the action as the answer rewards read it (``answer[42]`` counts as ``42``).
Reward: 1.0 for a correct answer, else 0; ``won`` and ``score`` (1 or 0) say whether any attempt
was correct. Every step's info carries the accepted answers as ``ground_truth`` (a list when there
are several), so ``exact_match``, ``accuracy``, ``numeric_match`` and ``math_verify`` score the
episode as well, and ``correct`` and ``attempt``. The expert answers with the first accepted answer.

Files are read once per process (the pool's instances share them) and again when they change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from omrl.envs import Env, EpisodeFinishedError, Observation, StepResult
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.dataset_files import FORMATS, NAME, Item, load_data
from omrl_plugins.envs.engines.common import check_task_in_splits, split_ids
from omrl_plugins.rewards.answers import (
    answer_of,
    check_tolerances,
    math_equivalent,
    numbers_match,
    require_math_verify,
)
from omrl_plugins.rewards.outcome import normalize_answer

MATCHES = ("exact", "numeric", "math")
TEST_START = 1_000_000


@dataclass(frozen=True)
class DatasetState:
    """A live episode, as ``DatasetEnv.snapshot`` returns it."""

    task_id: int
    attempt: int
    done: bool


class DatasetEnv(Env):
    """Prompts and answers from a JSONL or parquet file (or a datasets directory): one question an episode."""

    action_help = "Reply with your final answer alone."
    max_turns = 1
    deterministic = True

    def __init__(
        self,
        path: str = "",
        prompt_key: str = "",
        answer_key: str = "",
        test_path: str = "",
        test_fraction: float = 0.0,
        seed: int = 0,
        max_attempts: int = 1,
        instruction: str = "",
        match: str = "exact",
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
    ):
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"the {NAME} env needs plugins.{NAME}.path=FILE: {FORMATS} with a prompt and an answer per row"
            )
        texts = {"prompt_key": prompt_key, "answer_key": answer_key, "test_path": test_path, "instruction": instruction}
        for name, value in texts.items():
            if not isinstance(value, str):
                raise ConfigError(f"{NAME} option {name}={value!r} is invalid; valid: text")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction < 1:
            raise ConfigError(f"{NAME} option test_fraction={test_fraction!r} is invalid; valid: a number in [0, 1)")
        if test_path and test_fraction:
            raise ConfigError(f"{NAME} options test_path and test_fraction both give a test split; set one of them")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{NAME} option seed={seed!r} is invalid; valid: an integer")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100:
            raise ConfigError(f"{NAME} option max_attempts={max_attempts!r} is invalid; valid: an integer in 1..100")
        if match not in MATCHES:
            raise ConfigError(f"{NAME} option match={match!r} is invalid; valid: {', '.join(MATCHES)}")
        check_tolerances(f"{NAME} env", rel_tol, abs_tol, error=ConfigError)
        if match == "math":  # refused when the env is built, not at its first answer
            require_math_verify(f"the {NAME} env's match=math", error=ConfigError)
        self.match, self.rel_tol, self.abs_tol = match, float(rel_tol), float(abs_tol)
        self.instruction = instruction
        self.max_turns = max_attempts  # type: ignore[misc]  # per instance: an option
        self.data = load_data(path, prompt_key, answer_key, test_path, float(test_fraction), seed, match)
        self.splits_ids = {
            "train": range(0, len(self.data.train)),
            "test": range(TEST_START, TEST_START + len(self.data.test)),
        }
        self._item: Item | None = None
        self._task = -1
        self._attempt = 0
        self._done = True

    def task_ids(self, split: str) -> Sequence[int]:
        return split_ids(NAME, split, self.splits_ids)

    def item(self, task_id: int) -> Item:
        """The row of ``task_id``."""
        check_task_in_splits(NAME, task_id, {name: ids for name, ids in self.splits_ids.items() if ids})
        return self.data.train[task_id] if task_id < TEST_START else self.data.test[task_id - TEST_START]

    def reset(self, task_id: int) -> Observation:
        self._item, self._task, self._attempt, self._done = self.item(task_id), task_id, 0, False
        text = f"{self.instruction}\n\n{self._item.prompt}" if self.instruction else self._item.prompt
        answers = self._item.answers  # for a judge, where the reply never reached step (it did not parse)
        truth = answers[0] if len(answers) == 1 else list(answers)
        return Observation(text, text, {"won": False, "score": 0.0, "ground_truth": truth})

    def step(self, action: str) -> StepResult:
        if self._done or self._item is None:
            raise EpisodeFinishedError(f"{NAME}: the episode is over; call reset(task_id) to start another")
        self._attempt += 1
        answer = answer_of(action)
        correct = bool(answer) and any(self.is_correct(answer, truth) for truth in self._item.answers)
        self._done = correct or self._attempt >= self.max_turns
        if correct:
            text = "Correct."
        elif self._done:
            text = "Incorrect."
        else:
            text = f"Incorrect, try again (attempt {self._attempt + 1} of {self.max_turns})."
        answers = self._item.answers
        info: dict[str, Any] = {
            "won": correct,
            "score": float(correct),
            "correct": correct,
            "attempt": self._attempt,
            "invalid": not answer,
            "ground_truth": answers[0] if len(answers) == 1 else list(answers),
        }
        return StepResult(text, float(correct), self._done, info)

    def is_correct(self, answer: str, truth: str) -> bool:
        """``answer`` against one accepted answer under this env's ``match``."""
        if self.match == "numeric":
            return numbers_match(answer, truth, self.rel_tol, self.abs_tol)
        if self.match == "math":
            return math_equivalent(answer, truth)
        return normalize_answer(answer) == normalize_answer(truth)

    def expert_action(self) -> str | None:
        return self._item.answers[0] if self._item is not None and not self._done else None

    def snapshot(self) -> DatasetState:
        if self._item is None:
            raise EpisodeFinishedError(f"{NAME}: no episode to snapshot; call reset(task_id) first")
        return DatasetState(self._task, self._attempt, self._done)

    def restore(self, state: DatasetState) -> None:
        self._item, self._task = self.item(state.task_id), state.task_id
        self._attempt, self._done = state.attempt, state.done


@hookimpl
def register_envs(register):
    register(NAME, DatasetEnv)
