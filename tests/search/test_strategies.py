"""The built-in strategies and scorers on scripted replies, and a strategy registered by a plugin."""

from __future__ import annotations

import math

import pytest

from omrl import registry
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl.rollout import EnvPool, RolloutLimits
from omrl.search import Expand, Score, SearchContext, run_search, run_strategy
from tests.fakes import ActionTemplate, ChestEnv, ScriptedBackend, by_call

LIMITS = RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=4)


def search(tokenizer, backend, strategy, options=None, tasks=(0,), **settings):
    ctx = SearchContext(
        EnvPool(ChestEnv, name="chest"),
        ActionTemplate(),
        tokenizer,
        backend,
        LIMITS,
        strategy=strategy,
        plugin_options={strategy: options or {}},
        **settings,
    )
    return run_strategy(ctx, list(tasks))


def actions(node):
    return [turn.action for turn in node.episode.turns]


def test_best_of_n_picks_the_chain_its_selector_likes(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, by_call(["Action: smash", "Action: open"], ["Action: take key"]))
    (tree,) = search(tiny_tokenizer, backend, "best_of_n", {"n": 2})
    assert backend.calls == [2, 1]  # both chains in one call; then the one still going
    assert actions(tree.chosen()) == ["open", "take key"] and tree.chosen().won
    episodes = tree.episodes()
    assert [ep.won for ep in episodes] == [False, True]
    assert episodes[1].turns[-1].info["search"]["chosen"] is True
    assert "chosen" not in episodes[0].turns[-1].info["search"]


@pytest.mark.parametrize(
    "strategy, options, said",
    [
        ("best_of_n", {"n": 4}, "best_of_n option n=4"),
        ("beam", {"branch": 4}, "beam option branch=4"),
        ("mcts", {"branch": 4}, "mcts option branch=4"),
        ("dfsdt", {"branch": 4}, "dfsdt option branch=4"),
        ("mc_value", {"k": 4}, "mc_value option k=4"),
    ],
)
def test_a_search_warns_where_its_budget_holds_fewer_first_replies_than_it_asks(strategy, options, said,
                                                                                tiny_tokenizer):  # fmt: skip
    """A "best-of-4" row of a budget table was best-of-2, and nothing said so."""
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: open")
    with pytest.warns(UserWarning, match=f"{said} with a budget of 30 tokens: 4 first replies of up to 12"):
        search(tiny_tokenizer, backend, strategy, options, budget=30)


def test_the_command_line_says_a_short_budget_once_as_a_plain_warning(capsys, monkeypatch, tmp_path):
    """It came twice: the strategy's check on no tasks, before the search, warned as well."""
    import warnings

    from tests.helpers import cli_exit

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main prints warnings its own way
    monkeypatch.setenv("COLUMNS", "400")
    code, _, err = cli_exit(capsys, "rollout", "--env", "gridworld", "--model", "tiny", "--strategy", "beam",
                            "--budget", "10", "-o", str(tmp_path / "b.parquet"), "--num-tasks", "1",
                            "generation.max_new_tokens=8", "env.max_turns=2")  # fmt: skip
    assert code == 0, err
    assert err.count("warning: beam option branch=3 with a budget of 10 tokens") == 1, err  # no file:line: omrl's


def test_dfsdt_backtracks_from_dead_ends(tiny_tokenizer):
    # root: smash (a dead end, tried first on the tie) and open; below open: smash again, then take key
    backend = ScriptedBackend(
        tiny_tokenizer, by_call(["Action: smash", "Action: open"], ["Action: smash", "Action: take key"])
    )
    (tree,) = search(tiny_tokenizer, backend, "dfsdt", {"branch": 2})
    assert backend.calls == [2, 2]
    assert actions(tree.chosen()) == ["open", "take key"] and tree.chosen().won
    assert sorted(node.end for node in tree.nodes[1:] if node.terminal) == ["done", "done", "done"]


