"""DAPO's dynamic sampling (``algorithm.dynamic_sampling``): a step trains only groups whose samples
got different rewards, drawing more tasks until it has as many as a step plays (``tasks_per_step``
groups; in a game of several seats, one per task and seat the policy plays).

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv:2503.14476),
section 3.2. A group whose samples all scored the same has advantage 0 under every group estimator:
it adds no gradient, only shrinks the batch (and, with token-mean, dilutes the rest). Here such
groups are dropped and more tasks are drawn from the task order, at most
``dynamic_sampling_max_draws`` extra rollouts a step (a step that is still short trains on the
groups it has and says so in its metrics). Draws take the task order's next tasks and a seed of their
own, so a resumed run draws exactly what the uninterrupted one did.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Callable, Sequence

from omrl.data import Episode
from omrl.rollout.seating import Player
from omrl.rollout.spec import Played, measured
from omrl.training.rl_data import trainable

#: draw ``d`` of a step plays with seed ``step_seed + d * DRAW_SEED_STRIDE``
DRAW_SEED_STRIDE = 1_000_000_007


def groups_per_task(session: Any) -> int:
    """How many groups the rollout of one task makes in ``session`` (a :class:`~omrl.rollout.RolloutSession`):
    one, or in a game of several seats one per seat the policy plays (:mod:`omrl.rollout.seats`); the
    seats of other players make none."""
    seating = session.envs[0].seating if len(session.envs) == 1 else None
    if not seating:
        return 1
    return sum(isinstance(source, Player) and source.kind == "policy" for source in seating.values())


def varied_groups(episodes: Sequence[Episode]) -> tuple[list[list[Episode]], int]:
    """(the groups whose trainable episodes got at least two different rewards, each a list in play
    order; how many groups were dropped). A group is the episodes with one ``Episode.group``."""
    groups: dict[int, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.group].append(ep)
    kept = []
    for members in groups.values():
        rewards = {ep.total_reward for ep in trainable(members)}
        if len(rewards) > 1:
            kept.append(members)
    return kept, len(groups) - len(kept)


def fill(
    play: Callable[[int], list[Episode]], wanted: int, max_draws: int, short_anywhere: Callable[[int], bool]
) -> tuple[list[Episode], list[Episode], dict[str, float]]:
    """Play draws ``play(0)``, ``play(1)``, ... (each a rollout of the next tasks) until ``wanted``
    varied groups are in hand on every process (``short_anywhere(missing)`` asks them all) or
    ``max_draws`` extra draws were made. Returns (the first ``wanted`` varied groups' episodes,
    renumbered so that groups of different draws never share a number; every episode played;
    metrics: ``sampling_draws`` (extra rollouts made), ``groups_dropped`` (groups played and not
    trained: those whose samples all scored the same, and varied ones beyond ``wanted`` that the last
    draw brought), ``groups_short`` (varied groups missing when the draws ran out))."""
    kept: list[list[Episode]] = []
    played: list[Episode] = []
    dropped = draws = 0
    while True:
        episodes = play(draws)
        played.extend(episodes)
        varied, lost = varied_groups(episodes)
        kept.extend(varied)
        dropped += lost
        if not short_anywhere(max(wanted - len(kept), 0)) or draws >= max_draws:
            break
        draws += 1
    dropped += max(len(kept) - wanted, 0)
    kept = kept[:wanted]
    renumbered = [dataclasses.replace(ep, group=number) for number, members in enumerate(kept) for ep in members]
    metrics = {"sampling_draws": float(draws), "groups_dropped": float(dropped)}
    metrics["groups_short"] = float(max(wanted - len(kept), 0))
    return renumbered, played, metrics


def merged_draws(draws: Sequence[Played]) -> Played:
    """Several draws as one play: every episode, and each reward term's mean over all of them and per
    env (:func:`mean_summary`), as one rollout of all of them would have reported."""
    episodes = [ep for played in draws for ep in played.episodes]
    per_env: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for played in draws:
        for env, summary in played.env_rewards.items():
            per_env.setdefault(env, []).append((measured([ep for ep in played.episodes if ep.env == env]), summary))
    rewards = mean_summary([(measured(played.episodes), played.rewards) for played in draws])
    return Played(episodes, rewards, {env: mean_summary(each) for env, each in per_env.items()})


def mean_summary(summaries: Sequence[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The reward summary of several draws (each ``(episodes, summary)``), their means weighted by
    episodes: what one rollout of all of them would have reported.

    >>> mean_summary([(2, {"goal": 1.0}), (6, {"goal": 0.0})])
    {'goal': 0.25}
    """
    total = sum(count for count, _ in summaries) or 1
    keys = [key for _, summary in summaries for key in summary]
    return {
        key: sum(count * summary.get(key, 0.0) for count, summary in summaries) / total for key in dict.fromkeys(keys)
    }
