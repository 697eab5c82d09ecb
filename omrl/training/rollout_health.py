"""What an online run's rollouts could and could not play, counted over the run (:class:`RolloutHealth`).

A step whose every episode failed in the env measured nothing: it is played again, and when its
replays fail too the run stops without counting it. At the end of a run the counts decide whether
it was a result at all: a run whose episodes all failed in the env, or failed more often than
``max_env_error_rate`` allows, or never got a model turn, exits non-zero. A run without a model turn
is blamed on ``generation.max_context`` only where episodes ended for want of it: in a game of several
seats, the others can end every game before the policy's seat moves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from omrl.data import Episode
from omrl.env_errors import the_env
from omrl.errors import ConfigError, EnvFailure, OmrlError
from omrl.gateway.agents import AGENT_REASON, IN_THE_AGENT
from omrl.rollout.live import PROTOCOL_REASON, TEMPLATE_REASON
from omrl.rollout.spec import SHORTEN_PROMPT, no_room, overlong

#: how omrl.rewards names the reward an episode failed in (its ``error`` begins so)
_REWARD_REASON = re.compile(r"reward '([^']+)': ")
#: a step whose every episode failed in the env is played again this many times before the run stops
ENV_FAILURE_REPLAYS = 2
ENV_FAILURE_WAIT = 5.0  # seconds before the first replay, doubled before each next one


@dataclass
class RolloutHealth:
    """The run's episode counts (over every process) and the state of the step being played."""

    episodes_played: int = 0
    env_failures: int = 0  # episodes that ended env_error: never trained on
    episodes_with_a_turn: int = 0
    overlong: int = 0  # episodes whose opening prompt left no room for a model turn (end_reason max_context)
    longest_prompt: int = 0  # tokens of the longest opening prompt this process played
    first_env_error: str = ""
    failed_step: str = ""  # why this step's every episode failed in the env ("" when some did not)
    failed_tries: int = 0  # rollouts of this step in a row in which every episode failed in the env
    failed_envs: list[str] = field(default_factory=list)  # of a mixture, those this process saw fail, in order

    def counts(self) -> tuple[int, int, int, int]:
        """The run's counts, to put back when a play is played again (a replay's failures do not count)."""
        return self.episodes_played, self.env_failures, self.episodes_with_a_turn, self.overlong

    def restore(self, counts: tuple[int, int, int, int]) -> None:
        self.episodes_played, self.env_failures, self.episodes_with_a_turn, self.overlong = counts

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the run's counts, so a resumed run is judged on all its episodes."""
        return {
            "health_episodes": self.episodes_played,
            "health_env_failures": self.env_failures,
            "health_with_a_turn": self.episodes_with_a_turn,
            "health_overlong": self.overlong,
            "health_first_env_error": self.first_env_error,
            "health_failed_envs": list(self.failed_envs),
        }

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        """From a checkpoint's extra state (one written before these were kept: counts from 0, as then)."""
        keys = ("health_episodes", "health_env_failures", "health_with_a_turn", "health_overlong")
        self.restore(tuple(int(extra.get(key, 0)) for key in keys))
        self.first_env_error = str(extra.get("health_first_env_error", ""))
        self.failed_envs = [str(env) for env in extra.get("health_failed_envs", [])]

    def add(
        self,
        played: int,
        lost: int,
        with_turn: int,
        prompt: int,
        first_error: str,
        too_long: int = 0,
        envs: Sequence[str] = (),
    ) -> None:
        """Count one play of a step: ``played`` episodes, ``lost`` of them failed in the env (the first
        reason ``first_error``; ``envs``: the envs this process saw them fail in), ``with_turn`` got a model
        turn, ``too_long`` had none for want of context (:func:`~omrl.rollout.spec.overlong`); ``prompt``:
        its longest opening prompt."""
        self.failed_envs += [env for env in dict.fromkeys(envs) if env not in self.failed_envs]
        self.episodes_played += played
        self.env_failures += lost
        self.episodes_with_a_turn += with_turn
        self.overlong += too_long
        self.longest_prompt = max(self.longest_prompt, prompt)
        if lost and not self.first_env_error:
            self.first_env_error = first_error or "no reason given"
        all_lost = bool(played) and lost == played
        self.failed_tries = self.failed_tries + 1 if all_lost else 0
        self.failed_step = (first_error or "on another process") if all_lost else ""

    def failed_reward(self) -> str | None:
        """The reward this step's episodes failed in (it raised or stalled), or None: they failed in the env."""
        found = _REWARD_REASON.match(self.failed_step)
        return found[1] if found else None

    def failed_template(self) -> str | None:
        """The action template this step's episodes failed in (it raised, or answered outside its protocol:
        a bug in its plugin, which a replay would meet again), or None."""
        found = TEMPLATE_REASON.match(self.failed_step)
        return found[1] if found else None

    def failed_protocol(self) -> str | None:
        """The env this step's episodes failed in by answering outside the env protocol (a tuple for a
        StepResult, a score past 1: its plugin's bug, which a replay would meet again), or None."""
        found = PROTOCOL_REASON.match(self.failed_step)
        return found[1] if found else None

    def failed_in(self, env: str) -> str:
        """What this step's every episode failed in, for a message: the reward, the action template or the
        env ``env``."""
        reward, template = self.failed_reward(), self.failed_template()
        if template:
            return f"the action template {template} (a bug in its code, not the env)"
        if self.failed_agent():
            return IN_THE_AGENT
        return f"the reward {reward!r}" if reward else self.the_env(env)

    def the_env(self, env: str) -> str:
        """The env ``env`` for a message; of a mixture, those whose episodes failed (:func:`omrl.env_errors.the_env`)."""
        return the_env(env, self.failed_envs)

    def failed_agent(self) -> bool:
        """Whether this step's episodes failed in their agent program or its reward function (omrl.gateway)."""
        return bool(AGENT_REASON.match(self.failed_step))

    def failed_step_message(self, step: int, env: str) -> str:
        """Why the run stops at ``step`` (1-based) whose every episode failed in the env or a reward (what
        was kept and how to go on: :func:`omrl.training.stopped.kept_steps`)."""
        tries = self.failed_tries
        return (
            f"step {step}: every episode failed in {self.failed_in(env)}"
            f"{f' in {tries} rollouts in a row' if tries > 1 else ''} (the last reason: "
            f"{self.failed_step}); the step is not counted"
        )

    def check_learned(self, env: str, max_context: int) -> None:
        """At the end of a run, before its final model is saved: raise where it learned nothing (every
        episode failed in the env, or none got a model turn), so no model is left that looks trained."""
        played, lost, first = self.episodes_played, self.env_failures, self.first_env_error or "on another process"
        if played and lost == played:
            raise EnvFailure(
                f"every one of the {played} episodes of this run failed in {self._where(env, first)}, so nothing "
                f"was learned; the first reason: {first}"
            )
        if played and not self.episodes_with_a_turn and self.overlong:
            raise ConfigError(
                "no episode of this run got a single model turn: the "
                f"{no_room(self.longest_prompt, max_context)}; raise it, or {SHORTEN_PROMPT}"
            )
        if played and not self.episodes_with_a_turn:
            raise OmrlError(
                f"no episode of this run got a single model turn, so nothing was learned: every one of its "
                f"{played - lost} played episodes ended before the policy's first turn, none for want of context "
                "(the steps' warnings say how: in a game of several seats, another seat ended it first); "
                "seat the policy where it gets to move, or other players (seats.play.<seat>=...)"
            )

    def check_error_rate(self, env: str, max_env_error_rate: float, output_dir: str) -> None:
        """At the end of a run, after its final model is saved (it learned from the rest): raise where more
        of its episodes failed in the env than ``max_env_error_rate`` allows."""
        played, lost, first = self.episodes_played, self.env_failures, self.first_env_error or "on another process"
        if played and lost / played > max_env_error_rate:
            raise EnvFailure(
                f"{lost} of the run's {played} episodes ({100 * lost / played:.0f}%) failed in "
                f"{self._where(env, first)}, more than max_env_error_rate={max_env_error_rate:g} allows; they were "
                f"not trained on, and the model in {output_dir} learned from the rest; the first reason: {first}"
            )

    def _where(self, env: str, first: str) -> str:
        return IN_THE_AGENT if AGENT_REASON.match(first) else self.the_env(env)


