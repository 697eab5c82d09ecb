"""Each reply of a search is read against its own branch's env, as the chain rollout reads against its own env.

On gridworld the react template takes a bare move ("down", no ``Act:`` line) only where the env admits it
(its open moves), so a reply read against another instance (another task's, another branch's, an idle one)
is taken or refused by that instance's state.
"""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.search import SearchContext, run_strategy
from tests.fakes import ActionTemplate, LyingChestEnv, ScriptedBackend

TASKS = [1_000_000, 1_000_001, 1_000_002]
LIMITS = RolloutLimits(max_new_tokens=8, max_context=4096, max_turns=4)
BEAM = {"width": 2, "branch": 2, "stop_on_win": False}


def bare_open_moves(tokenizer):
    """Replies of one bare move, open where the prompt's last observation stands (which one: by call and row)."""

    def reply(call: int, index: int, prompt: list[int]) -> str:
        text = tokenizer.decode(prompt)
        blocked = text[text.rfind("blocked:") :].split(".")[0]
        moves = [move for move in ("down", "right", "up", "left") if move not in blocked]
        return moves[(call + index) % len(moves)]

    return reply


def search(tokenizer, pool, strategy, options):
    ctx = SearchContext(
        pool,
        registry.templates.get("react")(),
        tokenizer,
        ScriptedBackend(tokenizer, bare_open_moves(tokenizer)),
        LIMITS,
        split="test",
        strategy=strategy,
        plugin_options={strategy: options},
        demonstration=False,
    )
    return run_strategy(ctx, TASKS)


def played(trees):
    """Every node of every tree as (parent id, ids, actions): what a search grew, node for node."""
    return [
        (node.parent.id if node.parent else None, node.episode.token_ids, [t.action for t in node.episode.turns])
        for tree in trees
        for node in tree.nodes
    ]


def test_a_bare_move_is_read_against_its_branchs_env_as_the_chain_reads_it(tiny_tokenizer):
    env_class = registry.envs.get("gridworld")
    trees = search(tiny_tokenizer, EnvPool(env_class, name="gridworld"), "beam", BEAM)
    paths = [ep for tree in trees for ep in tree.episodes()]
    assert all(turn.action is not None for ep in paths for turn in ep.turns)  # each reply was an open move
    for ep in paths:  # the chain rollout, sampling the path's own replies, reads each as the search did
        replies = [ep.token_ids[t.span[0] : t.span[1]] for t in ep.turns]
        (chain,) = collect(
            EnvPool(env_class, name="gridworld"),
            registry.templates.get("react")(),
            tiny_tokenizer,
            [ep.task_id],
            backend=ScriptedBackend(tiny_tokenizer, lambda call, i, prompt, r=replies: r[call]),
            limits=RolloutLimits(max_new_tokens=8, max_context=4096, max_turns=len(replies)),
            split="test",
            demonstration=False,
        )
        assert [(t.action, t.format_ok, t.reward) for t in chain.turns] == [
            (t.action, t.format_ok, t.reward) for t in ep.turns
        ]
        assert chain.token_ids == ep.token_ids[: len(chain.token_ids)]


@pytest.mark.parametrize("before", [("beam", BEAM), ("mcts", {"iterations": 3, "branch": 2})])
def test_a_search_played_again_in_one_session_grows_the_same_trees(tiny_tokenizer, before):
    pool = EnvPool(registry.envs.get("gridworld"), name="gridworld")  # one session: every search shares it
    first = played(search(tiny_tokenizer, pool, "beam", BEAM))
    search(tiny_tokenizer, pool, *before)
    assert played(search(tiny_tokenizer, pool, "beam", BEAM)) == first


def test_a_branch_whose_parent_state_cannot_be_restored_ends_with_its_reply_unread(tiny_tokenizer):
    """A deterministic-declared env that replays otherwise: a node whose parked instance went on cannot be
    reached again, so its replies end as env_error, read against no env, their ids kept and counted."""
    replies = ["Action: open", "no action", "Action: smash"]
    ctx = SearchContext(
        EnvPool(LyingChestEnv, name="liar"),
        ActionTemplate(),
        tiny_tokenizer,
        ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: replies[(call + i) % 3]),
        RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=4),
        strategy="mcts",
        plugin_options={"mcts": {"iterations": 6, "branch": 2, "stop_on_win": False}},
    )
    (tree,) = run_strategy(ctx, [0])
    lost = [node for node in tree.nodes if "restoring the env's state failed" in (node.episode.error or "")]
    assert lost and all(node.end == "env_error" and "declared deterministic" in node.episode.error for node in lost)
    assert all((n.episode.turns[-1].action, n.episode.turns[-1].format_ok) == (None, False) for n in lost)
    assert tree.generated_tokens == sum(
        n.episode.turns[-1].span[1] - n.episode.turns[-1].span[0] for n in tree.nodes[1:]
    )
