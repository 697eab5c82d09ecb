"""``beam``: breadth-first tree search as in Tree-of-Thoughts (Yao et al. 2023, "Tree of Thoughts")."""

from __future__ import annotations

from typing import Sequence

from omrl.search import Expand, Node, Score, SearchContext, Tree, run_search
from omrl.search.context import whole_number, yes_or_no
from omrl_plugins.strategies.common import (
    answer_pool,
    check_samples,
    check_scorer,
    pick_answer,
)


def beam(
    ctx: SearchContext,
    tasks: Sequence[int],
    width: int = 2,
    branch: int = 3,
    scorer: str = "env_reward",
    stop_on_win: bool = True,
    select: str = "",
) -> list[Tree]:
    """Breadth-first tree search (ToT): keep the ``width`` best of ``branch`` candidates per node.

    Every kept node gets ``branch`` candidate replies, each stepped in its own env copy;
    the ``width`` best open nodes by ``scorer`` go on. The answer: a won episode, else
    the best finished one. ``stop_on_win`` ends a task's search at its first won episode (test time); turn it
    off to grow whole trees as training data. ``select`` (a scorer) picks the answer among the finished
    episodes instead: with ``stop_on_win=false`` the search never looks at the env's outcome, so it
    can be compared with a best-of-N that does not either (with ``stop_on_win`` it still stops at a win).
    """
    whole_number("beam", "width", width)
    whole_number("beam", "branch", branch)
    yes_or_no("beam", "stop_on_win", stop_on_win)
    check_samples(ctx, "beam option branch", branch)
    check_scorer(ctx, scorer, "scorer")
    if select:
        check_scorer(ctx, select, "select")
    return run_search(
        ctx, tasks, _grow, width=width, branch=branch, scorer=scorer, stop_on_win=stop_on_win, select=select
    )


def _grow(tree: Tree, ctx: SearchContext, width: int, branch: int, scorer: str, stop_on_win: bool, select: str):
    frontier: list[Node] = [tree.root]
    finished: list[Node] = []
    while frontier:
        grown = yield Expand(frontier, branch)
        children = [child for kids in grown for child in kids]
        if not children:  # the budget is spent: the frontier stays the pool of answers
            break
        finished += [child for child in children if child.terminal]
        if stop_on_win and any(node.won for node in finished):
            break
        frontier = [child for child in children if not child.terminal]
        if len(frontier) > width:
            scores = yield Score(frontier, scorer)
            # sorted is stable: on equal scores the earlier sample stays ahead
            order = sorted(range(len(frontier)), key=lambda i: -scores[i])
            frontier = [frontier[i] for i in order[:width]]
    if select and (finished or frontier):
        pool = answer_pool(finished, frontier)
        scores = yield Score(pool, select)
        tree.best = pool[max(range(len(pool)), key=lambda i: (scores[i], -i))]  # the first of equal scores
    else:
        tree.best = pick_answer(finished, frontier)
