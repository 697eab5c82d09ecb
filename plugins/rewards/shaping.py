"""Per-turn shaping rewards: reply format, tag counts, reply length and the env's step rewards."""

from __future__ import annotations

import re
from typing import Sequence

from omrl.data.trajectory import Episode
from omrl.rewards import RewardError, model_token_positions

# What each action template expects once per reply; react markers must start a line.
TAG_SETS = {
    "react": (r"^Think:", r"^Act:"),
    "xml": (r"<think>", r"</think>", r"<action>", r"</action>"),
    "tool_call": (r"<tool_call>", r"</tool_call>"),
}
LENGTH_SCOPES = ("turn", "episode")


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
    episodes: list[Episode], template: str = "react", tags: list[str] | None = None, normalize: bool = True
) -> list[list[float]]:
    """Per turn, partial credit (DeepSeek-R1 style): the share of expected tags that appear exactly once.

    ``template`` picks the tags (react: ``Think:``/``Act:`` at a line start; xml:
    ``<think>``, ``</think>``, ``<action>``, ``</action>``; tool_call:
    ``<tool_call>``, ``</tool_call>``); ``tags`` gives literal tags instead.
    ``normalize`` divides by the turn count as in ``format``.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("o", "<think>go up</think><action>up", "up", False, 0.0, False)
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", turns=[turn])
    >>> tag_count_reward([ep], template="xml")
    [[0.75]]
    """
    if tags is not None:
        if not tags or not all(isinstance(t, str) and t for t in tags):
            raise RewardError(f"reward 'tag_count' option tags must be a list of non-empty strings, got {tags!r}")
        patterns = [re.escape(t) for t in tags]
    elif template in TAG_SETS:
        patterns = list(TAG_SETS[template])
    else:
        raise RewardError(
            f"reward 'tag_count' has no tags for template {template!r}; "
            f"valid: {', '.join(TAG_SETS)} (or pass tags=[...])"
        )
    compiled = [re.compile(p, re.M) for p in patterns]

    def share(response: str) -> float:
        return sum(len(c.findall(response)) == 1 for c in compiled) / len(compiled)

    return [_spread([share(t.response) for t in ep.turns], normalize) for ep in episodes]


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
