"""Search trees as data: nodes are turns, root-to-leaf paths are ordinary Episodes.

The root holds the prompt alone (system prompt, worked example, task); every other
node is one model turn plus the env's answer to it. A node keeps the whole episode
up to itself, so any path is an :class:`~omrl.data.Episode` as a chain rollout would
have written it, token-exact, with each turn's ``node_id`` and ``parent_id`` set.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from omrl.data.trajectory import Episode

#: why a path stopped where the env did not end it
PRUNED = "pruned"  # the search chose not to go on from here
BUDGET = "budget"  # the token budget ran out before the search went on from here


@dataclass(eq=False)
class Node:
    """One state of a search: the episode so far and the env state it leaves behind.

    An open node's ``episode.token_ids`` end with the generation prompt of its next
    turn; a terminal node (``end`` set: done, max_turns, env_error, ...) is a finished
    episode. ``env_state`` is what the fork layer restores to step on from here (None
    once terminal).
    """

    id: int
    parent: Node | None
    episode: Episode
    messages: list[dict[str, str]]  # the chat so far, ending with the user message the next turn answers
    answering: str  # the text the next turn answers
    env_state: Any = None
    end: str | None = None
    children: list[Node] = field(default_factory=list)
    score: float | None = None  # the last score a scorer gave
    visits: int = 0  # MCTS statistics (any strategy may use them)
    value_sum: float = 0.0
    tree: Tree | None = field(default=None, repr=False)  # the tree it belongs to (budgets are per tree)

    @property
    def terminal(self) -> bool:
        return self.end is not None

    @property
    def depth(self) -> int:
        """Model turns from the root to here."""
        return len(self.episode.turns)

    @property
    def returns(self) -> float:
        """The env's rewards summed along the path."""
        return float(sum(turn.reward for turn in self.episode.turns))

    @property
    def won(self) -> bool:
        return bool(self.episode.won)

    def path(self) -> list[Node]:
        """The nodes from the root to this one."""
        nodes, node = [], self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


