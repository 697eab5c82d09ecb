"""Running a strategy on a :class:`~omrl.rollout.RolloutSession`, as the commands do."""

from __future__ import annotations

from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.session import compose_rewards
from omrl.search.context import SearchContext, run_strategy
from omrl.search.tree import Tree


def play_strategy(
    session: Any,
    strategy: str,
    tasks: Sequence[int],
    *,
    split: str,
    budget: int = 0,
    group_size: int = 1,
    seed: int = 0,
    expert: bool = False,
    progress: RolloutProgress | None = None,
    rewards: bool = True,
) -> tuple[list[Tree], list[Episode]]:
    """The trees of ``strategy`` on ``tasks`` and every root-to-leaf episode (``rewards``: composed).

    ``progress`` hears of each task once its search is over (``finished`` gets the
    chosen episode) and of every generated token.
    """
    ctx = SearchContext.from_session(
        session,
        strategy,
        split=split,
        seed=seed,
        budget=budget,
        group_size=group_size,
        expert=expert,
        progress=progress,
    )
    trees = run_strategy(ctx, tasks)
    episodes = [ep for tree in trees for ep in tree.episodes()]
    if rewards:
        session.reward_summary = compose_rewards(episodes, session.reward_weights, session.plugin_options)
    return trees, episodes
