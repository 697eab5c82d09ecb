"""Monte Carlo process labels from search trees, as Math-Shepherd (Wang et al. 2024) labels steps.

A turn's soft label is the share of the finished episodes through it that won: its node's
Monte Carlo value. The ``mc_value`` rollout strategy grows trees for this: a spine chain plus
``k`` completions from after each of its turns. Any tree strategy's paths can be labelled
the same way.

The paths are read back from a file (:func:`omrl.data.read_episodes`), one
:class:`~omrl.data.Episode` per root-to-leaf path. A tree is the paths of one
``Episode.group``, and paths that hold the same ``Turn.node_id`` share that node. So the
leaves below a node are the paths that pass through it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.search.tree import BUDGET, PRUNED

#: paths with no outcome, so they label nothing: the search stopped them before the env or a limit
#: did, or the env failed
UNFINISHED = (PRUNED, BUDGET, "env_error")


def tree_mc_values(episodes: Sequence[Episode]) -> dict[tuple[int, int], tuple[int, int]]:
    """``(group, node_id) -> (won leaves, finished leaves)`` below each tree node, the node included.

    Every node that some path holds is a key. A finished leaf is a path whose
    ``end_reason`` is not ``pruned``, ``budget`` or ``env_error``. A node with only unfinished leaves
    below it maps to ``(0, 0)``: it has no label. The soft label is
    ``won / finished`` where ``finished > 0``.

    Chains have no tree: turns with ``node_id == -1`` are skipped. So episodes played
    without a tree strategy give ``{}``, and the caller decides whether that is an error.
    Raises :class:`~omrl.errors.OmrlError` when two paths of one group disagree on a node's
    parent or task, because then they are not paths of one tree (e.g. two files whose
    groups collide).

    >>> from omrl.data import Turn
    >>> def path(*nodes, won=False, end="done"):
    ...     turns = [Turn("", "", "a", True, 0.0, False, node_id=n, parent_id=p)
    ...              for p, n in zip((0, *nodes), nodes)]
    ...     return Episode("env", 7, "train", "", turns=turns, won=won, end_reason=end)
    >>> tree_mc_values([path(1, 2, won=True), path(1, 3), path(1, 4, end="budget")])
    {(0, 1): (1, 2), (0, 2): (1, 1), (0, 3): (0, 1), (0, 4): (0, 0)}
    """
    counts: dict[tuple[int, int], tuple[int, int]] = {}
    seen: dict[tuple[int, int], tuple[int, int]] = {}  # (group, node) -> (parent, task): one tree per group
    for ep in episodes:
        finished = ep.end_reason not in UNFINISHED
        won = finished and bool(ep.won)
        for turn in ep.turns:
            if turn.node_id < 0:
                continue
            key = (ep.group, turn.node_id)
            where = (turn.parent_id, ep.task_id)
            if seen.setdefault(key, where) != where:
                raise OmrlError(
                    f"two paths of group {ep.group} disagree on node {turn.node_id}: parent "
                    f"{seen[key][0]} of task {seen[key][1]} and parent {where[0]} of task {where[1]}; "
                    "the paths of one group must come from one search tree (Tree.episodes)"
                )
            wins, total = counts.get(key, (0, 0))
            counts[key] = (wins + int(won), total + int(finished))
    return counts


def tree_mc_means(episodes: Sequence[Episode], score: bool = False) -> dict[tuple[int, int], float]:
    """``(group, node_id) -> value``: the mean value of a node's children, a finished leaf's value being
    1 when its path won and 0 otherwise (Math-Shepherd's share of successful completions from a step),
    or with ``score`` the env's final score of its path (for envs with partial credit, where wins are rare).

    Each sampled continuation weighs the same: a ``mc_value`` spine node's value is the
    mean of its k completions' outcomes and the spine's own next node's value, however
    many leaves that spine part has below it (counting leaves would let it dominate).
    Nodes with no finished leaf below them have no value (absent). Chains give ``{}``.

    >>> from omrl.data import Turn
    >>> def path(*nodes, won=False, end="done"):
    ...     turns = [Turn("", "", "a", True, 0.0, False, node_id=n, parent_id=p)
    ...              for p, n in zip((0, *nodes), nodes)]
    ...     return Episode("env", 7, "train", "", turns=turns, won=won, end_reason=end)
    >>> # node 1 -> 2 -> 3 (lost), 2 -> 5 (lost), 1 -> 4 (won): node 1 = mean(value 2 = 0, value 4 = 1)
    >>> tree_mc_means([path(1, 2, 3), path(1, 2, 5), path(1, 4, won=True)])[(0, 1)]
    0.5
    """
    children: dict[tuple[int, int], set[int]] = defaultdict(set)
    outcome: dict[tuple[int, int], float] = {}
    for ep in episodes:
        nodes = [turn for turn in ep.turns if turn.node_id >= 0]
        for turn in nodes:
            children[(ep.group, turn.parent_id)].add(turn.node_id)
        if nodes and ep.end_reason not in UNFINISHED:
            outcome[(ep.group, nodes[-1].node_id)] = float(ep.score) if score else float(bool(ep.won))
    values: dict[tuple[int, int], float | None] = {}

    def value(key: tuple[int, int]) -> float | None:
        if key not in values:
            below = [v for v in (value((key[0], child)) for child in sorted(children.get(key, ()))) if v is not None]
            values[key] = sum(below) / len(below) if below else outcome.get(key)
        return values[key]

    keys = {(ep.group, turn.node_id) for ep in episodes for turn in ep.turns if turn.node_id >= 0}
    return {key: v for key in sorted(keys) if (v := value(key)) is not None}
