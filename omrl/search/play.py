"""Running a strategy on a :class:`~omrl.rollout.RolloutSession`, as the commands do."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.rollout.progress import PerTaskProgress, RolloutProgress
from omrl.rollout.spec import Played, PlaySpec
from omrl.search.context import SearchContext, plays_batched, run_strategy
from omrl.search.tree import Tree, chain_tree


def play_strategy(
    session: Any, tasks: Sequence[Any], spec: PlaySpec, progress: RolloutProgress | None = None
) -> Played:
    """``spec.strategy`` played on ``tasks``: each task's tree (``Played.trees``) and every root-to-leaf
    episode, rewards composed per env unless ``spec.rewards`` is off.

    A strategy that plays the batched rollout (no budget) plays every env's chains in one rollout
    (:meth:`~omrl.rollout.RolloutSession.play`), and each task's tree is its chains with the first
    sample as the answer, as the strategy declared; any other strategy searches each env's tasks with
    that env in turn. ``progress`` hears of each task once its search is over (``finished`` gets the
    chosen episode) and of every generated token. Episode.group is the task's position in ``tasks``
    either way.
    """
    if session.agent is not None or plays_batched(spec.strategy, spec.budget):
        per_task = PerTaskProgress(progress, spec.group_size) if progress is not None else None
        played = session.play(tasks, spec, per_task)
        played.trees = _chain_trees(played.episodes, spec.strategy)
        return played
    placed: list[Tree | None] = [None] * len(tasks)
    by_env_split: dict[tuple[str, str], list[int]] = {}
    for position, task in enumerate(tasks):
        env, split, _ = session.env_task(task, spec.split)
        by_env_split.setdefault((env, split), []).append(position)
    contexts = {
        (env, split): SearchContext.from_session(session, dataclasses.replace(spec, split=split), progress, env)
        for env, split in by_env_split
    }
    for ctx in contexts.values():  # on no tasks: an env the strategy cannot search fails before any is searched
        with warnings.catch_warnings():  # what it warns of, the search itself says again
            warnings.simplefilter("ignore")
            run_strategy(ctx, [])
    for (env, split), where in by_env_split.items():
        ctx = contexts[(env, split)]
        for tree in run_strategy(ctx, [session.env_task(tasks[i], split).task for i in where]):
            tree.group = where[tree.group]
            placed[tree.group] = tree
    trees = [tree for tree in placed if tree is not None]
    episodes = [ep for tree in trees for ep in tree.episodes()]
    played = session.compose(episodes) if spec.rewards else Played(episodes)
    played.trees = trees
    return played


def _chain_trees(episodes: list[Episode], strategy: str) -> list[Tree]:
    """Each group's chains as its tree, the first sample the answer (a strategy that plays the batched
    rollout); a group is a task's samples (of one seat, in a game of several)."""
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    trees = []
    for group, played in sorted(groups.items()):
        tree = chain_tree(played, int(played[0].task_id), group, strategy=strategy, as_played=True)
        tree.generated_tokens = sum(sum(ep.loss_mask) for ep in played)
        tree.best = _first_leaf(tree.root)
        trees.append(tree)
    return trees


def _first_leaf(node: Any) -> Any:
    while node.children:
        node = node.children[0]
    return node