@dataclass(eq=False)
class Tree:
    """The search of one task: its nodes by id, the tokens spent, the node the search chose."""

    task_id: int
    group: int  # the task's index in the batch: Episode.group of every path
    root: Node
    strategy: str = ""
    budget: int = 0  # generated tokens this search may spend (0: no limit)
    generated_tokens: int = 0  # model tokens spent so far: replies and scorer prompts alike
    exhausted: bool = False  # a request was cut because the budget ran out
    best: Node | None = None  # the answer the strategy chose (None: the best leaf by outcome)
    nodes: list[Node] = field(default_factory=list)
    as_played: bool = False  # its leaves hold episodes a batched rollout played: episodes() gives them unchanged

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [self.root]
        self.root.tree = self

    def add(self, parent: Node, child: Node) -> Node:
        """Attach ``child`` (its id is set here) under ``parent``."""
        child.id, child.parent, child.tree = len(self.nodes), parent, self
        self.nodes.append(child)
        parent.children.append(child)
        return child

    def remaining(self) -> int | None:
        """Tokens the search may still generate (None: no limit)."""
        return None if not self.budget else max(0, self.budget - self.generated_tokens)

    def leaves(self) -> list[Node]:
        """Nodes without children, depth first with children in order (so a set of chains keeps its
        order); the root alone when nothing was generated."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children:
                out.append(node)
            stack.extend(reversed(node.children))
        return out

    def chosen(self) -> Node:
        """The strategy's answer, else the leaf with the best outcome (measured: the env did not fail
        in it, won, score, returns, then the deepest, then the first)."""
        if self.best is not None:
            return self.best
        return max(
            self.leaves(), key=lambda n: (n.end != "env_error", n.won, n.episode.score, n.returns, n.depth, -n.id)
        )

    def episodes(self) -> list[Episode]:
        """One Episode per root-to-leaf path, in leaf order (a tree that is its root alone, e.g. its
        reset failed, gives that turnless episode, as the chain rollout would).

        Open leaves end as ``pruned`` (or ``budget`` once the budget ran out); the
        chosen leaf's last turn carries ``info["search"]["chosen"] = True``. A tree ``as_played``
        gives its leaves' episodes themselves: the batched rollout's samples, no tree ids, no notes.
        """
        if self.as_played:
            return [leaf.episode for leaf in self.leaves()]
        chosen = self.chosen()
        return [path_episode(leaf, self, sample, leaf is chosen) for sample, leaf in enumerate(self.leaves())]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


def path_episode(leaf: Node, tree: Tree, sample: int, chosen: bool = False) -> Episode:
    """The episode of the path to ``leaf``: a copy, with node ids and search notes on its turns."""
    ep = copy_episode(leaf.episode)
    ep.group, ep.sample = tree.group, sample
    if not leaf.terminal:
        ep.end_reason = BUDGET if tree.exhausted else PRUNED
        ep.messages = [dict(m) for m in leaf.messages]
    for turn, node in zip(ep.turns, leaf.path()[1:]):
        turn.node_id, turn.parent_id = node.id, node.parent.id  # type: ignore[union-attr]
        turn.info["search"] = {"strategy": tree.strategy, "score": node.score}
    if chosen and ep.turns:
        ep.turns[-1].info["search"]["chosen"] = True
    return ep


def copy_episode(ep: Episode) -> Episode:
    """A copy of ``ep`` that shares nothing mutable with it (token lists, turns, their info)."""
    return replace(
        ep,
        turns=[replace(t, info=copy.deepcopy(t.info)) for t in ep.turns],
        token_ids=list(ep.token_ids),
        loss_mask=list(ep.loss_mask),
        logprobs=list(ep.logprobs),
        row_starts=list(ep.row_starts),
        rewards={k: list(v) for k, v in ep.rewards.items()},
        messages=[dict(m) for m in ep.messages],
        advantages=list(ep.advantages),
        returns=list(ep.returns),
        values=list(ep.values),
    )


def chain_tree(episodes: list[Episode], task_id: int, group: int, strategy: str = "", as_played: bool = False) -> Tree:
    """The tree of independent chains of one task (what ``collect`` played): G paths below one root.

    Each interior node holds its episode's ids up to the next turn's generation
    prompt, so a path's leaf is the played episode itself, unchanged. The root holds
    the first chain's prompt. ``as_played``: :meth:`Tree.episodes` gives the played
    episodes as they are (see :attr:`Tree.as_played`).
    """
    first = episodes[0]
    root = Node(0, None, _prefix(first, 0), [], first.instruction)
    tree = Tree(task_id, group, root, strategy=strategy, as_played=as_played)
    for ep in episodes:
        node = root
        for i in range(len(ep.turns)):
            last = i == len(ep.turns) - 1
            child = Node(-1, None, ep if last else _prefix(ep, i + 1), [], "", end=ep.end_reason if last else None)
            node = tree.add(node, child)
        if not ep.turns:  # ended before its first turn (reset failed, prompt too long)
            tree.add(root, Node(-1, None, ep, [], "", end=ep.end_reason))
    return tree


def _prefix(ep: Episode, turns: int) -> Episode:
    """``ep`` up to the generation prompt of turn ``turns`` (0: the prompt alone)."""
    end = ep.turns[turns].span[0] if turns < len(ep.turns) else len(ep.token_ids)
    score = float(ep.turns[turns - 1].info.get("score", 0.0)) if turns else 0.0
    return replace(
        ep,
        turns=list(ep.turns[:turns]),
        token_ids=ep.token_ids[:end],
        loss_mask=ep.loss_mask[:end],
        logprobs=ep.logprobs[:end],
        row_starts=[s for s in ep.row_starts if s < end],
        messages=[],
        rewards={},
        end_reason="",
        won=False,
        score=score,
        advantages=[],
        returns=[],
        values=[],
    )