def test_dfsdt_stops_after_max_expansions(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: look")  # never ends
    (tree,) = search(tiny_tokenizer, backend, "dfsdt", {"branch": 2, "max_expansions": 3})
    assert backend.calls == [2, 2, 2] and len(tree.nodes) == 1 + 6
    assert tree.chosen().depth == 3  # the deepest open node it reached


def test_mcts_rolls_out_then_explores_the_untried_candidate(tiny_tokenizer):
    # iteration 1: expand the root (smash, open, open) and roll out from smash: 0.
    # iteration 2: UCT picks an untried candidate (open), expands it; its roll-out takes the key: 1.
    backend = ScriptedBackend(
        tiny_tokenizer, by_call(["Action: smash", "Action: open", "Action: open"], ["Action: take key"])
    )
    (tree,) = search(tiny_tokenizer, backend, "mcts", {"branch": 3, "iterations": 5})
    assert backend.calls == [3, 3]
    assert tree.root.visits == 2 and tree.root.value_sum == 1.0
    assert tree.chosen().won and actions(tree.chosen()) == ["open", "take key"]


def test_mcts_runs_its_iterations_and_values_with_a_scorer(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: look")
    (tree,) = search(
        tiny_tokenizer, backend, "mcts", {"branch": 2, "iterations": 3, "value": "scorer", "scorer": "logprob"}
    )
    assert len(backend.calls) == 3 and tree.root.visits == 6  # each of 2 children backs up once per iteration
    expected = math.exp(-0.5)  # every scripted token has log-prob -0.5
    assert all(node.score == pytest.approx(expected) for node in tree.nodes[1:])


def test_beam_stops_at_its_first_win_and_answers_with_it(tiny_tokenizer):
    backend = ScriptedBackend(
        tiny_tokenizer, by_call(["Action: open", "Action: smash"], ["Action: take key", "Action: look"])
    )
    (tree,) = search(tiny_tokenizer, backend, "beam", {"width": 1, "branch": 2})
    assert backend.calls == [2, 2]
    assert tree.chosen().won and actions(tree.chosen()) == ["open", "take key"]


def test_beam_can_pick_its_answer_by_a_scorer_without_looking_at_the_outcome(tiny_tokenizer, register_plugin):
    class LostFirst:
        @hookimpl
        def register_rollout_strategies(self, register):
            register("lost_first", lambda nodes, ctx: [0.0 if node.won else 1.0 for node in nodes], kind="scorer")

    register_plugin(LostFirst(), name="lost-first")
    script = by_call(["Action: open", "Action: smash"], ["Action: take key", "Action: look"])
    options = {"width": 1, "branch": 2, "stop_on_win": False}
    (tree,) = search(
        tiny_tokenizer, ScriptedBackend(tiny_tokenizer, script), "beam", {**options, "select": "lost_first"}
    )
    assert not tree.chosen().won and actions(tree.chosen()) == ["smash"]  # the scorer's choice, not the win
    assert any(node.won for node in tree.nodes)  # the search went on past its win
    (tree,) = search(
        tiny_tokenizer, ScriptedBackend(tiny_tokenizer, script), "beam", {**options, "select": "env_reward"}
    )
    assert tree.chosen().won
    # with both a scorer and a select set, the option is named: which of them is wrong
    with pytest.raises(Exception, match="strategy 'beam' option select='nope': unknown scorer 'nope'"):
        search(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, script), "beam", {**options, "select": "nope"})


def test_env_reward_scorer_sums_rewards_and_can_add_partial_credit(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, by_call(["Action: open"], ["Action: take key"]))
    (tree,) = search(tiny_tokenizer, backend, "best_of_n", {"n": 1})
    opened, won = tree.nodes[1], tree.nodes[2]
    ctx = SearchContext(
        EnvPool(ChestEnv),
        ActionTemplate(),
        tiny_tokenizer,
        backend,
        plugin_options={"env_reward": {"partial_credit": True}},
    )
    assert ctx.scorer("env_reward")([opened, won]) == [0.5, 2.0]  # returns 0 + score 0.5; returns 1 + score 1
    ctx.plugin_options = {}
    assert ctx.scorer("env_reward")([opened, won]) == [0.0, 1.0]
    ctx.plugin_options = {"env_reward": {"partial_credit": "no"}}  # text, not false: refused, never read as true
    with pytest.raises(ConfigError, match="scorer 'env_reward' option partial_credit='no' is invalid; valid: true or"):
        ctx.scorer("env_reward")([opened, won])


def test_self_eval_asks_the_model_and_charges_the_budget(tiny_tokenizer):
    backend = ScriptedBackend(
        tiny_tokenizer,
        by_call(["Action: open", "Action: smash", "Action: look"], ["yes", "no", "maybe"]),
        logprob=math.log(0.8),
    )
    ctx = SearchContext(
        EnvPool(ChestEnv, name="chest"), ActionTemplate(), tiny_tokenizer, backend, LIMITS, strategy="probe", budget=200
    )

    def grow(tree, ctx):
        (children,) = yield Expand([tree.root], 3)
        yield Score(children, "self_eval")

    (tree,) = run_search(ctx, [0], grow)
    assert [node.score for node in tree.nodes[1:]] == pytest.approx([0.8, 0.2, 0.5])
    replies = sum(node.episode.turns[-1].span[1] - node.episode.turns[-1].span[0] for node in tree.nodes[1:])
    assert tree.generated_tokens > replies  # the judge's answers were charged too
    assert backend.calls == [3, 3]


def test_a_strategy_registered_by_a_plugin_runs_by_name(register_plugin, tiny_tokenizer):
    def always_open(ctx, tasks, depth: int = 2):
        """Open the chest ``depth`` times (a third-party strategy)."""

        def grow(tree, ctx):
            node = tree.root
            for _ in range(depth):
                (children,) = yield Expand([node], 1)
                node = children[0]
            tree.best = node

        return run_search(ctx, tasks, grow)

    class ThirdParty:
        @hookimpl
        def register_rollout_strategies(self, register):
            register("always_open", always_open)
            register("constant", lambda nodes, ctx: [1.0] * len(nodes), kind="scorer")

    register_plugin(ThirdParty(), name="third-party-search")
    assert registry.strategies.component("always_open").plugin == "third-party-search"
    assert "constant" in registry.strategies.names("scorer")
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: look")
    (tree,) = search(tiny_tokenizer, backend, "always_open", {"depth": 3})
    assert tree.chosen().depth == 3 and tree.strategy == "always_open"
