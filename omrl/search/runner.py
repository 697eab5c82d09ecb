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
tokens, fit in what the backend keeps warm between calls (:meth:`~omrl.backends.base.Backend.warm_tokens`;
the rest wait for a search to end): past that, an hf backend would evict KV states it
needs next turn and prefill every context again (measured: 100 WebShop tasks of
best-of-4 did not finish in 50 minutes; 8 tasks took 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence

from omrl.backends.base import SamplingParams
from omrl.clock import timed
from omrl.envs import fork_support
from omrl.errors import OmrlError
from omrl.rollout.live import LiveEpisode, continue_chat, raised, record_reply, record_step
from omrl.search.branch import child_of, root_node
from omrl.search.context import SearchContext, check_expert
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


@dataclass
class _Search:
    """One task's search in progress: its tree, the chat options of its conversations, the strategy's
    generator over it and the request it waits on (None: none)."""

    tree: Tree
    chat_kwargs: dict
    gen: Generator[Request, Any, None] | None = None
    request: Request | None = None
    barren: bool = False  # its last Expand grew nothing


def run_search(
    ctx: SearchContext, tasks: Sequence[int], grow: Grow, *, forks: bool = True, **options: Any
) -> list[Tree]:
    """Grow one tree per task with ``grow(tree, ctx, **options)``; returns the trees in task order.

    ``forks=False`` is for strategies that only branch at the root (independent
    chains), which any env allows: every chain starts from its own ``reset``.
    """
    if ctx.backend is None:  # the scripted expert plays: no candidates can be sampled
        check_expert(ctx.strategy, ctx.budget)
        raise OmrlError(f"strategy {ctx.strategy!r} needs a generation backend (a model)")
    probe = ctx.pool.probe()
    method = check_forkable(ctx.pool, ctx.strategy) if forks else fork_support(probe)
    forker = Forker(ctx.pool, method)
    turn_cap = ctx.limits.max_turns or int(probe.max_turns)
    searches: list[_Search] = []  # in the order they started
    waiting = list(enumerate(tasks))
    warm = ctx.backend.warm_tokens()

    def start(batch: list[tuple[int, int]]) -> None:
        """Reset the envs of ``batch`` ((group, task) pairs) together and start their searches."""
        started = forker.start([task for _, task in batch])
        with forker.holding([state for _, state in started]) as envs:  # each root opens on its own env
            opened = [
                _root(ctx, probe if env is None else env, first, task, group)
                for (group, task), (first, _), env in zip(batch, started, envs)
            ]
        for (group, task), (_, state), (root, kwargs) in zip(batch, started, opened):
            root.env_state = None if root.terminal else state
            if root.terminal:
                forker.drop([state])
            search = _Search(Tree(int(task), group, root, strategy=ctx.strategy, budget=ctx.budget), kwargs)
            searches.append(search)
            if root.terminal:
                _finish(ctx, forker, search.tree)
            else:
                search.gen = grow(search.tree, ctx, **options)
                _advance(ctx, forker, search, None)

    try:
        while True:
            # Start searches while the next round's conversations fit in the KV states the backend
            # keeps between calls: past that, every turn would prefill its whole context again.
            if warm is None:
                start(waiting)
                waiting = []
            while waiting and (not _pending(searches) or _round_tokens(_pending(searches), ctx) < warm):
                start([waiting.pop(0)])
            pending = _pending(searches)
            if not pending:
                break
            answers: list[tuple[_Search, Any]] = []
            expands = [search for search in pending if isinstance(search.request, Expand)]
            if expands:
                answers += _expand(ctx, forker, expands, turn_cap, probe)
            scored = [search for search in pending if isinstance(search.request, Score)]
            for name in dict.fromkeys(search.request.scorer for search in scored):
                answers += _score(ctx, name, [search for search in scored if search.request.scorer == name])
            for search, answer in answers:
                if isinstance(search.request, Expand):
                    if not any(answer) and search.barren:  # nothing could grow twice in a row: it is over
                        search.gen.close()
                        search.request = None
                        _finish(ctx, forker, search.tree)
                        continue
                    search.barren = not any(answer)
                _advance(ctx, forker, search, answer)
    finally:
        forker.close()
    return [search.tree for search in sorted(searches, key=lambda search: search.tree.group)]


def _root(ctx: SearchContext, env: Any, first: Any, task: int, group: int) -> tuple[Node, dict]:
    """The root of ``task``'s tree, opened on ``env`` (the instance reset for it) as a chain opens its episode."""
    if isinstance(env, BaseException):  # its root state could not be read back: the reset's answer stands
        first = env
    return root_node(
        env,
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


def _pending(searches: list[_Search]) -> list[_Search]:
    """The searches waiting on an answer."""
    return [search for search in searches if search.request is not None]


def _round_tokens(pending: list[_Search], ctx: SearchContext) -> int:
    """Tokens of context the pending Expands' candidates may come to hold: each may grow to max_context."""
    return sum(
        search.request.k * ctx.limits.max_context
        for search in pending
        if isinstance(search.request, Expand)
        for node in search.request.nodes
        if not node.terminal
    )


def _advance(ctx: SearchContext, forker: Forker, search: _Search, answer: Any) -> None:
    """Send ``answer`` into the search's generator and keep its next request, or finish its tree."""
    try:
        req = search.gen.send(answer) if answer is not None else next(search.gen)
    except StopIteration:
        search.request = None
        _finish(ctx, forker, search.tree)
        return
    if not isinstance(req, (Expand, Score)):
        raise OmrlError(f"strategy {ctx.strategy!r} yielded a {type(req).__name__}; it must yield Expand or Score")
    if isinstance(req, Expand) and req.k < 1:
        raise OmrlError(f"strategy {ctx.strategy!r} asked for {req.k} candidates per node; valid: 1 or more")
    search.request = req


def _finish(ctx: SearchContext, forker: Forker, tree: Tree) -> None:
    forker.drop([node.env_state for node in tree.nodes if node.env_state is not None])
    if ctx.progress is not None:
        ctx.progress.finished(path_episode(tree.chosen(), tree, 0))


def _expand(
    ctx: SearchContext, forker: Forker, asked: list[_Search], turn_cap: int, probe: Any
) -> list[tuple[_Search, list[list[Node]]]]:
    """Answer every Expand with one backend call; each candidate becomes a child node. Returns each
    search with its answer: the children of each node it asked about."""
    limits = ctx.limits
    # (search, its place in ``asked``, index of the node in its request, node, token cap)
    slots: list[tuple[_Search, int, int, Node, int]] = []
    for place, search in enumerate(asked):
        left, reserved = search.tree.remaining(), 0
        for index, node in enumerate(search.request.nodes):
            cap = min(limits.max_new_tokens, limits.max_context - len(node.episode.current_row()))
            if node.terminal or cap < 1:
                continue
            for _ in range(search.request.k):
                if left is not None and reserved + cap > left:
                    search.tree.exhausted = True
                    break
                reserved += cap
                slots.append((search, place, index, node, cap))
    children = [(search, [[] for _ in search.request.nodes]) for search in asked]
    if not slots:
        return children
    params = SamplingParams(
        max_new_tokens=[cap for *_, cap in slots],
        temperature=limits.temperature,
        top_p=limits.top_p,
        seed=ctx.next_seed(),
    )
    # as in the chain rollout, a backend that fails stops the run: it is no branch's fault
    rows = [node.episode.current_row() for *_, node, _ in slots]
    with stage("generate", episode=f"{len(rows)} search branches"):
        replies = list(
            ctx.backend.generate(
                rows,
                params,  # type: ignore[union-attr]
                messages=[node.messages for *_, node, _ in slots],
            )
        )
    grown = [child_of(node) for *_, node, _ in slots]
    # each reply is read against its node's own env state, as the chain reads against its own env: a
    # template may accept a bare action only where the env admits it (gridworld's open moves)
    with forker.holding([node.env_state for *_, node, _ in slots]) as envs:
        for (search, *_), g, reply, env in zip(slots, grown, replies, envs):
            ctx.charge(search.tree, len(reply.token_ids))
            if isinstance(env, BaseException):  # the node's state cannot be reached: the branch ends here
                _unreachable(g, reply, ctx, probe, search.chat_kwargs, env)
            else:
                record_reply(g, reply, ctx.template, ctx.tokenizer, env, search.chat_kwargs)
    to_step = [(i, g) for i, g in enumerate(grown) if g.action is not None]
    with timed("env"):
        results = forker.step_many([(slots[i][3].env_state, slots[i][0].tree.task_id, g.action) for i, g in to_step])
    states: dict[int, Any] = {}
    for (i, g), (result, new_state) in zip(to_step, results):
        record_step(g, result)
        states[i] = new_state
    for i, ((search, place, index, node, _), g) in enumerate(zip(slots, grown)):
        # an unparsed reply leaves the env as it was: the child goes on from its parent's state
        state = states.get(i, node.env_state) if g.end is None else states.get(i)
        continue_chat(g, ctx.tokenizer, search.chat_kwargs, turn_cap, limits.max_context, limits.history)
        if g.end is not None:  # the branch ended here: nothing goes on from its env state
            g.record_end()
            if i in states and state is not None:
                forker.drop([state])
            state = None
        children[place][1][index].append(search.tree.add(node, _node(g, state)))
    return children


def _unreachable(g: LiveEpisode, reply: Any, ctx: SearchContext, probe: Any, chat_kwargs: dict, error: BaseException):
    """End ``g`` as env_error: the env could not be put in its parent's state to read ``reply`` against.
    The reply's ids stay on the episode (they were generated and charged); no action is read from it
    (``probe`` only lends the recording its action help), and nothing is stepped."""
    record_reply(g, reply, ctx.template, ctx.tokenizer, probe, chat_kwargs)
    g.action = g.tool_call = None
    if g.episode.turns:
        turn = g.episode.turns[-1]
        turn.action, turn.format_ok, turn.parse_error = None, False, None
    g.end, g.broken = "env_error", True
    g.episode.error = f"restoring the env's state failed: {raised(error)}"


def _node(g: LiveEpisode, state: Any) -> Node:
    return Node(-1, None, g.episode, g.messages, g.answering, env_state=state, end=g.end)


def _score(ctx: SearchContext, name: str, asked: list[_Search]) -> list[tuple[_Search, list[float]]]:
    """Answer every Score request for scorer ``name`` with one scorer call."""
    nodes = [node for search in asked for node in search.request.nodes]
    values = ctx.scorer(name)(nodes) if nodes else []
    out, at = [], 0
    for search in asked:
        mine = values[at : at + len(search.request.nodes)]
        for node, value in zip(search.request.nodes, mine):
            node.score = value
        out.append((search, mine))
        at += len(search.request.nodes)
    return out
