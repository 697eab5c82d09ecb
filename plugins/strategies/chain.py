"""``chain``: today's rollout, one reply per turn (``group_size`` chains per task)."""

from __future__ import annotations

from typing import Sequence

from omrl.rollout.loop import collect
from omrl.rollout.progress import PerTaskProgress
from omrl.search import Expand, SearchContext, Tree, run_search
from omrl.search.tree import chain_tree
from omrl_plugins.strategies.common import first_leaf, warn_short_budget


def chain(ctx: SearchContext, tasks: Sequence[int]) -> list[Tree]:
    """One reply per turn: the chain rollout itself (unchanged numbers); the first sample is the answer.

    Without a budget the episodes come from :func:`omrl.rollout.collect`, exactly as
    ``omrl rollout`` plays them without ``--strategy``. With a budget, the same chains
    grow through the search runner, which stops each task's chains at its budget.
    """
    if ctx.budget:
        warn_short_budget(ctx, "chain samples", ctx.group_size)  # samples the budget cannot pay for are not played
        trees = run_search(ctx, tasks, grow_chains, forks=False, n=ctx.group_size)
    else:
        progress = PerTaskProgress(ctx.progress, ctx.group_size) if ctx.progress is not None else None
        episodes = collect(
            ctx.pool,
            ctx.template,
            ctx.tokenizer,
            tasks,
            backend=ctx.backend,
            limits=ctx.limits,
            split=ctx.split,
            group_size=ctx.group_size,
            seed=ctx.seed,
            expert=ctx.expert,
            demonstration=ctx.demonstration,
            progress=progress,
        )
        trees = []
        for group, task in enumerate(tasks):
            played = [ep for ep in episodes if ep.group == group]
            # as played: these are the batched rollout's own episodes (declared batched_without_budget)
            tree = chain_tree(played, int(task), group, strategy=ctx.strategy or "chain", as_played=True)
            tree.generated_tokens = sum(sum(ep.loss_mask) for ep in played)
            trees.append(tree)
    for tree in trees:
        tree.best = first_leaf(tree.root)  # pass@1: a chain does not choose among its samples
    return trees


def grow_chains(tree: Tree, ctx: SearchContext, n: int):
    """``n`` chains from the root, grown one turn at a time until each ends (or nothing more can grow)."""
    (children,) = yield Expand([tree.root], n)
    live = [child for child in children if not child.terminal]
    while live:
        grown = yield Expand(live, 1)
        live = [child for kids in grown for child in kids if not child.terminal]
