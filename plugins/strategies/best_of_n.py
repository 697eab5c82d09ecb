"""``best_of_n``: N independent chains per task; a scorer picks the answer."""

from __future__ import annotations

from typing import Sequence

from omrl.search import Score, SearchContext, Tree, run_search
from omrl.search.context import whole_number
from omrl_plugins.strategies.chain import grow_chains
from omrl_plugins.strategies.common import (
    answer_pool,
    check_samples,
    check_scorer,
)


def best_of_n(ctx: SearchContext, tasks: Sequence[int], n: int = 4, select: str = "env_reward") -> list[Tree]:
    """N chains per task, all sampled in the same backend calls; the scorer ``select`` picks the answer.

    The chains branch only at the root, so any env works (each chain resets its own
    instance). With ``select=env_reward`` the answer is the chain with the best env
    return (a verifier's choice); ``select=logprob`` or ``self_eval`` use the model alone.
    """
    whole_number("best_of_n", "n", n)
    check_samples(ctx, "best_of_n option n", n)  # warns of a "best-of-4" row that would be best-of-2
    check_scorer(ctx, select, "select")
    return run_search(ctx, tasks, _grow, forks=False, n=n, select=select)


def _grow(tree: Tree, ctx: SearchContext, n: int, select: str):
    yield from grow_chains(tree, ctx, n)
    leaves = answer_pool([leaf for leaf in tree.leaves() if leaf.parent is not None])
    if leaves:
        scores = yield Score(leaves, select)
        tree.best = leaves[max(range(len(leaves)), key=lambda i: (scores[i], -i))]
