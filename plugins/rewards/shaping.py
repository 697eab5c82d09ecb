"""Per-turn shaping rewards: reply format, tag counts, reply length and the env's step rewards."""

from __future__ import annotations

import re
import warnings
from typing import Sequence

from omrl.data.trajectory import Episode
from omrl.rewards import RewardError, model_token_positions

LENGTH_SCOPES = ("turn", "episode")


class RewardWarning(UserWarning):
    """A shaping reward that cannot pay what it is for in this run (``tag_count`` with a template without tags)."""


def _spread(flags: Sequence[float], normalize: bool) -> list[float]:
    """Per-turn values, divided by the turn count when ``normalize`` so that they sum to their mean."""
    return [v / len(flags) for v in flags] if normalize and flags else [float(v) for v in flags]


def format_reward(episodes: list[Episode], normalize: bool = True) -> list[list[float]]:
    """Per turn, 1 if the reply followed the action template (``Turn.format_ok``), else 0.

    With ``normalize`` (the default) each value is divided by the episode's turn
    count, so an episode sums to the fraction of well-formatted turns and long
    episodes earn no more than short ones.

    >>> from omrl.data import Episode, Turn
    >>> ok, sloppy = (Turn("o", "r", "up", fmt, 0.0, False) for fmt in (True, False))
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", turns=[ok, sloppy])
    >>> format_reward([ep])
    [[0.5, 0.0]]
    >>> format_reward([ep], normalize=False)
    [[1.0, 0.0]]
    """
    return [_spread([float(t.format_ok) for t in ep.turns], normalize) for ep in episodes]


def tag_count_reward(
    episodes: list[Episode],
    template: str | None = None,
    tags: list[str] | None = None,
    normalize: bool = True,
    reply_tags: list[str] | None = None,
) -> list[list[float]]:
    """Per turn, partial credit (DeepSeek-R1 style): the share of expected tags that appear exactly once.

    The tags are the run's action template's (its ``reply_tags``, which a rollout session passes as
    ``reply_tags``: react ``Think:``/``Act:`` at a line start; xml ``<think>``, ``</think>``,
    ``<action>``, ``</action>``; tool_call ``<tool_call>``, ``</tool_call>``); ``template`` names
    another registered template to take them from, ``tags`` gives literal tags instead. Called with
    none of them, react's. A run template without tags (llama3's bare JSON calls, a plugin's template that
    declares none) scores 0 with a warning. ``normalize`` divides by the turn count as in ``format``.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("o", "<think>go up</think><action>up", "up", False, 0.0, False)
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", turns=[turn])
    >>> tag_count_reward([ep], template="xml")
    [[0.75]]
    """
    if tags is not None:
        if not isinstance(tags, (list, tuple)) or not tags or not all(isinstance(t, str) and t for t in tags):
            raise RewardError(f"reward 'tag_count' option tags must be a list of non-empty strings, got {tags!r}")
        patterns = [re.escape(t) for t in tags]
    elif template is not None:
        patterns = list(_template_tags(template))
    elif reply_tags is not None:
        if not isinstance(reply_tags, (list, tuple)) or not all(isinstance(t, str) and t for t in reply_tags):
            raise RewardError(
                f"reward 'tag_count' option reply_tags must be a list of regular expressions, got {reply_tags!r}"
            )
        patterns = list(reply_tags)
    else:
        patterns = list(_template_tags("react"))
    if not patterns and template is None:  # the run's template (a third-party one, llama3's calls) has no tags
        warnings.warn(
            "reward 'tag_count' scores 0: this run's action template expects no tags (its reply_tags are empty); "
            "give plugins.tag_count.tags=[...] to count some, or drop tag_count from reward.weights",
            RewardWarning,
            stacklevel=2,
        )
        return [[0.0] * len(ep.turns) for ep in episodes]
    if not patterns:
        raise RewardError(
            f"reward 'tag_count' has no tags to count: template {template!r} expects none (its reply_tags are "
            f"empty); give plugins.tag_count.tags=[...], or template= one of {', '.join(_tagged_templates())}"
        )
    compiled = [re.compile(p, re.M) for p in patterns]

    def share(response: str) -> float:
        return sum(len(c.findall(response)) == 1 for c in compiled) / len(compiled)

    return [_spread([share(t.answer) for t in ep.turns], normalize) for ep in episodes]