def ended_before_a_turn(episodes: Sequence[Episode]) -> str:
    """What a message says of ``episodes``, none of which got a model turn and none for want of
    context: how they ended and, in a game of several seats, which seat the policy held against whom.

    >>> ep = Episode("duel", 0, "train", "", end_reason="done", info={"seat": "player_0", "opponent": "model:m"})
    >>> ended_before_a_turn([ep, ep])
    "all 2 episodes ended (end_reason done) before the policy's seat (player_0 against model:m) moved: another seat ended each game first (a forfeit, a fold), so they measure nothing of the model"
    """
    ends = ", ".join(sorted({ep.end_reason or "none" for ep in episodes}))
    which = "the one episode" if len(episodes) == 1 else f"all {len(episodes)} episodes"
    seats = sorted(
        {f"{ep.info['seat']} against {ep.info.get('opponent') or '?'}" for ep in episodes if ep.info.get("seat")}
    )
    if not seats:
        return f"{which} ended (end_reason {ends}) before the policy's first turn"
    return (
        f"{which} ended (end_reason {ends}) before the policy's seat ({'; '.join(seats)}) moved: "
        "another seat ended each game first (a forfeit, a fold), so they measure nothing of the model"
    )


def no_turn_warning(step: int, episodes: Sequence[Episode], too_long: int, max_context: int) -> str:
    """What step ``step`` (1-based), none of whose ``episodes`` (this process's) got a model turn, says:
    ``too_long`` of them (over every process) for want of context, or else how they ended."""
    played = [ep for ep in episodes if ep.end_reason != "env_error"]
    if too_long:
        prompt = max((ep.prompt_length for ep in played if overlong(ep)), default=0)
        return (
            f"step {step}: no episode got a model turn (an opening prompt of up to {prompt} tokens, "
            f"generation.max_context={max_context})"
        )
    return f"step {step}: no episode got a model turn: {ended_before_a_turn(played)}; nothing to train on"
