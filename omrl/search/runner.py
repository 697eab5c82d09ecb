"""Growing many trees at once: strategies ask, the runner batches.

A tree strategy is written as a generator over one tree, ``grow(tree, ctx, **options)``,
that yields requests and receives their answers:

    children = yield Expand(nodes, k)   # k candidate replies per node -> one list of children per node
    scores = yield Score(nodes, "logprob")  # one float per node, from a registered scorer

:func:`run_search` starts one generator per task and, each round, answers every
pending Expand of every tree with ONE backend call (all candidates of all nodes;
each candidate is then stepped in its own env copy) and every Score with one
scorer call. The per-tree token budget is enforced here: candidates that could
overrun it are not generated (the tree is marked ``exhausted``), and an Expand that
can grow nothing is answered with empty lists once (so the strategy can choose its
answer) and ends that tree's search the second time in a row, so no strategy can
loop forever.

Searches start as long as the next round's candidates, each counted at ``max_context``
tokens, fit in what the backend keeps warm between calls (:meth:`Backend.warm_tokens`;
the rest wait for a search to end): past that, an hf backend would evict KV states it
needs next turn and prefill every context again (measured: 100 WebShop tasks of
best-of-4 did not finish in 50 minutes; 8 tasks took 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence

from omrl.backends.base import SamplingParams
from omrl.envs import fork_support
from omrl.errors import OmrlError
from omrl.rollout.live import LiveEpisode, continue_chat, record_reply, record_step
from omrl.search.branch import child_of, root_node
from omrl.search.context import SearchContext
from omrl.search.fork import Forker, check_forkable
from omrl.search.tree import Node, Tree, path_episode
from omrl.supervisor import stage


@dataclass
class Expand:
    """Ask for ``k`` candidate replies of each node, each stepped in its own copy of the env."""

    nodes: list[Node]
    k: int = 1


@dataclass
class Score:
    """Ask the scorer ``scorer`` (a registered name) for one value per node; sets ``node.score``."""

    nodes: list[Node]
    scorer: str


Request = Expand | Score
Grow = Callable[..., Generator[Request, Any, None]]


def run_search(
    ctx: SearchContext, tasks: Sequence[int], grow: Grow, *, forks: bool = True, **options: Any
) -> list[Tree]:
    """Grow one tree per task with ``grow(tree, ctx, **options)``; returns the trees in task order.

    ``forks=False`` is for strategies that only branch at the root (independent
    chains), which any env allows: every chain starts from its own ``reset``.
    """
    if ctx.backend is None:
        raise OmrlError(
            f"strategy {ctx.strategy!r} needs a generation backend (a model); the scripted expert "
            "plays only the chain strategy"
        )
    probe = ctx.pool.probe()
    method = check_forkable(ctx.pool, ctx.strategy) if forks else fork_support(probe)
    forker = Forker(ctx.pool, method)
    turn_cap = ctx.limits.max_turns or int(probe.max_turns)
    trees: list[Tree | None] = [None] * len(tasks)
    chat_kwargs: dict[int, dict] = {}
    pending: dict[int, tuple[Tree, Generator, Request]] = {}
    barren: set[int] = set()  # trees whose last Expand grew nothing
    waiting = list(enumerate(tasks))
    warm = ctx.backend.warm_tokens()

    def start(batch: list[tuple[int, int]]) -> None:
        """Reset the envs of ``batch`` ((group, task) pairs) together and start their searches."""
        for (group, task), (first, state) in zip(batch, forker.start([task for _, task in batch])):
            root, kwargs = root_node(
                probe,
                first,
                ctx.template,
                ctx.tokenizer,
                env_name=ctx.pool.name,
                task_id=int(task),
                split=ctx.split,
                group=group,
                max_context=ctx.limits.max_context,
                options=ctx.limits.template_kwargs,
                demonstration=ctx.demonstration,
            )
            root.env_state = None if root.terminal else state
            if root.terminal:
                forker.drop([state])
            tree = trees[group] = Tree(int(task), group, root, strategy=ctx.strategy, budget=ctx.budget)
            chat_kwargs[id(tree)] = kwargs
            if root.terminal:
                _finish(ctx, forker, tree)
            else:
                _advance(ctx, forker, pending, tree, grow(tree, ctx, **options), None)

    try:
        while waiting or pending:
            # Start searches while the next round's conversations fit in the KV states the backend
            # keeps between calls: past that, every turn would prefill its whole context again.
            if warm is None:
                start(waiting)
                waiting = []
            while waiting and (not pending or _round_tokens(pending, ctx) < warm):
                start([waiting.pop(0)])
            answers: dict[int, Any] = {}
            expands = [(tree, req) for tree, _, req in pending.values() if isinstance(req, Expand)]
            if expands:
                answers.update(_expand(ctx, forker, expands, chat_kwargs, turn_cap, probe))
            for name in dict.fromkeys(req.scorer for _, _, req in pending.values() if isinstance(req, Score)):
                asked = [
                    (tree, req) for tree, _, req in pending.values() if isinstance(req, Score) and req.scorer == name
                ]
                answers.update(_score(ctx, name, asked))
            for key, answer in answers.items():
                tree, gen, req = pending.pop(key)
                if isinstance(req, Expand) and not any(answer):
                    if key in barren:  # nothing could grow twice in a row: this search is over
                        gen.close()
                        _finish(ctx, forker, tree)
                        continue
                    barren.add(key)
                elif isinstance(req, Expand):
                    barren.discard(key)
                _advance(ctx, forker, pending, tree, gen, answer)
    finally:
        forker.close()
    return [tree for tree in trees if tree is not None]


def _round_tokens(pending: dict, ctx: SearchContext) -> int:
    """Tokens of context the pending Expands' candidates may come to hold: each may grow to max_context."""
    return sum(
        req.k * ctx.limits.max_context
        for _, _, req in pending.values()
        if isinstance(req, Expand)
        for node in req.nodes
        if not node.terminal
    )


