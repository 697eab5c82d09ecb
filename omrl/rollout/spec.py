"""What a play is asked (:class:`PlaySpec`, with its :class:`RolloutLimits`) and what it gives back
(:class:`Played`): one value each way, so a play's settings are never swapped on a session and its
results never read off one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omrl.chat import check_history
from omrl.config.sections import BATCHING
from omrl.data.trajectory import Episode
from omrl.errors import ConfigError
from omrl.rewards import RewardError


@dataclass
class RolloutLimits:
    """How long turns and episodes may get, how replies are sampled, and how history is carried."""

    max_new_tokens: int = 96  # per model turn (lowered to what the context still allows)
    max_context: int = 2048  # tokens per row: its prompt plus its turns (one row per episode, unless split)
    max_turns: int = 0  # 0: the env class's own cap
    temperature: float = 1.0
    top_p: float = 1.0
    history: str = "keep"  # chat.history: keep or as_template (omrl.chat.history)
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat.template_kwargs: the template's options

    @classmethod
    def from_config(
        cls, generation: Any, max_turns: int = 0, history: str = "keep", template_kwargs: dict | None = None
    ) -> "RolloutLimits":
        """From a GenerationConfig plus the env config's ``max_turns`` and the chat config's ``history`` and
        ``template_kwargs``, each checked (:func:`check_generation`)."""
        check_generation(generation, max_turns)
        return cls(
            generation.max_new_tokens,
            generation.max_context,
            max_turns,
            generation.temperature,
            generation.top_p,
            check_history(history),
            dict(template_kwargs or {}),
        )


def check_generation(generation: Any, max_turns: int = 0) -> None:
    """Refuse sampling settings no episode can be played with (a GenerationConfig, and ``env.max_turns``),
    naming each and what is valid."""
    from omrl.backends import BACKENDS

    if generation.backend not in BACKENDS:  # before a model loads (config show refuses it too)
        raise ConfigError(f"unknown generation backend {generation.backend!r}; valid: {', '.join(BACKENDS)}")
    if not generation.temperature >= 0 or not 0 < generation.top_p <= 1:
        raise ConfigError(
            f"generation.temperature must be >= 0 (0: greedy) and generation.top_p in (0, 1]; got "
            f"temperature={generation.temperature}, top_p={generation.top_p}"
        )
    if generation.max_new_tokens < 1 or generation.max_context <= generation.max_new_tokens:
        raise ConfigError(
            f"generation.max_new_tokens must be >= 1 and generation.max_context larger than it (it holds "
            f"the prompt too); got max_new_tokens={generation.max_new_tokens}, max_context={generation.max_context}"
        )
    if max_turns < 0:
        raise ConfigError(f"env.max_turns must be >= 0 (0: the env's own cap), got {max_turns}")
    batching = getattr(generation, "batching", "turns")  # a GenerationConfig from before the option has none
    if batching not in BATCHING:
        raise ConfigError(f"unknown generation.batching {batching!r}; valid: {', '.join(BATCHING)}")


@dataclass(frozen=True)
class PlaySpec:
    """How a set of tasks is played.

    ``split``: the split a bare task id is drawn from ("" is the env's own ``env.split``; a mixture's
    tasks name their own). ``group_size`` samples per task from sampling seed ``seed``; ``expert``:
    the env's scripted expert plays instead of the model. ``max_parallel`` caps the episodes played at
    once (0: all). ``limits``: the sampling limits of this play (None: the session's own; an
    evaluation's temperature goes here). ``rewards``: compose the rewards of what is played (off where
    only chosen episodes get them). ``strategy`` and its token ``budget`` per task (0: no limit) are
    read by :func:`omrl.search.play_strategy`, which plays the batched rollout through
    :meth:`omrl.rollout.RolloutSession.play` where the strategy declares that it does.
    """

    split: str = ""
    group_size: int = 1
    seed: int = 0
    expert: bool = False
    max_parallel: int = 0
    limits: RolloutLimits | None = None
    rewards: bool = True
    strategy: str = "chain"
    budget: int = 0


@dataclass
class Played:
    """What a play gave: its ``episodes`` (ordered by group, then sample), the mean of each reward term
    over them (``rewards``, episode-weighted over every env) and per env (``env_rewards``; one entry for
    a one-env session), and with a search strategy each task's tree (``trees``; empty for chains)."""

    episodes: list[Episode]
    rewards: dict[str, float] = field(default_factory=dict)
    env_rewards: dict[str, dict[str, float]] = field(default_factory=dict)
    trees: list[Any] = field(default_factory=list)


def measured(episodes: list[Episode]) -> int:
    """How many of ``episodes`` measured the agent: an ``env_error`` episode counts in no reward mean."""
    return sum(ep.end_reason != "env_error" for ep in episodes)


def overlong(episode: Episode) -> bool:
    """Whether ``episode`` never started: its opening prompt left no room within ``generation.max_context``
    (end reason ``max_context`` before a model turn). The setting failed, not the model: such episodes
    count in no success rate and train nothing, and are counted apart (``overlong_prompts``), as verl's
    ``filter_overlong_prompts`` leaves such prompts out."""
    return episode.end_reason == "max_context" and not episode.turns


class OverlongPromptWarning(UserWarning):
    """Some episodes' opening prompts did not fit ``generation.max_context`` (:func:`overlong_note`)."""


def overlong_note(episodes: list[Episode], max_context: int) -> str | None:
    """The line that says how many of ``episodes`` (but not all: then nothing played, which the commands
    refuse on their own) were :func:`overlong`, and the setting to raise; None when none was."""
    too_long = [ep for ep in episodes if overlong(ep)]
    if not too_long or len(too_long) == len(episodes):
        return None
    longest = max(ep.prompt_length for ep in too_long)
    return (
        f"{len(too_long)} of {len(episodes)} episodes never started: their {no_room(longest, max_context)}; "
        f"they are left out of success rates and training (overlong_prompts); raise generation.max_context, "
        f"or {SHORTEN_PROMPT}"
    )


SHORTEN_PROMPT = "shorten the prompt (env.demonstration=false drops the worked example)"


def no_room(longest_prompt: int, max_context: int) -> str:
    """What every overlong message says: the longest opening prompt and the setting it did not fit."""
    return f"opening prompt (up to {longest_prompt} tokens) leaves no room within generation.max_context={max_context}"


def merged_rewards(per_env: dict[str, tuple[dict[str, float], int]]) -> dict[str, float]:
    """Per-episode means over every env from each env's (means, episode count): a term only some
    envs reward is averaged over those envs' episodes."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for summary, n in per_env.values():
        for key, value in summary.items():
            totals[key] = totals.get(key, 0.0) + value * n
            counts[key] = counts.get(key, 0) + n
    return {key: totals[key] / max(1, counts[key]) for key in totals}


class UnscoredEpisodes(RewardError):
    """A reward failed on played ``episodes`` (their rewards cleared): the command that played them writes
    them unscored (:func:`omrl.rollout.convert.keep_unscored`) before it fails, so the play is not lost."""

    def __init__(self, message: str, episodes: list[Episode], tokenizer: Any):
        super().__init__(message)
        self.episodes, self.tokenizer = episodes, tokenizer
