"""How the policy's seats fared in games of several agents (:mod:`omrl.rollout.seats`): win, draw, loss
and unfinished rates over all its episodes, per seat and per opponent, for ``omrl eval`` and the trainer."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from omrl.data.trajectory import Episode

OUTCOMES = ("win", "draw", "loss", "unfinished")


def seat_outcomes(episodes: Sequence[Episode]) -> dict[str, dict[str, float]]:
    """Win, draw, loss and unfinished rates of the policy's seat episodes, with how many games each
    counts: ``all``, per seat (``seat:player_0``) and per opponent (``vs:scripted``). Episodes whose env
    failed count in none (they say nothing of the model); episodes without a seat are ignored."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for ep in episodes:
        outcome = ep.info.get("outcome")
        if outcome not in OUTCOMES:
            continue
        for key in ("all", f"seat:{ep.info['seat']}", f"vs:{ep.info['opponent']}"):
            counts[key][outcome] += 1
    return {
        key: {"games": float(sum(c.values())), **{o: c[o] / sum(c.values()) for o in OUTCOMES}}
        for key, c in counts.items()
    }


def seat_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """:func:`seat_outcomes` as flat metrics for ``omrl eval`` and the trainer: ``win_rate``,
    ``win_rate/seat:player_0``, ``loss_rate/vs:scripted``, ``games/vs:scripted``, ..."""
    out: dict[str, float] = {}
    for key, rates in seat_outcomes(episodes).items():
        suffix = "" if key == "all" else f"/{key}"
        out[f"games{suffix}"] = rates["games"]
        out.update({f"{o}_rate{suffix}": rates[o] for o in OUTCOMES})
    return out
