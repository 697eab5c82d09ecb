"""Running a strategy on a :class:`~omrl.rollout.RolloutSession`, as the commands do."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.rollout.mixed import is_mixed
from omrl.rollout.progress import PerTaskProgress, RolloutProgress
from omrl.rollout.session import compose_rewards
from omrl.search.context import SearchContext, plays_batched, run_strategy
from omrl.search.tree import Tree, chain_tree


@dataclass(frozen=True)
class PlaySpec:
    """How a set of tasks is played, as one value: the strategy and its token budget per task (0: no
    limit), the split (a mixture's tasks name their own), samples per task, the sampling seed, and
    whether the env's scripted expert plays instead of the model."""

    strategy: str = "chain"
    budget: int = 0
    split: str = ""
    group_size: int = 1
    seed: int = 0
    expert: bool = False


def play_strategy(
    session: Any,
    tasks: Sequence[Any],
    spec: PlaySpec,
    progress: RolloutProgress | None = None,
    rewards: bool = True,
) -> tuple[list[Tree], list[Episode]]:
    """The trees of ``spec.strategy`` on ``tasks`` and every root-to-leaf episode (``rewards``: composed).

    ``progress`` hears of each task once its search is over (``finished`` gets the
    chosen episode) and of every generated token. On a mixture (:class:`~omrl.rollout.mixed.MixedSession`)
    see :func:`play_mixture`.
    """
    if is_mixed(session):
        return play_mixture(session, tasks, spec, progress, rewards)
    if getattr(session, "agent", None) is not None:  # an agent program plays whole chains (omrl.gateway)
        per_task = PerTaskProgress(progress, spec.group_size) if progress is not None else None
        episodes = session.play(
            tasks, split=spec.split, group_size=spec.group_size, seed=spec.seed, expert=spec.expert, progress=per_task
        )
        return _chain_trees(episodes, [int(task) for task in tasks], spec.strategy), episodes
    ctx = SearchContext.from_session(session, spec, progress)
    trees = run_strategy(ctx, tasks)
    episodes = [ep for tree in trees for ep in tree.episodes()]
    if rewards:
        session.reward_summary = compose_rewards(episodes, session.reward_weights, session.plugin_options)
    return trees, episodes


def play_mixture(
    session: Any,
    tasks: Sequence[Any],
    spec: PlaySpec,
    progress: RolloutProgress | None = None,
    rewards: bool = True,
) -> tuple[list[Tree], list[Episode]]:
    """:func:`play_strategy` on a mixture's tasks (each an :class:`~omrl.mixture.EnvTask`), rewards
    composed per env. A strategy that plays the batched rollout (no budget) plays every env's chains
    in one rollout, and each task's tree is its chains with the first sample as the answer, as the
    strategy declared; any other strategy searches each env's tasks with that env's session in turn.
    Episode.group is the task's position in ``tasks`` either way."""
    if plays_batched(spec.strategy, spec.budget):
        episodes = session.play(
            tasks,
            group_size=spec.group_size,
            seed=spec.seed,
            expert=spec.expert,
            progress=PerTaskProgress(progress, spec.group_size) if progress is not None else None,
            rewards=rewards,
        )
        return _chain_trees(episodes, [int(task.task) for task in tasks], spec.strategy), episodes
    placed: list[Tree | None] = [None] * len(tasks)
    for env, positions in session.split_by_env(tasks).items():
        by_split: dict[str, list[int]] = {}
        for position in positions:
            by_split.setdefault(tasks[position].split, []).append(position)
        for split, where in by_split.items():
            one_env = dataclasses.replace(spec, split=split)
            trees, _ = play_strategy(session.session_of(env), [tasks[i].task for i in where], one_env, progress, False)
            for tree in trees:
                tree.group = where[tree.group]
                placed[tree.group] = tree
    trees = [tree for tree in placed if tree is not None]
    episodes = [ep for tree in trees for ep in tree.episodes()]
    if rewards:
        session.compose(episodes)
    return trees, episodes


def _chain_trees(episodes: list[Episode], task_ids: list[int], strategy: str) -> list[Tree]:
    """Each task's chains as its tree, the first sample the answer (a strategy that plays the batched rollout)."""
    trees = []
    for group, task in enumerate(task_ids):
        played = [ep for ep in episodes if ep.group == group]
        tree = chain_tree(played, task, group, strategy=strategy, as_played=True)
        tree.generated_tokens = sum(sum(ep.loss_mask) for ep in played)
        tree.best = _first_leaf(tree.root)
        trees.append(tree)
    return trees


def _first_leaf(node: Any) -> Any:
    while node.children:
        node = node.children[0]
    return node
