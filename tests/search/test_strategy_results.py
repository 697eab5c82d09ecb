"""What a strategy returns is checked: one Tree per task, in the order given, or a PluginError that
names the strategy and its plugin (a tree too few once shrank an evaluation, silently)."""

from __future__ import annotations

import pytest

from omrl.errors import PluginError
from omrl.hookspecs import hookimpl
from omrl.rollout import EnvPool, RolloutLimits
from omrl.search import SearchContext, run_strategy
from omrl_plugins.strategies.chain import chain
from tests.fakes import ActionTemplate, ChestEnv, ScriptedBackend

LIMITS = RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=2)


def drop_last(ctx, tasks):
    """chain, less its last tree."""
    return chain(ctx, tasks)[:-1]


def reversed_trees(ctx, tasks):
    """chain's trees, in reverse order."""
    return chain(ctx, tasks)[::-1]


def nothing(ctx, tasks):
    """Forgets to return its trees."""
    chain(ctx, tasks)


def episodes_not_trees(ctx, tasks):
    """Returns each tree's episodes instead of the trees."""
    return [tree.episodes()[0] for tree in chain(ctx, tasks)]


class Strategies:
    @hookimpl
    def register_rollout_strategies(self, register):
        for fn in (drop_last, reversed_trees, nothing, episodes_not_trees, chain):
            register(f"s_{fn.__name__}", fn)


def play(tokenizer, strategy, tasks):
    backend = ScriptedBackend(tokenizer, lambda call, i, prompt: "Action: open")
    ctx = SearchContext(
        EnvPool(ChestEnv, name="chest"), ActionTemplate(), tokenizer, backend, LIMITS, strategy=strategy
    )
    return run_strategy(ctx, tasks)


@pytest.mark.parametrize(
    "strategy, problem",
    [
        ("s_drop_last", "returned 2 trees for 3 tasks"),
        ("s_nothing", "returned None"),
        ("s_episodes_not_trees", "returned Episode("),
        ("s_reversed_trees", "returned at position 0 the tree of task 2 (group 2) where task 0 (group 0) was expected"),
    ],
)
def test_a_strategy_that_returns_other_than_a_tree_per_task_is_named(
    tiny_tokenizer, register_plugin, strategy, problem
):
    register_plugin(Strategies(), name="odd-strategies")
    with pytest.raises(PluginError) as info:
        play(tiny_tokenizer, strategy, [0, 1, 2])
    message = str(info.value)
    assert message.startswith(f"strategy {strategy!r} (plugin 'odd-strategies', -) {problem}"), message
    assert "valid: a list of omrl.search.Tree, one per task in the order given" in message


def test_a_strategy_that_returns_a_tree_per_task_passes_them_on(tiny_tokenizer, register_plugin):
    register_plugin(Strategies(), name="odd-strategies")
    trees = play(tiny_tokenizer, "s_chain", [2, 0])
    assert [(tree.task_id, tree.group) for tree in trees] == [(2, 0), (0, 1)]
