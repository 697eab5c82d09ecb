"""``dfsdt``: depth-first search with backtracking, as ToolLLM's DFSDT (Qin et al. 2023, "ToolLLM")."""

from __future__ import annotations

from typing import Sequence

from omrl.search import Expand, Node, Score, SearchContext, Tree, run_search
from omrl.search.context import whole_number
from omrl_plugins.strategies.common import (
    check_samples,
    check_scorer,
    pick_answer,
)


def dfsdt(
    ctx: SearchContext, tasks: Sequence[int], branch: int = 2, scorer: str = "env_reward", max_expansions: int = 32
) -> list[Tree]:
    """Depth-first search with backtracking (ToolLLM's DFSDT): on a dead end, try the next candidate.

    A node is expanded into ``branch`` candidates and the best one (by ``scorer``) is
    followed; on a dead end (an episode that ended without winning) the search backs up
    to the nearest untried candidate.

    Stops at the first won episode, after ``max_expansions`` expansions or when the
    budget is spent; the answer is the won episode, else the best finished one.
    """
    whole_number("dfsdt", "branch", branch)
    whole_number("dfsdt", "max_expansions", max_expansions)
    check_samples(ctx, "dfsdt option branch", branch)
    check_scorer(ctx, scorer, "scorer")
    return run_search(ctx, tasks, _grow, branch=branch, scorer=scorer, max_expansions=max_expansions)


def _grow(tree: Tree, ctx: SearchContext, branch: int, scorer: str, max_expansions: int):
    stack: list[Node] = [tree.root]  # untried nodes; the top is the next to go down from
    expansions = 0
    while stack and expansions < max_expansions:
        node = stack.pop()
        if node.terminal:  # a dead end: backtrack to the next untried candidate
            continue
        (children,) = yield Expand([node], branch)
        expansions += 1
        if not children:  # the budget is spent
            break
        if len(children) > 1:
            scores = yield Score(children, scorer)
            # the best goes on top of the stack; on equal scores the earlier sample is tried first
            children = [children[i] for i in sorted(range(len(children)), key=lambda i: (scores[i], -i))]
        stack.extend(children)
        if any(child.won for child in children):  # a won candidate ends it wherever the scorer ranked it
            break
    ended = [node for node in tree.nodes if node.terminal and node.parent is not None]
    tree.best = pick_answer(ended, stack[::-1])  # unfinished: the node it would have tried next
