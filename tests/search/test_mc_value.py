"""``mc_value``: a spine chain plus k completions per spine turn, and the Math-Shepherd labels read back
from the written paths (:func:`omrl.rm.labels_mc.tree_mc_values`)."""

from __future__ import annotations

import doctest

import pytest

from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.errors import ConfigError, OmrlError
from omrl.rm import labels_mc
from omrl.rm.labels_mc import tree_mc_values
from omrl.rollout import EnvPool, PlaySpec, RolloutLimits, RolloutSession
from omrl.search import SearchContext, play_strategy, run_strategy
from omrl_plugins.strategies.common import first_leaf
from tests.fakes import ActionTemplate, ChestEnv, ScriptedBackend
from tests.helpers import cli_exit, invoke

K = 2
TURNS = 3  # env.max_turns: the tiny model's replies never parse, so every episode runs to it
GRIDWORLD = [
    "env.name=gridworld",
    "env.template=react",
    "model.name=tiny",
    "generation.max_new_tokens=8",
    f"env.max_turns={TURNS}",
    "generation.temperature=1.0",
]


@pytest.fixture(scope="module")
def session():
    """A gridworld session on the tiny model; ``session.calls`` records the prompts of each backend call."""
    cfg = command_line_config(RolloutRunConfig, [*GRIDWORLD, f"plugins.mc_value={{k: {K}}}"], {})
    with RolloutSession.from_config(cfg) as opened:
        generate, opened.calls = opened.backend.generate, []

        def counted(prompts, *args, **kwargs):
            opened.calls.append(len(prompts))
            return generate(prompts, *args, **kwargs)

        opened.backend.generate = counted
        yield opened


def play(session, budget=0):
    session.calls.clear()
    played = play_strategy(session, session.task_ids("train", 2), PlaySpec("train", strategy="mc_value", budget=budget))
    return played.trees, played.episodes


def spine(tree):
    """The nodes of the spine after the root: the first child all the way down."""
    return first_leaf(tree.root).path()[1:]


def below(node):
    """Every node of ``node``'s subtree, itself included."""
    out = [node]
    for child in node.children:
        out += below(child)
    return out


def direct_counts(tree):
    """(won, finished) leaves below each node, counted on the Tree itself."""
    counts = {}
    for node in tree.nodes[1:]:
        leaves = [n for n in below(node) if not n.children and n.terminal]
        counts[(tree.group, node.id)] = (sum(leaf.won for leaf in leaves), len(leaves))
    return counts


def test_each_spine_turn_gets_k_completions_played_to_the_end_in_batched_calls(session):
    trees, episodes = play(session)
    assert [tree.task_id for tree in trees] == session.task_ids("train", 2)
    for tree in trees:
        path = spine(tree)
        assert tree.best is path[-1] and tree.chosen() is path[-1]
        assert len(path) == TURNS and path[-1].end == "max_turns"
        for node in path[:-1]:
            assert len(node.children) == 1 + K and node.children[0] in path
            for start in node.children[1:]:  # a completion: one chain down to a finished leaf
                chain = below(start)
                assert all(len(n.children) <= 1 for n in chain)
                assert chain[-1].terminal and chain[-1].depth == TURNS
        assert not path[-1].children
        assert len(tree.leaves()) == 1 + K * (TURNS - 1) and not tree.exhausted
    assert len(episodes) == 2 * (1 + K * (TURNS - 1))
    # 3 spine turns (both trees in each call); all 2 x 2 open spine turns x K completions at once;
    # then the 4 completions from the first turn take their last turn together
    assert session.calls == [2, 2, 2, 2 * (TURNS - 1) * K, 2 * K]


def test_the_budget_cuts_completions_and_their_paths_label_nothing(session):
    trees, episodes = play(session, budget=48)  # the spine takes 3 x 8; 3 more replies fit
    for tree in trees:
        assert tree.exhausted and 0 < tree.generated_tokens <= 48
        assert tree.best.end == "max_turns"  # the spine came first and is whole
    assert {ep.end_reason for ep in episodes} == {"max_turns", "budget"}  # finished, or cut by the budget
    cut = [ep for ep in episodes if ep.end_reason == "budget"]
    values = tree_mc_values(episodes)
    for ep in cut:
        assert values[(ep.group, ep.turns[-1].node_id)] == (0, 0)
    for tree in trees:
        assert {key: value for key, value in values.items() if key[0] == tree.group} == direct_counts(tree)


