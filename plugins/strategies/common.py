"""What the built-in strategies share: their argument checks and how an answer is picked."""

from __future__ import annotations

import warnings
from typing import Sequence

from omrl.errors import ConfigError, UnknownNameError
from omrl.search import Node, SearchContext


def one_tree_per_task(ctx: SearchContext) -> None:
    """Tree strategies build one tree per task; several samples per task are ``chain``'s business."""
    if ctx.group_size != 1:
        raise ConfigError(
            f"strategy {ctx.strategy!r} builds one tree per task here, so samples per task must be 1 "
            f"(got {ctx.group_size}); valid: 1, or strategy chain for several samples (omrl train, which "
            "searches each task's group of trees, takes group_size as trees per task)"
        )


def needs_sampling(ctx: SearchContext, what: str, count: int) -> None:
    """Several candidates of one prompt differ only when sampled: greedy decoding would repeat one."""
    if count > 1 and ctx.limits.temperature <= 0:
        raise ConfigError(
            f"{what}={count} samples several replies per node, but decoding is greedy "
            "(generation.temperature=0), so they would all be the same; valid: "
            "generation.temperature>0 (e.g. 1.0), or 1"
        )


def check_samples(ctx: SearchContext, what: str, count: int) -> None:
    """The checks of a strategy that samples ``count`` replies per node (``what``: the option that says how
    many): one tree per task, sampling, and a warning where the budget cannot pay for them."""
    one_tree_per_task(ctx)
    needs_sampling(ctx, what, count)
    warn_short_budget(ctx, what, count, stacklevel=4)


def warn_short_budget(ctx: SearchContext, what: str, count: int, stacklevel: int = 3) -> None:
    """Warn where the token budget cannot pay for the ``count`` replies the search's first expansion asks
    for (``what``: the option that asks): a "best-of-4" or "beam of 3" row that searched less than it says."""
    if ctx.budget and ctx.budget < count * ctx.limits.max_new_tokens:
        warnings.warn(
            f"{what}={count} with a budget of {ctx.budget} tokens: {count} first replies of up to "
            f"{ctx.limits.max_new_tokens} tokens need {count * ctx.limits.max_new_tokens}, so a task may be searched "
            f"less than asked (search/paths_per_task says how much); raise --budget, or lower {what.split()[-1]}",
            stacklevel=stacklevel,  # the strategy's caller, in omrl: said as a plain warning
        )


def check_scorer(ctx: SearchContext, name: str, option: str = "") -> None:
    """An unknown scorer fails before any token is generated, naming the strategy's ``option`` that gave it
    (``select``, ``scorer``: with both set, which is wrong) and the valid ones."""
    try:
        ctx.scorer(name)
    except UnknownNameError as exc:
        raise UnknownNameError(f"strategy {ctx.strategy!r} option {option}={name!r}: {exc}") from exc


def outcome_key(node: Node) -> tuple:
    """How good a node is as an answer: won, then played to its end (a path the budget cut is no answer: its
    partial score would be the env's oracle), then the env's rewards, then done, then its score."""
    score = node.score if node.score is not None else 0.0
    return (node.won, node.end != "budget", node.returns, node.end == "done", score)


def answer_pool(*pools: Sequence[Node]) -> list[Node]:
    """The nodes of the first of ``pools`` that the env did not fail in, else the first pool not
    empty ([] when all are): an env_error answer is left out of success, so choosing it over a real
    loss would raise the success rate."""
    for pool in pools:
        kept = [node for node in pool if node.end != "env_error"]
        if kept:
            return kept
    return next((list(pool) for pool in pools if pool), [])


def pick_answer(*pools: Sequence[Node]) -> Node | None:
    """The best node of :func:`answer_pool` by :func:`outcome_key` (the first on ties), or None."""
    best = None
    for node in answer_pool(*pools):
        if best is None or outcome_key(node) > outcome_key(best):
            best = node
    return best


def first_leaf(node: Node) -> Node:
    """The leaf reached by always taking the first child (a chain's own end)."""
    while node.children:
        node = node.children[0]
    return node
