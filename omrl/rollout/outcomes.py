"""How the policy's seats fared in games of several agents (:mod:`omrl.rollout.seats`): win, draw, loss
and unfinished rates over all its episodes, per seat and per opponent, for ``omrl eval`` and the trainer."""

from __future__ import annotations

from typing import Callable, Sequence

from omrl.data.trajectory import Episode

OUTCOMES = ("win", "draw", "loss", "unfinished")


def seat_counts(episodes: Sequence[Episode]) -> dict[str, float]:
    """How many of the policy's seat episodes ended each way, as counts that add up over processes:
    ``win/all``, ``loss/seat:player_0``, ``draw/vs:scripted``, ... Episodes whose env failed count in
    none (they say nothing of the model); episodes without a seat are ignored."""
    counts: dict[str, float] = {}
    for ep in episodes:
        outcome = ep.info.get("outcome")
        if outcome not in OUTCOMES:
            continue
        for key in ("all", f"seat:{ep.info['seat']}", f"vs:{ep.info['opponent']}"):
            name = f"{outcome}/{key}"
            counts[name] = counts.get(name, 0.0) + 1.0
    return counts


def outcome_rates(counts: dict[str, float]) -> dict[str, dict[str, float]]:
    """:func:`seat_counts` as win, draw, loss and unfinished rates, with how many games each counts:
    ``all``, per seat (``seat:player_0``) and per opponent (``vs:scripted``)."""
    keys = dict.fromkeys(name.split("/", 1)[1] for name in counts)  # an opponent's URL may hold a "/"
    rates = {}
    for key in keys:
        ended = {o: counts.get(f"{o}/{key}", 0.0) for o in OUTCOMES}
        games = sum(ended.values())
        rates[key] = {"games": games, **{o: n / games for o, n in ended.items()}}
    return rates


def seat_outcomes(episodes: Sequence[Episode]) -> dict[str, dict[str, float]]:
    """How the policy's seats fared in ``episodes``: :func:`outcome_rates` of their :func:`seat_counts`."""
    return outcome_rates(seat_counts(episodes))


def seat_metrics(
    episodes: Sequence[Episode], add_up: Callable[[dict[str, float]], dict[str, float]] = dict
) -> dict[str, float]:
    """:func:`seat_outcomes` as flat metrics for ``omrl eval`` and the trainer: ``win_rate``,
    ``win_rate/seat:player_0``, ``loss_rate/vs:scripted``, ``games/vs:scripted``, ... ``add_up`` sums
    the counts over processes before the rates are taken (the trainer's ``strategy.sum_dicts``)."""
    out: dict[str, float] = {}
    for key, rates in outcome_rates(add_up(seat_counts(episodes))).items():
        suffix = "" if key == "all" else f"/{key}"
        out[f"games{suffix}"] = rates["games"]
        out.update({f"{o}_rate{suffix}": rates[o] for o in OUTCOMES})
    return out


def self_play_note(metrics: dict[str, float]) -> str | None:
    """What a table of :func:`seat_metrics` cannot say where the policy played every seat of every game:
    each of its wins is one of its losses, so the overall rates tell how games end, not how well it plays."""
    games = metrics.get("games", 0.0)
    if not games or metrics.get("games/vs:policy") != games:
        return None
    seat = [key.split(":", 1)[1] for key in metrics if key.startswith("games/seat:")][-1]
    return (
        "the policy played every seat of each game, so each of its wins is also one of its losses: win_rate and "
        "loss_rate tell how games end, not how well it plays (per seat they tell which seat is favoured); to "
        f"measure it, give a seat an opponent, e.g. seats.play.{seat}=scripted or model:DIR"
    )
