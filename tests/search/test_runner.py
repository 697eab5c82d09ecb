"""The search runner: token-exact branches, batched candidates, budgets, failing branches, bad input."""

from __future__ import annotations

import pytest

from omrl.backends.hf import HFBackend
from omrl.errors import ConfigError, UnknownNameError
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.search import SearchContext, run_strategy
from omrl.search.fork import ForkError
from tests.fakes import ActionTemplate, ChestEnv, PlainChestEnv, ScriptedBackend, by_call

LIMITS = RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=3)


def context(tokenizer, backend, strategy, env_class=ChestEnv, options=None, **settings):
    pool = EnvPool(env_class, name="chest")
    return SearchContext(
        pool,
        ActionTemplate(),
        tokenizer,
        backend,
        settings.pop("limits", LIMITS),
        strategy=strategy,
        plugin_options={strategy: options or {}},
        **settings,
    )


def chain_rollout(tokenizer, backend, task_ids, limits, **options):
    """The chain rollout (:func:`collect`) of ``task_ids`` of the chest env with the action template."""
    return collect(
        EnvPool(ChestEnv, name="chest"),
        ActionTemplate(),
        tokenizer,
        task_ids,
        backend=backend,
        limits=limits,
        **options,
    )


def same_episode(a, b):
    """Equal in every played number (node ids and search notes aside)."""
    assert a.token_ids == b.token_ids
    assert a.loss_mask == b.loss_mask
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # other batch shapes round otherwise on a GPU
    assert (a.won, a.score, a.end_reason, a.prompt_length) == (b.won, b.score, b.end_reason, b.prompt_length)
    assert [(t.response, t.action, t.reward, t.span) for t in a.turns] == [
        (t.response, t.action, t.reward, t.span) for t in b.turns
    ]
    assert a.messages == b.messages


def test_best_of_n_samples_exactly_what_the_chain_rollout_samples(tiny_hf):
    """N chains grown through the runner (env copies restored from the root) = collect's G samples, id for id."""
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=8)
    limits = RolloutLimits(max_new_tokens=6, max_context=1024, max_turns=3)
    chains = chain_rollout(tokenizer, backend, [0, 1], limits, group_size=2, seed=3)
    ctx = context(tokenizer, backend, "best_of_n", options={"n": 2}, limits=limits, seed=3)
    trees = run_strategy(ctx, [0, 1])
    searched = [ep for tree in trees for ep in tree.episodes()]
    assert len(searched) == 4
    for a, b in zip(searched, chains):
        same_episode(a, b)
        assert (a.group, a.sample) == (b.group, b.sample)
    assert sum(tree.generated_tokens for tree in trees) == sum(sum(ep.loss_mask) for ep in chains)


def test_chain_is_the_chain_rollout(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=8)
    limits = RolloutLimits(max_new_tokens=6, max_context=1024, max_turns=2)
    played = chain_rollout(tokenizer, backend, [2, 3], limits, group_size=2, seed=5)
    trees = run_strategy(context(tokenizer, backend, "chain", limits=limits, seed=5, group_size=2), [2, 3])
    for a, b in zip([ep for tree in trees for ep in tree.episodes()], played):
        same_episode(a, b)
    assert [tree.chosen().episode.sample for tree in trees] == [0, 0]  # pass@1: the first sample answers


BEAM_REPLIES = ("Action: open", "Action: smash", "no action here", "Action: take key")


