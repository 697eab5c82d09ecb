"""``mcts``: Monte Carlo tree search with UCT (Kocsis & Szepesvari 2006) over sampled candidate replies."""

from __future__ import annotations

import math
from typing import Sequence

from omrl.errors import ConfigError
from omrl.search import Expand, Node, Score, SearchContext, Tree, run_search
from omrl.search.context import whole_number, yes_or_no
from omrl_plugins.strategies.common import (
    check_samples,
    check_scorer,
    pick_answer,
)

VALUES = ("rollout", "scorer")


def mcts(
    ctx: SearchContext,
    tasks: Sequence[int],
    iterations: int = 16,
    branch: int = 3,
    exploration: float = 1.0,
    value: str = "rollout",
    scorer: str = "env_reward",
    stop_on_win: bool = True,
) -> list[Tree]:
    """Monte Carlo tree search (UCT) over sampled replies, valued by roll-outs or a scorer.

    Select by ``Q + exploration * sqrt(ln N_parent / N)``, expand a leaf into ``branch``
    sampled replies, value it by a random roll-out to the episode's end (``value=rollout``:
    the env's return) or by ``scorer`` (``value=scorer``), and back the value up.
    ``iterations`` rounds per task, or until the budget is spent (or, with
    ``stop_on_win``, an episode is won).

    Roll-out turns stay in the tree (they are generated tokens and whole episodes); a
    roll-out node that selection reaches later is expanded like any other leaf.
    """
    whole_number("mcts", "iterations", iterations)
    whole_number("mcts", "branch", branch)
    yes_or_no("mcts", "stop_on_win", stop_on_win)
    if value not in VALUES:
        raise ConfigError(f"mcts option value={value!r} is invalid; valid: {', '.join(VALUES)}")
    if isinstance(exploration, bool) or not isinstance(exploration, (int, float)) or not exploration >= 0:
        raise ConfigError(f"mcts option exploration={exploration!r} is invalid; valid: a number >= 0")
    check_samples(ctx, "mcts option branch", branch)
    check_scorer(ctx, scorer, "scorer")
    return run_search(
        ctx,
        tasks,
        _grow,
        iterations=iterations,
        branch=branch,
        exploration=float(exploration),
        value=value,
        scorer=scorer,
        stop_on_win=stop_on_win,
    )


def uct(node: Node, exploration: float) -> float:
    """The UCT value of ``node`` (infinite while unvisited, so every candidate is tried once).

    >>> parent = Node(0, None, None, [], "", visits=4)
    >>> child = Node(1, parent, None, [], "", visits=1, value_sum=0.5)
    >>> round(uct(child, 1.0), 4)  # 0.5 + sqrt(ln 4 / 1)
    1.6774
    """
    if node.visits == 0:
        return math.inf
    parent_visits = node.parent.visits if node.parent is not None else node.visits
    return node.value_sum / node.visits + exploration * math.sqrt(math.log(max(parent_visits, 1)) / node.visits)


def backup(node: Node, value: float) -> None:
    """Add one visit with ``value`` to ``node`` and every ancestor."""
    for step in node.path():
        step.visits += 1
        step.value_sum += value


def _grow(
    tree: Tree,
    ctx: SearchContext,
    iterations: int,
    branch: int,
    exploration: float,
    value: str,
    scorer: str,
    stop_on_win: bool,
):
    expanded: set[int] = set()  # ids of nodes MCTS expanded (a roll-out's nodes are not, until selected)
    for _ in range(iterations):
        node = tree.root
        while node.id in expanded and not node.terminal and node.children:
            node = max(node.children, key=lambda child: uct(child, exploration))
        if node.terminal:
            backup(node, node.returns)
            continue
        (children,) = yield Expand([node], branch)
        if not children:  # the budget is spent
            break
        expanded.add(node.id)
        if value == "rollout":
            leaf = children[0]  # the candidates are independent samples: the first is a random one
            spent = False
            while not leaf.terminal and not spent:
                (more,) = yield Expand([leaf], 1)
                spent = not more
                leaf = more[0] if more else leaf
            backup(leaf, leaf.returns if leaf.terminal else 0.0)
            if spent:  # asking again would end the search before it picks its answer (below)
                break
        else:
            scores = yield Score(children, scorer)
            for child, score in zip(children, scores):
                backup(child, score)
        if stop_on_win and any(n.won for n in tree.nodes):
            break
    ended = [n for n in tree.nodes if n.terminal and n.parent is not None]
    visited = _most_visited_leaf(tree.root)
    tree.best = pick_answer(ended, [visited] if visited is not None else [])


def _most_visited_leaf(node: Node) -> Node | None:
    """Follow the most visited child from ``node`` down to a leaf (None when nothing was generated)."""
    if not node.children:
        return None
    while node.children:
        node = max(node.children, key=lambda child: (child.visits, -child.id))
    return node
