"""What an online run's rollouts could and could not play, counted over the run (:class:`RolloutHealth`).

A step whose every episode failed in the env measured nothing: it is played again, and when its
replays fail too the run stops without counting it. At the end of a run the counts decide whether
it was a result at all: a run whose episodes all failed in the env, or failed more often than
``max_env_error_rate`` allows, or never got a model turn, exits non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omrl.errors import ConfigError, EnvFailure

#: a step whose every episode failed in the env is played again this many times before the run stops
ENV_FAILURE_REPLAYS = 2
ENV_FAILURE_WAIT = 5.0  # seconds before the first replay, doubled before each next one


@dataclass
class RolloutHealth:
    """The run's episode counts (over every process) and the state of the step being played."""

    episodes_played: int = 0
    env_failures: int = 0  # episodes that ended env_error: never trained on
    episodes_with_a_turn: int = 0
    longest_prompt: int = 0  # tokens of the longest opening prompt this process played
    first_env_error: str = ""
    failed_step: str = ""  # why this step's every episode failed in the env ("" when some did not)
    failed_tries: int = 0  # rollouts of this step in a row in which every episode failed in the env

    def counts(self) -> tuple[int, int, int]:
        """The run's counts, to put back when a play is played again (a replay's failures do not count)."""
        return self.episodes_played, self.env_failures, self.episodes_with_a_turn

    def restore(self, counts: tuple[int, int, int]) -> None:
        self.episodes_played, self.env_failures, self.episodes_with_a_turn = counts

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the run's counts, so a resumed run is judged on all its episodes."""
        return {
            "health_episodes": self.episodes_played,
            "health_env_failures": self.env_failures,
            "health_with_a_turn": self.episodes_with_a_turn,
            "health_first_env_error": self.first_env_error,
        }

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        """From a checkpoint's extra state (one written before these were kept: counts from 0, as then)."""
        self.restore(
            tuple(int(extra.get(key, 0)) for key in ("health_episodes", "health_env_failures", "health_with_a_turn"))
        )
        self.first_env_error = str(extra.get("health_first_env_error", ""))

    def add(self, played: int, lost: int, with_turn: int, prompt: int, first_error: str) -> None:
        """Count one play of a step: ``played`` episodes, ``lost`` of them failed in the env (the first
        reason ``first_error``), ``with_turn`` got a model turn; ``prompt``: its longest opening prompt."""
        self.episodes_played += played
        self.env_failures += lost
        self.episodes_with_a_turn += with_turn
        self.longest_prompt = max(self.longest_prompt, prompt)
        if lost and not self.first_env_error:
            self.first_env_error = first_error or "no reason given"
        all_lost = bool(played) and lost == played
        self.failed_tries = self.failed_tries + 1 if all_lost else 0
        self.failed_step = (first_error or "on another process") if all_lost else ""

    def failed_step_message(self, step: int, env: str) -> str:
        """Why the run stops at ``step`` (1-based) whose every episode failed in the env (what was kept
        and how to go on: :func:`omrl.training.checkpoint.kept_steps`)."""
        tries = self.failed_tries
        return (
            f"step {step}: every episode failed in the env {env!r}"
            f"{f' in {tries} rollouts in a row' if tries > 1 else ''} (the last reason: "
            f"{self.failed_step}); the step is not counted"
        )

    def check_run(self, env: str, max_env_error_rate: float, max_context: int, output_dir: str) -> None:
        """At the end of a run: raise when it was no result (see the module's docstring)."""
        played, lost, first = self.episodes_played, self.env_failures, self.first_env_error or "on another process"
        if played and lost == played:
            raise EnvFailure(
                f"every one of the {played} episodes of this run failed in the env {env!r}, so nothing was "
                f"learned; the first reason: {first}"
            )
        if played and lost / played > max_env_error_rate:
            raise EnvFailure(
                f"{lost} of the run's {played} episodes ({100 * lost / played:.0f}%) failed in the env {env!r}, "
                f"more than max_env_error_rate={max_env_error_rate:g} allows; they were not trained on, and the "
                f"model in {output_dir} learned from the rest; the first reason: {first}"
            )
        if played and not self.episodes_with_a_turn:
            raise ConfigError(
                f"no episode of this run got a single model turn: the opening prompt (up to "
                f"{self.longest_prompt} tokens) leaves no room within generation.max_context={max_context}; "
                "raise it, or shorten the prompt (env.demonstration=false drops the worked example)"
            )