def test_every_branch_of_a_beam_is_laid_out_exactly_as_a_chain(tiny_tokenizer):
    """Replay each root-to-leaf path's sampled ids through the chain rollout: the same ids, mask and log-probs."""
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: BEAM_REPLIES[(call + i) % 4])
    trees = run_strategy(
        context(tiny_tokenizer, backend, "beam", options={"width": 2, "branch": 3, "stop_on_win": False}), [0, 1]
    )
    paths = [ep for tree in trees for ep in tree.episodes()]
    assert len({ep.end_reason for ep in paths}) >= 3  # won, smashed, pruned, ...
    for ep in paths:
        replies = [ep.token_ids[t.span[0] : t.span[1]] for t in ep.turns]
        replay = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt, r=replies: r[call])
        limits = RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=len(replies))
        (chain,) = chain_rollout(tiny_tokenizer, replay, [ep.task_id], limits)
        assert chain.token_ids == ep.token_ids[: len(chain.token_ids)]
        if ep.end_reason != "pruned":  # a pruned path stops before the next prompt's increment
            assert chain.token_ids == ep.token_ids
        assert chain.loss_mask == ep.loss_mask[: len(chain.loss_mask)]
        assert [t.span for t in chain.turns] == [t.span for t in ep.turns]
        assert [(t.action, t.reward) for t in chain.turns] == [(t.action, t.reward) for t in ep.turns]


def test_siblings_share_their_parent_prefix_and_node_ids_link_them(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: BEAM_REPLIES[i % 2])  # open, smash
    (tree,) = run_strategy(context(tiny_tokenizer, backend, "beam", options={"width": 1, "branch": 2}), [0])
    paths = tree.episodes()
    nodes = {node.id: node for node in tree.nodes}
    for ep in paths:
        assert ep.turns[0].parent_id == 0
        for before, turn in zip(ep.turns, ep.turns[1:]):
            assert turn.parent_id == before.node_id
        for turn in ep.turns:
            parent = nodes[turn.parent_id]
            assert ep.token_ids[: len(parent.episode.token_ids)] == parent.episode.token_ids
    assert {node.parent.id for node in tree.nodes[1:3]} == {0}


def test_all_candidates_of_a_round_generate_in_one_backend_call(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: open")  # never ends an episode
    run_strategy(context(tiny_tokenizer, backend, "beam", options={"width": 2, "branch": 3}), [0, 1])
    assert backend.calls == [6, 12, 12]  # 2 tasks x (1 node, then 2 kept) x 3 candidates, for 3 turns


def test_the_budget_is_never_exceeded_and_every_token_is_counted(tiny_tokenizer):
    long_reply = "Action: open " + "and again " * 20  # cut at max_new_tokens, never parsed as a valid action
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: long_reply)
    budget = 3 * LIMITS.max_new_tokens + 5
    trees = run_strategy(
        context(tiny_tokenizer, backend, "beam", options={"width": 2, "branch": 2}, budget=budget), [0, 1]
    )
    for tree in trees:
        own = sum(node.episode.turns[-1].span[1] - node.episode.turns[-1].span[0] for node in tree.nodes[1:])
        assert tree.generated_tokens == own <= budget
        assert tree.exhausted and len(tree.nodes) == 1 + 3
    assert {ep.end_reason for tree in trees for ep in tree.episodes()} == {"budget"}


def test_a_branch_whose_env_raises_ends_alone(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, by_call(["Action: boom", "Action: open"], ["Action: take key"]))
    (tree,) = run_strategy(context(tiny_tokenizer, backend, "beam", options={"width": 2, "branch": 2}), [0])
    boom, opened = tree.root.children
    assert boom.end == "env_error" and "exploded" in boom.episode.error
    assert opened.children and all(child.won for child in opened.children)
    assert tree.chosen().won