def test_written_paths_carry_node_ids_and_give_each_node_its_leaves(session, tmp_path):
    trees, episodes = play(session)
    written = read_episodes(write_episodes(episodes, tmp_path / "mc.parquet"))
    assert all(turn.node_id > turn.parent_id >= 0 for ep in written for turn in ep.turns)
    values = tree_mc_values(written)
    expected = {}
    for tree in trees:
        expected.update(direct_counts(tree))
    assert values == expected
    for tree in trees:  # the spine: each turn has its own K completions and everything below it
        for depth, node in enumerate(spine(tree), start=1):
            assert values[(tree.group, node.id)] == (0, 1 + K * (TURNS - depth))


def test_omrl_rollout_writes_the_trees_and_marks_the_spine_as_the_answer(tmp_path):
    out = tmp_path / "mc.parquet"
    result = invoke(
        "rollout", *GRIDWORLD, "--num-tasks", "2", "--strategy", "mc_value", f"plugins.mc_value.k={K}", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert {ep.group for ep in episodes} == {0, 1} and len(episodes) == 2 * (1 + K * (TURNS - 1))
    values = tree_mc_values(episodes)
    for group in (0, 1):
        (answer,) = [ep for ep in episodes if ep.group == group and ep.turns[-1].info["search"].get("chosen")]
        assert [values[(group, turn.node_id)][1] for turn in answer.turns] == [
            1 + K * (TURNS - depth) for depth in range(1, TURNS + 1)
        ]
    assert "search: mc_value" in result.output


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def chest(tokenizer, options, temperature=1.0, reply=None, **settings):
    """mc_value over the scripted chest (open, then take the key; smashing loses); ``reply``: the script."""
    limits = RolloutLimits(max_new_tokens=12, max_context=1024, max_turns=4, temperature=temperature)
    backend = ScriptedBackend(tokenizer, reply) if reply else None
    return SearchContext(
        EnvPool(ChestEnv, name="chest"),
        ActionTemplate(),
        tokenizer,
        backend,
        limits,
        strategy="mc_value",
        plugin_options={"mc_value": options},
        **settings,
    )


def scripted_chest_reply(call, index, prompt):
    """Spine: look (nothing happens), open, take key (won). Completions from after `look`: open (then take
    key: won) and smash (lost); from after `open`: take key (won) and smash (lost)."""
    if call == 3:  # both trees' completions: per tree, 2 from after `look`, then 2 from after `open`
        return "Action: " + ["open", "smash", "take key", "smash"][index % 4]
    return "Action: " + {0: "look", 1: "open", 2: "take key", 4: "take key"}[call]


def test_wins_are_counted_per_spine_turn_on_a_scripted_chest(tokenizer, tmp_path):
    ctx = chest(tokenizer, {"k": 2}, reply=scripted_chest_reply)
    trees = run_strategy(ctx, [0, 1])
    assert ctx.backend.calls == [2, 2, 2, 8, 2]  # every tree's requests in one call per round
    episodes = read_episodes(write_episodes([ep for tree in trees for ep in tree.episodes()], tmp_path / "c.parquet"))
    values = tree_mc_values(episodes)
    for tree in trees:
        look, opened, key = spine(tree)
        assert [turn.action for turn in tree.chosen().episode.turns] == ["look", "open", "take key"]
        assert values[(tree.group, look.id)] == (3, 5)  # won: the spine, open+take key, take key below open
        assert values[(tree.group, opened.id)] == (2, 3)
        assert values[(tree.group, key.id)] == (1, 1)
        assert {k: v for k, v in values.items() if k[0] == tree.group} == direct_counts(tree)


def path(group, *nodes, won=False, end="done", task=7):
    """A hand-built root-to-leaf path through ``nodes`` (node ids; the root, 0, is the parent of the first)."""
    turns = [Turn("obs", "reply", "act", True, 0.0, False, node_id=n, parent_id=p) for p, n in zip((0, *nodes), nodes)]
    return Episode("toy", task, "train", "", turns=turns, won=won, end_reason=end, group=group)


def test_unfinished_leaves_are_no_labels_and_groups_are_trees_of_their_own():
    episodes = [
        path(0, 1, 2, won=True),
        path(0, 1, 3, end="max_turns"),
        path(0, 1, 4, end="pruned"),
        path(0, 5, end="budget"),
        path(1, 1, won=True, task=8),
        path(1, 2, end="budget", won=True, task=8),
    ]
    assert tree_mc_values(episodes) == {
        (0, 1): (1, 2),
        (0, 2): (1, 1),
        (0, 3): (0, 1),
        (0, 4): (0, 0),
        (0, 5): (0, 0),
        (1, 1): (1, 1),
        (1, 2): (0, 0),
    }


def test_chains_have_no_tree_and_give_no_labels():
    turn = Turn("obs", "reply", "act", True, 1.0, True)  # node_id and parent_id -1: no tree
    chains = [Episode("toy", 7, "train", "", turns=[turn], won=True), Episode("toy", 7, "train", "", sample=1)]
    assert tree_mc_values(chains) == {}
    assert tree_mc_values([]) == {}


def test_paths_of_two_trees_in_one_group_are_refused():
    with pytest.raises(OmrlError, match="group 0 disagree on node 2: parent 1 of task 7 and parent 5 of task 7"):
        tree_mc_values([path(0, 1, 2), path(0, 5, 2)])
    with pytest.raises(OmrlError, match="parent 0 of task 7 and parent 0 of task 9"):
        tree_mc_values([path(0, 1), path(0, 1, task=9)])


def test_the_docstring_example_holds():
    result = doctest.testmod(labels_mc)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("k", [0, "2", True, 1.5])
def test_a_bad_k_is_one_line_naming_it(tokenizer, k):
    with pytest.raises(ConfigError) as error:
        run_strategy(chest(tokenizer, {"k": k}, reply=scripted_chest_reply), [0])
    assert str(error.value) == f"mc_value option k={k!r} is invalid; valid: a whole number >= 1"


@pytest.mark.parametrize(
    "options, settings, message",
    [
        (
            {"k": 2},
            {"temperature": 0.0},
            r"mc_value option k=2 samples several replies per node, but decoding is greedy",
        ),
        ({}, {"group_size": 2}, "strategy 'mc_value' builds one tree per task"),
        ({"width": 2}, {}, r"strategy 'mc_value' does not take options \['width'\]; its options: k"),
    ],
)
def test_settings_mc_value_cannot_use_are_refused(tokenizer, options, settings, message):
    with pytest.raises(ConfigError, match=message):
        run_strategy(chest(tokenizer, options, reply=scripted_chest_reply, **settings), [0])


def test_greedy_decoding_is_fine_with_one_completion_and_the_expert_is_refused(tokenizer):
    (tree,) = run_strategy(chest(tokenizer, {"k": 1}, temperature=0.0, reply=scripted_chest_reply), [0])
    assert [len(node.children) for node in spine(tree)] == [2, 2, 0]
    with pytest.raises(OmrlError, match="strategy 'mc_value' needs a generation backend"):
        run_strategy(chest(tokenizer, {"k": 2}, expert=True), [0])


def test_a_bad_k_on_the_command_line_is_one_error_line(capsys, tmp_path):
    code, _, err = cli_exit(
        capsys,
        "rollout",
        *GRIDWORLD,
        "--num-tasks",
        "1",
        "--strategy",
        "mc_value",
        "plugins.mc_value.k=0",
        "-o",
        str(tmp_path / "x.parquet"),
    )
    assert code != 0
    assert "mc_value option k=0 is invalid; valid: a whole number >= 1" in " ".join(err.split())
    assert "Traceback" not in err and sum("error" in line.lower() for line in err.splitlines()) == 1, err
    assert not (tmp_path / "x.parquet").exists()