def _template_tags(name: str) -> tuple[str, ...]:
    """The ``reply_tags`` of the registered template ``name``."""
    from omrl import registry

    if name not in registry.templates.names():
        raise RewardError(
            f"reward 'tag_count' has no tags for template {name!r}; "
            f"valid: {', '.join(_tagged_templates())} (or pass tags=[...])"
        )
    return tuple(getattr(registry.templates.get(name), "reply_tags", ()))


def _tagged_templates() -> list[str]:
    """The registered templates that expect tags."""
    from omrl import registry

    return [name for name in registry.templates.names() if getattr(registry.templates.get(name), "reply_tags", ())]


def length_penalty(
    episodes: list[Episode], budget: int = 64, per_token: float = 0.005, scope: str = "turn"
) -> list[list[float]]:
    """``-per_token`` for every model token beyond ``budget`` (a value <= 0).

    ``scope="turn"`` gives each reply its own budget and penalty (it curbs the
    runaway reply length of a collapsing policy); ``scope="episode"`` counts all
    model tokens of the episode against one budget and puts the penalty on the
    last turn. Tokens are counted from ``Turn.span`` and ``Episode.loss_mask``.

    >>> from omrl.data import Episode, Turn
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="",
    ...              token_ids=[0] * 12, loss_mask=[0, 0] + [1] * 10,
    ...              turns=[Turn("o", "r", "up", True, 0.0, False, span=(2, 5)),
    ...                     Turn("o", "r", "up", True, 0.0, True, span=(5, 12))])
    >>> length_penalty([ep], budget=4, per_token=0.5)
    [[0.0, -1.5]]
    >>> length_penalty([ep], budget=4, per_token=0.5, scope="episode")
    [[0.0, -3.0]]
    """
    if scope not in LENGTH_SCOPES:
        raise RewardError(f"reward 'length_penalty' has no scope {scope!r}; valid: {', '.join(LENGTH_SCOPES)}")
    if budget < 0 or per_token < 0:
        raise RewardError(
            f"reward 'length_penalty' needs budget >= 0 and per_token >= 0, "
            f"got budget={budget!r}, per_token={per_token!r}"
        )

    def penalty(tokens: int) -> float:
        excess = max(0, tokens - budget)
        return -per_token * excess if excess else 0.0  # never -0.0

    out = []
    for ep in episodes:
        if ep.turns and not ep.token_ids:
            raise RewardError(
                f"reward 'length_penalty' counts tokens, but episode (env {ep.env!r}, task "
                f"{ep.task_id}) has no token ids (was it played by a backend that keeps none?)"
            )
        lengths = [len(positions) for positions in model_token_positions(ep)]
        if scope == "turn":
            out.append([penalty(n) for n in lengths])
        elif lengths:
            out.append([0.0] * (len(lengths) - 1) + [penalty(sum(lengths))])
        else:
            out.append([])
    return out


def process_reward(episodes: list[Episode], invalid_penalty: float = 0.0) -> list[list[float]]:
    """Per turn, the env's step reward minus ``invalid_penalty`` for an invalid action.

    A turn is invalid when the env flagged it (``info["invalid"]``) or when the
    reply held no parsable action.

    >>> from omrl.data import Episode, Turn
    >>> good = Turn("o", "r", "up", True, 0.5, False)
    >>> bad = Turn("o", "r", "fly", True, 0.0, False, info={"invalid": True})
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", turns=[good, bad])
    >>> process_reward([ep], invalid_penalty=0.1)
    [[0.5, -0.1]]
    """

    def value(turn) -> float:
        invalid = bool(turn.info.get("invalid", False)) or turn.action is None
        return float(turn.reward) - (invalid_penalty if invalid else 0.0)

    return [[value(t) for t in ep.turns] for ep in episodes]