def test_a_tree_strategy_refuses_an_env_that_cannot_fork(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: open")
    with pytest.raises(ForkError, match="strategy 'beam' branches episodes, but env 'chest'"):
        run_strategy(context(tiny_tokenizer, backend, "beam", env_class=PlainChestEnv), [0])
    # best-of-N only branches at the root, which a reset reaches
    (tree,) = run_strategy(
        context(tiny_tokenizer, backend, "best_of_n", env_class=PlainChestEnv, options={"n": 2}), [0]
    )
    assert len(tree.episodes()) == 2 and all(ep.end_reason == "max_turns" for ep in tree.episodes())


@pytest.mark.parametrize(
    "strategy, options, settings, message",
    [
        ("beam", {"branch": 0}, {}, "beam option branch=0 is invalid; valid: a whole number >= 1"),
        ("beam", {"width": "two"}, {}, "beam option width='two' is invalid"),
        ("best_of_n", {"n": 3}, {"limits": RolloutLimits(temperature=0.0)}, "greedy"),
        ("mcts", {"value": "oracle"}, {}, "mcts option value='oracle' is invalid; valid: rollout, scorer"),
        (
            "beam",
            {"depth": 3},
            {},
            r"strategy 'beam' does not take options \['depth'\]; its options: width, branch, scorer, stop_on_win",
        ),
        ("beam", {}, {"budget": 5}, "budget 5 is smaller than one reply (generation.max_new_tokens=12); valid: 0"),
        ("beam", {}, {"group_size": 2}, "one tree per task"),
        ("beam", {"stop_on_win": "maybe"}, {}, "beam option stop_on_win='maybe' is invalid; valid: true or false"),
        ("mcts", {"stop_on_win": "maybe"}, {}, "mcts option stop_on_win='maybe' is invalid; valid: true or false"),
        ("mcts", {"stop_on_win": 0}, {}, "mcts option stop_on_win=0 is invalid; valid: true or false"),
    ],
)
def test_bad_settings_are_one_line_errors(tiny_tokenizer, strategy, options, settings, message):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: open")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        run_strategy(context(tiny_tokenizer, backend, strategy, options=options, **settings), [0])
    assert "\n" not in str(info.value)
    assert backend.calls == []  # checked before any token is generated


def test_unknown_strategy_and_scorer_names_list_the_valid_ones(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: open")
    with pytest.raises(UnknownNameError, match="unknown rollout strategy 'bean'. Did you mean 'beam'?.*Valid: beam"):
        run_strategy(context(tiny_tokenizer, backend, "bean"), [0])
    with pytest.raises(
        UnknownNameError, match="unknown scorer 'oracle'.*Valid: env_reward, logprob, majority, random, rm, self_eval"
    ):
        run_strategy(context(tiny_tokenizer, backend, "beam", options={"scorer": "oracle"}), [0])


def test_searches_start_only_while_their_contexts_fit_in_what_the_backend_keeps_warm(tiny_tokenizer):
    """A backend that keeps few KV states gets the tasks in waves (no call beyond its room), and
    every task still gets its tree, in task order, played as without the bound."""

    def reply(call, index, prompt):  # by what the chat shows, so waves do not change the replies
        return "Action: take key" if "is open" in tiny_tokenizer.decode(prompt) else "Action: open"

    class Warm(ScriptedBackend):
        room = None

        def warm_tokens(self):
            return self.room

    trees = {}
    for room in (None, 2 * 2 * LIMITS.max_context):  # unbounded; two best-of-2 searches at a time
        backend = Warm(tiny_tokenizer, reply)
        backend.room = room
        played = run_strategy(context(tiny_tokenizer, backend, "best_of_n", options={"n": 2}), [0, 1, 2, 3])
        assert [tree.task_id for tree in played] == [0, 1, 2, 3]
        assert max(backend.calls) == (8 if room is None else 4), backend.calls
        trees[room] = [[(ep.token_ids, ep.won) for ep in tree.episodes()] for tree in played]
    assert trees[None] == trees[2 * 2 * LIMITS.max_context]
    assert all(won for tree in trees[None] for _, won in tree)


def test_an_hf_backend_keeps_as_many_tokens_warm_as_its_kv_cap_holds(tiny_hf):
    model, tokenizer = tiny_hf
    config = model.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    assert HFBackend(model, tokenizer, kv_cache_mb=3).warm_tokens() == 3 * 2**20 // per_token
    assert HFBackend(model, tokenizer, kv_cache_mb=0).warm_tokens() is None  # no bound
    assert HFBackend(model, tokenizer, kv_reuse=False).warm_tokens() is None  # nothing kept