def _advance(ctx: SearchContext, forker: Forker, pending: dict, tree: Tree, gen: Generator, answer: Any) -> None:
    """Send ``answer`` into the tree's generator and file its next request, or finish the tree."""
    try:
        req = gen.send(answer) if answer is not None else next(gen)
    except StopIteration:
        _finish(ctx, forker, tree)
        return
    if not isinstance(req, (Expand, Score)):
        raise OmrlError(f"strategy {ctx.strategy!r} yielded a {type(req).__name__}; it must yield Expand or Score")
    if isinstance(req, Expand) and req.k < 1:
        raise OmrlError(f"strategy {ctx.strategy!r} asked for {req.k} candidates per node; valid: 1 or more")
    pending[id(tree)] = (tree, gen, req)


def _finish(ctx: SearchContext, forker: Forker, tree: Tree) -> None:
    forker.drop([node.env_state for node in tree.nodes if node.env_state is not None])
    if ctx.progress is not None:
        ctx.progress.finished(path_episode(tree.chosen(), tree, 0))


def _expand(
    ctx: SearchContext, forker: Forker, asked: list[tuple[Tree, Expand]], chat_kwargs: dict, turn_cap: int, probe: Any
) -> dict[int, list[list[Node]]]:
    """Answer every Expand with one backend call; each candidate becomes a child node."""
    limits = ctx.limits
    slots: list[tuple[Tree, int, Node, int]] = []  # (tree, index of the node in its request, node, token cap)
    for tree, req in asked:
        left, reserved = tree.remaining(), 0
        for index, node in enumerate(req.nodes):
            cap = min(limits.max_new_tokens, limits.max_context - len(node.episode.current_row()))
            if node.terminal or cap < 1:
                continue
            for _ in range(req.k):
                if left is not None and reserved + cap > left:
                    tree.exhausted = True
                    break
                reserved += cap
                slots.append((tree, index, node, cap))
    children: dict[int, list[list[Node]]] = {id(tree): [[] for _ in req.nodes] for tree, req in asked}
    if not slots:
        return children
    params = SamplingParams(
        max_new_tokens=[cap for *_, cap in slots],
        temperature=limits.temperature,
        top_p=limits.top_p,
        seed=ctx.next_seed(),
    )
    # as in the chain rollout, a backend that fails stops the run: it is no branch's fault
    rows = [node.episode.current_row() for _, _, node, _ in slots]
    with stage("generate", episode=f"{len(rows)} search branches"):
        replies = list(
            ctx.backend.generate(
                rows,
                params,  # type: ignore[union-attr]
                messages=[node.messages for _, _, node, _ in slots],
            )
        )
    for (tree, _, _, _), reply in zip(slots, replies):
        ctx.charge(tree, len(reply.token_ids))
    grown = [child_of(node) for _, _, node, _ in slots]
    for g, reply in zip(grown, replies):
        record_reply(g, reply, ctx.template, ctx.tokenizer, probe, chat_kwargs[id(tree)])
    to_step = [(i, g) for i, g in enumerate(grown) if g.action is not None]
    results = forker.step_many([(slots[i][2].env_state, slots[i][0].task_id, g.action) for i, g in to_step])
    states: dict[int, Any] = {}
    for (i, g), (result, new_state) in zip(to_step, results):
        record_step(g, result)
        states[i] = new_state
    for i, ((tree, index, node, _), g) in enumerate(zip(slots, grown)):
        # an unparsed reply leaves the env as it was: the child goes on from its parent's state
        state = states.get(i, node.env_state) if g.end is None else states.get(i)
        continue_chat(g, ctx.tokenizer, chat_kwargs[id(tree)], turn_cap, limits.max_context, limits.history)
        if g.end is not None:  # the branch ended here: nothing goes on from its env state
            g.record_end()
            if i in states and state is not None:
                forker.drop([state])
            state = None
        child = tree.add(node, _node(g, state))
        children[id(tree)][index].append(child)
    return children


def _node(g: LiveEpisode, state: Any) -> Node:
    return Node(-1, None, g.episode, g.messages, g.answering, env_state=state, end=g.end)


def _score(ctx: SearchContext, name: str, asked: list[tuple[Tree, Score]]) -> dict[int, list[float]]:
    """Answer every Score request for scorer ``name`` with one scorer call."""
    nodes = [node for _, req in asked for node in req.nodes]
    values = ctx.scorer(name)(nodes) if nodes else []
    out, at = {}, 0
    for tree, req in asked:
        out[id(tree)] = values[at : at + len(req.nodes)]
        for node, value in zip(req.nodes, out[id(tree)]):
            node.score = value
        at += len(req.nodes)
    return out
