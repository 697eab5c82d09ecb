"""``mc_value``: Monte Carlo process labels, as Math-Shepherd (Wang et al. 2024, "Math-Shepherd").

A process reward model learns how likely each step is to lead to success. Math-Shepherd
labels a step by completing the solution from it several times and counting the wins. Here
a step is a model turn. Each task gets one chain, the "spine", played to its end. Then
``k`` completions are sampled from the state after every spine turn that did not end the
episode, and each is played to its end. Every completion is a branch of the task's tree,
so the written paths carry node ids. :func:`omrl.rm.labels_mc.tree_mc_values` turns those
paths back into (wins, finished) counts per turn.
"""

from __future__ import annotations

from typing import Sequence

from omrl.search import Expand, Node, SearchContext, Tree, run_search
from omrl.search.context import whole_number
from omrl_plugins.strategies.common import check_samples


def mc_value(ctx: SearchContext, tasks: Sequence[int], k: int = 4) -> list[Tree]:
    """One spine chain per task, then ``k`` completions from after each of its turns that did not end.

    The completions of every spine turn of every task are sampled in one backend call,
    then grown one turn per call, all of them together, until each ends. The budget (if
    any) cuts the completions it cannot pay for: their paths end as ``budget`` and count
    toward no label. The answer (``tree.best``) is the spine's end: the completions are
    labelling data, not a search for a better answer.
    """
    whole_number("mc_value", "k", k)
    check_samples(ctx, "mc_value option k", k)
    return run_search(ctx, tasks, _grow, k=k)


def _grow(tree: Tree, ctx: SearchContext, k: int):
    spine = [tree.root]
    while not spine[-1].terminal:
        (children,) = yield Expand([spine[-1]], 1)
        if not children:  # the budget is spent before the spine ended: nothing is left for completions
            break
        spine.append(children[0])
    tree.best = spine[-1]  # set now: a search the runner ends for lack of budget keeps this answer
    if not spine[-1].terminal:
        return
    starts = [node for node in spine[1:] if not node.terminal]
    if not starts:
        return
    grown = yield Expand(starts, k)
    live = _open(grown)
    while live:
        grown = yield Expand(live, 1)
        live = _open(grown)


def _open(grown: list[list[Node]]) -> list[Node]:
    """The new children that have not ended: the completions still being played."""
    return [child for kids in grown for child in kids if not child.terminal]
