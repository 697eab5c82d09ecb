"""Training on search trees: finished paths are rows, shared turns are trained once, tree_grpo credits
branch points; and ``omrl train`` with ``rollout.strategy`` on gridworld with the tiny model."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.algos import AlgoConfig
from omrl.data import Batch, Episode, Turn, read_episodes
from omrl.errors import ConfigError, OmrlError, UnknownNameError
from omrl.search.tree import Node, Tree, copy_episode
from omrl.training import rl as rl_module
from omrl.training.metrics import read_metrics
from omrl.training.rl import RLRecipe, run_rl
from omrl.training.rl_data import episodes_to_batch, micro_batches, preference_pairs, sort_by_length
from omrl.training.tree_batch import (
    chain_rows,
    finished_paths,
    paths_to_batch,
    sibling_pairs,
    train_each_turn_once,
    tree_advantage_input,
)
from omrl_plugins.algos.advantages import episode_scores, grpo
from omrl_plugins.algos.tree import branch_advantages, tree_grpo
from tests.training.helpers import SampleIndexReward, gridworld_configs, train_command

QUIET = Console(file=io.StringIO())
R = 1 / math.sqrt(3)  # 0.57735: the std of the scores [1, 0, 1]
S = math.sqrt(0.5)  # 0.70711: GRPO advantage of [1, 0]
OBSERVATION = 12  # the id each env answer takes in the hand-made trees


# -- hand-made trees -------------------------------------------------------------------------------


def new_tree(task: int = 0, group: int = 0) -> Tree:
    """A tree whose root is a two-token prompt."""
    ep = Episode(
        "toy",
        task,
        "train",
        "",
        token_ids=[10, 11],
        loss_mask=[0, 0],
        logprobs=[0.0, 0.0],
        prompt_length=2,
        group=group,
    )
    return Tree(task, group, Node(0, None, ep, [], ""))


def grow(tree: Tree, parent: Node, reply: list[int], end: str | None = None) -> Node:
    """A child of ``parent``: its reply's ids (trained), then the env's one-id answer unless it ended."""
    ep = copy_episode(parent.episode)
    start = len(ep.token_ids)
    ep.token_ids += reply
    ep.loss_mask += [1] * len(reply)
    ep.logprobs += [-0.5] * len(reply)
    ep.turns.append(Turn("obs", "reply", "act", True, 0.0, end is not None, span=(start, start + len(reply))))
    if end is None:
        ep.token_ids.append(OBSERVATION)
        ep.loss_mask.append(0)
        ep.logprobs.append(0.0)
    else:
        ep.end_reason = end
    return tree.add(parent, Node(-1, None, ep, [], "", end=end))


def scored(episodes: list[Episode], finals: dict[int, float]) -> list[Episode]:
    """Set each path's composed reward: ``finals[leaf node id]`` on its last turn, 0 before."""
    for ep in episodes:
        ep.rewards = {"total": [0.0] * (len(ep.turns) - 1) + [finals.get(ep.turns[-1].node_id, 0.0)]}
    return episodes


def forked_tree(group: int = 0, exhausted: bool = False) -> tuple[Tree, list[Episode]]:
    """root -> a -> {a1 (done, 1), a2 (done, 0)};  root -> b (done, 1);  root -> c (open: pruned, or
    budget when the tree ran out of tokens). Ids: a 1, a1 2, a2 3, b 4, c 5. Paths in leaf order:
    [a, a1], [a, a2], [b], [c]; a's two tokens [20, 21] are shared by the first two."""
    tree = new_tree(group=group)
    a = grow(tree, tree.root, [20, 21])
    grow(tree, a, [30, 31], end="done")
    grow(tree, a, [40, 41], end="done")
    grow(tree, tree.root, [50, 51], end="done")
    grow(tree, tree.root, [60, 61])
    tree.exhausted = exhausted
    return tree, scored(tree.episodes(), {2: 1.0, 3: 0.0, 4: 1.0})


def test_finished_paths_are_the_rows_and_unfinished_ones_are_no_leaves():
    _, episodes = forked_tree()
    assert [ep.end_reason for ep in episodes] == ["done", "done", "done", "pruned"]
    batch = paths_to_batch(episodes, trees_per_task=1, pad_token_id=0)
    assert len(batch) == 3  # the pruned path [c] has no outcome: no row
    # nodes numbered across the batch in the order met: a 0, a1 1, a2 2, b 3; a's parent is the root (-1)
    assert batch["turn_node_ids"].tolist() == [[0, 1], [0, 2], [3, -1]]
    assert batch["turn_parent_ids"].tolist() == [[-1, 0], [-1, 0], [-1, -1]]
    assert batch["group_ids"].tolist() == [0, 0, 0] and batch["tree_ids"].tolist() == [0, 0, 0]
    # GRPO over the 3 finished leaves [1, 0, 1]; counting [c] as a 0 would make it [1, 0, 1, 0]
    advantages, _ = grpo(tree_advantage_input(batch), AlgoConfig())
    assert advantages[batch["loss_mask"].bool()].unique().tolist() == pytest.approx([-2 * R, R], abs=1e-5)
    _, budget_cut = forked_tree(exhausted=True)
    assert budget_cut[-1].end_reason == "budget" and len(finished_paths(budget_cut)) == 3


def test_dpo_pairs_one_branch_point_each_its_best_reply_against_its_worst_sibling():
    # root -> a -> {a1: 1, a2: 0}; root -> b: 1; root -> c: pruned (scored 5, but it has no outcome)
    _, (a1, a2, b, c) = forked_tree()
    c.rewards = {"total": [5.0]}
    # root: b's path (1) against a's worst (a2, 0), not a1 (1 = b's 1); a: a1 against a2
    assert sibling_pairs([a1, a2, b, c]) == [(b, a2), (a1, a2)]
    # a branch point whose replies' paths all score alike gives no pair
    _, (a1, a2, b, _) = forked_tree()
    assert sibling_pairs(scored([a1, a2, b], {2: 1.0, 3: 1.0, 4: 1.0})) == []
    # trees pair only within themselves: a second tree (group 1) adds its own two pairs
    _, second = forked_tree(group=1)
    assert len(sibling_pairs([a1, a2, b, *second])) == 2


def test_chains_grown_as_a_tree_pair_as_the_chain_rollout_does():
    tree = new_tree()
    for reply, end in (([20], "done"), ([30], "done"), ([40], "done")):
        grow(tree, tree.root, reply, end=end)
    chains = scored(tree.episodes(), {1: 0.5, 2: 1.0, 3: 0.0})
    assert sibling_pairs(chains) == preference_pairs(chains) == [(chains[1], chains[2])]
    # ties break alike: by reward, then a won chosen and a lost rejected, then the last chosen, the first rejected
    for finals, won, pair in (
        ({1: 1.0, 2: 1.0, 3: 0.0}, (), (1, 2)),
        ({1: 1.0, 2: 1.0, 3: 0.0}, (0,), (0, 2)),
        ({1: 1.0, 2: 0.0, 3: 0.0}, (1,), (0, 2)),
        ({1: 1.0, 2: 0.0, 3: 0.0}, (), (0, 1)),
    ):
        chains = scored(tree.episodes(), finals)
        for i, ep in enumerate(chains):
            ep.score, ep.won = (1.0, True) if i in won else (0.0, False)
        assert sibling_pairs(chains) == preference_pairs(chains) == [(chains[pair[0]], chains[pair[1]])], finals


def test_a_tree_where_nothing_finished_gives_no_rows():
    tree = new_tree()
    grow(tree, grow(tree, tree.root, [20]), [30])
    batch = paths_to_batch(scored(tree.episodes(), {}), trees_per_task=1, pad_token_id=0)
    assert len(batch) == 0 and batch["turn_node_ids"].shape[0] == 0
    assert (
        len(train_each_turn_once(batch.union(Batch({"advantages": torch.zeros(0, 0), "returns": torch.zeros(0, 0)}))))
        == 0
    )


def test_shared_turns_are_trained_once_with_tree_grpo_by_hand():
    # Rows (longest first after sorting): [a, a1] 1, [a, a2] 0, [b] 1, each token layout
    #   [10, 11, 20, 21, 12, x, x] / [10, 11, y, y]: a at positions 2-3, a1/a2 at 5-6, b at 2-3.
    # tree_grpo per row (see tests/algos/test_tree_advantage.py for the same numbers):
    #   episode [+0.57735, -1.15470, +0.57735]; step at branch point a: a1 +0.70711, a2 -0.70711;
    #   a and b grew from the root -> 0.
    #   row 0: a +0.57735, a1 1.28446; row 1: a -1.15470, a2 -1.86181; row 2: b +0.57735.
    # Once per turn: a stays in row 0 only, with the mean of its copies (0.57735 - 1.15470) / 2 = -0.28868
    # (TreeRL's global advantage: V(a) = 0.5 against the root's 2/3, over the std); row 1 keeps a as context.
    _, episodes = forked_tree()
    batch = paths_to_batch(episodes, trees_per_task=1, pad_token_id=0)
    batch.tensors["advantages"], batch.tensors["returns"] = tree_grpo(tree_advantage_input(batch), AlgoConfig())
    path_tokens = int(batch["loss_mask"].sum())
    once = train_each_turn_once(batch)
    assert path_tokens == 4 + 4 + 2 and int(once["loss_mask"].sum()) == 2 + 2 + 2 + 2  # a, a1, a2, b
    assert once["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0]]
    a = (R - 2 * R) / 2
    expected = torch.tensor(
        [[0, 0, a, a, 0, R + S, R + S], [0, 0, 0, 0, 0, -2 * R - S, -2 * R - S], [0, 0, R, R, 0, 0, 0]]
    )
    torch.testing.assert_close(once["advantages"], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(once["returns"], expected, atol=1e-5, rtol=0)
    assert "turn_node_ids" not in once.tensors and once["input_ids"].equal(batch["input_ids"])


def test_each_token_of_a_shared_turn_averages_its_own_copies():
    # per-token values (as gae gives): a's two tokens in rows 0 and 1 hold (1, 2) and (3, 6)
    # -> row 0 keeps them with (1 + 3) / 2 = 2 and (2 + 6) / 2 = 4; returns alike
    _, episodes = forked_tree()
    batch = paths_to_batch(episodes, trees_per_task=1, pad_token_id=0)
    values = torch.zeros(3, 7)
    values[0, 2:4] = torch.tensor([1.0, 2.0])
    values[1, 2:4] = torch.tensor([3.0, 6.0])
    values[0, 5:7] = 7.0
    batch.tensors["advantages"], batch.tensors["returns"] = values, values * 10
    once = train_each_turn_once(batch)
    assert once["advantages"][0, 2:7].tolist() == [2.0, 4.0, 0.0, 7.0, 7.0]
    assert once["returns"][0, 2:4].tolist() == [20.0, 40.0] and once["advantages"][1].abs().sum() == 0


def test_several_trees_per_task_are_one_group_with_their_own_nodes():
    # two trees of task 0 (groups 0 and 1, trees_per_task=2): both number their nodes from 1, yet
    # are different nodes; their 6 finished leaves form one episode-level group
    _, first = forked_tree(group=0)
    _, second = forked_tree(group=1)
    batch = paths_to_batch(first + second, trees_per_task=2, pad_token_id=0)
    assert batch["group_ids"].tolist() == [0] * 6
    assert batch["turn_node_ids"].tolist() == [[0, 1], [0, 2], [3, -1], [4, 5], [4, 6], [7, -1]]
    assert batch["turn_parent_ids"].tolist() == [[-1, 0], [-1, 0], [-1, -1], [-1, 4], [-1, 4], [-1, -1]]
    assert batch["tree_ids"].tolist() == [0, 0, 0, 1, 1, 1]  # each path's own tree (Episode.group)


def test_tree_ids_reach_the_estimator_and_stay_with_their_rows():
    # Two trees of one task, leaves [1, 0, 1] each. intra_tree by hand: episode level over the 6 leaves:
    #   mean 2/3, unbiased var (4/9 + 8/9) / 5 = 4/15, std 0.51640 -> +0.64550 (score 1), -1.29099 (score 0);
    #   intra-tree (each tree [1, 0, 1]): +R, -2R. Row 0: 0.64550 + 0.57735 = 1.22285 on its tokens.
    _, first = forked_tree(group=0)
    _, second = forked_tree(group=1)
    batch = paths_to_batch(first + second, trees_per_task=2, pad_token_id=0)
    data = tree_advantage_input(batch)
    assert data.tree_ids is batch["tree_ids"] and data.tree_ids.dtype == torch.long
    advantages, _ = tree_grpo(data, AlgoConfig(tree_step_mode="intra_tree"))
    mask = batch["loss_mask"].bool()
    win, loss = 1 / math.sqrt(4 / 15) / 3 + R, -2 / math.sqrt(4 / 15) / 3 - 2 * R
    per_row = torch.tensor([win, loss, win, win, loss, win])
    torch.testing.assert_close(advantages, torch.where(mask, per_row[:, None], 0.0), atol=1e-5, rtol=0)
    # a [bs] column: sorting, micro-batches and train_each_turn_once keep it with its row
    batch.tensors["advantages"], batch.tensors["returns"] = advantages, advantages
    once = train_each_turn_once(batch)
    assert once["tree_ids"].equal(batch["tree_ids"]) and "turn_node_ids" not in once.tensors
    ordered = sort_by_length(once)
    parts = micro_batches(ordered, 4)
    assert torch.cat([part["tree_ids"] for part in parts]).equal(ordered["tree_ids"])
    # a chain rollout's rows have no tree
    assert tree_advantage_input(chain_rows(finished_paths(first), pad_token_id=0)).tree_ids is None


def test_paths_that_disagree_on_a_shared_turn_are_refused():
    _, episodes = forked_tree()
    episodes[1].turns[0].span = (3, 5)
    with pytest.raises(OmrlError, match="two paths of tree 0 .task 0. hold node 1 at different tokens"):
        paths_to_batch(episodes, trees_per_task=1, pad_token_id=0)


def test_a_chain_batch_has_no_tree_and_tree_grpo_is_grpo_on_it():
    # episodes of the chain rollout have node ids -1: the same rows as the chain path, no shared turn
    _, episodes = forked_tree()
    chains = [copy_episode(ep) for ep in finished_paths(episodes)]
    for sample, ep in enumerate(chains):
        ep.sample = sample
        for turn in ep.turns:
            turn.node_id = turn.parent_id = -1
    batch = paths_to_batch(chains, trees_per_task=1, pad_token_id=0)
    plain = episodes_to_batch(chains, pad_token_id=0)
    assert all(batch[key].equal(plain[key]) for key in plain.tensors)
    assert batch["turn_node_ids"].eq(-1).all()
    data = tree_advantage_input(batch)
    torch.testing.assert_close(tree_grpo(data, AlgoConfig())[0], grpo(data, AlgoConfig())[0])
    batch.tensors["advantages"], batch.tensors["returns"] = grpo(data, AlgoConfig())
    assert train_each_turn_once(batch)["loss_mask"].equal(batch["loss_mask"])  # nothing shared


# -- omrl train with rollout.strategy --------------------------------------------------------------


@pytest.fixture
def tree_config(tiny_model_dir, tmp_path, register_plugin):
    """``tree_config(*overrides)``: one step of beam on gridworld (2 turns) with the tiny model."""
    register_plugin(SampleIndexReward("leaf_index"), name="leaf-index")  # sibling leaves differ

    return gridworld_configs(
        tiny_model_dir,
        tmp_path,
        *("steps=1", "group_size=1", "reward.weights={leaf_index: 1.0}", "optim.micro_batch_size=4"),
        *("rollout.strategy=beam", "plugins.beam={width: 2, branch: 3}"),
    )


def test_beam_training_trains_each_tree_turn_once_with_step_level_credit(tree_config, monkeypatch):
    cfg = tree_config("algorithm.advantage=tree_grpo")
    seen: dict[str, list] = {"inputs": [], "masks": [], "advantages": []}
    real_loss = rl_module.policy_gradient_loss

    def loss_spy(out, mb, algo, *fns):
        seen["masks"].append(mb["loss_mask"].clone())
        seen["advantages"].append(mb["advantages"].clone())
        return real_loss(out, mb, algo, *fns)

    monkeypatch.setattr(rl_module, "policy_gradient_loss", loss_spy)
    recipe = RLRecipe(cfg, console=QUIET)
    try:
        recipe.setup()
        estimator = recipe.advantage_fn

        def estimator_spy(data, algo):
            seen["inputs"].append(data)
            return estimator(data, algo)

        recipe.advantage_fn = estimator_spy
        summary = recipe.train()
    finally:
        recipe.cleanup()
    assert summary["skipped_updates"] == 0

    # the rollout: beam trees as paths; width 2 of 3 candidates at turn 1, all 6 of their children end
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    finished = [ep for ep in paths if ep.end_reason not in ("pruned", "budget")]
    assert {ep.end_reason for ep in paths} >= {"pruned"} and len(finished) == 2 * 6
    # the estimator saw the finished paths whole, sharing turns, with step-level credit at branch points
    (data,) = seen["inputs"]
    assert len(data.group_ids) == len(finished)
    nodes = data.turn_node_ids[data.turn_node_ids >= 0]
    assert len(nodes.unique()) < len(nodes)  # turns shared by several rows
    step = branch_advantages(
        episode_scores(data.token_rewards, data.loss_mask.bool()), data.turn_node_ids, data.turn_parent_ids, True, 1e-6
    )
    assert step.abs().sum() > 0
    # the update trained every turn of the finished paths once: the tokens of the unique (tree, node) turns
    unique_turns = {
        (ep.group, turn.node_id): sum(ep.loss_mask[slice(*turn.span)]) for ep in finished for turn in ep.turns
    }
    path_tokens = sum(sum(ep.loss_mask) for ep in finished)
    trained = int(sum(mask.sum() for mask in seen["masks"]))
    assert trained == sum(unique_turns.values()) < path_tokens
    assert any(adv[mask.bool()].abs().sum() > 0 for adv, mask in zip(seen["advantages"], seen["masks"]))
    (record,) = read_metrics(cfg.logging.output_dir)
    assert record["trained_token_share"] == pytest.approx(trained / path_tokens)
    assert record["finished_paths"] == pytest.approx(len(finished) / len(paths))
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("dfsdt", ("plugins.dfsdt={branch: 2, max_expansions: 4}",)),
        ("mcts", ("plugins.mcts={iterations: 3, branch: 2}",)),
        ("best_of_n", ("plugins.best_of_n={n: 3}",)),
        ("chain", ("rollout.budget=64", "group_size=2")),  # chains grown by the search runner, one tree per task
    ],
)
def test_every_strategy_trains(tree_config, strategy, options):
    cfg = tree_config(f"rollout.strategy={strategy}", *options)
    summary = run_rl(cfg, console=QUIET)
    (record,) = read_metrics(cfg.logging.output_dir)
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert paths and all(turn.node_id > 0 for ep in paths for turn in ep.turns)  # tree paths
    assert summary["skipped_updates"] == 0 and math.isfinite(record["loss"]) and 0 < record["finished_paths"] <= 1
    # saved with what the estimator gave each finished path, token for token; a path no row was made of has none
    trained = finished_paths(paths)
    assert trained and all(len(ep.advantages) == len(ep.token_ids) == len(ep.returns) for ep in trained)
    assert all(not ep.advantages for ep in paths if ep not in trained)


def test_a_step_where_no_path_finished_logs_none_finished(tree_config):
    """Its curves had a gap exactly at the step that mattered: the keys were left out, not 0."""
    cfg = tree_config("rollout.strategy=chain", "rollout.budget=8", "group_size=2")  # each path cut after a reply
    run_rl(cfg, console=QUIET)
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert paths and not finished_paths(paths)
    (record,) = read_metrics(cfg.logging.output_dir)
    assert record["finished_paths"] == record["trained_token_share"] == 0.0 and record["skipped_updates"] == 1


def test_dpo_trains_on_the_sibling_pairs_of_beam_trees(tree_config):
    cfg = tree_config("algorithm.name=dpo")  # group_size 1: one tree per task, its branch points pair
    summary = run_rl(cfg, console=QUIET)
    (record,) = read_metrics(cfg.logging.output_dir)
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    # leaf_index rewards differ between siblings: each beam tree's branch points give its pairs
    assert len(paths) > 2 and record["dpo_pairs"] == len(sibling_pairs(paths)) > 0
    assert summary["skipped_updates"] == 0 and math.isfinite(record["loss"]) and record["grad_norm"] > 0


def test_dpo_on_trees_none_of_whose_paths_finished_says_the_search_cut_them(tree_config):
    """It said no replies led to different rewards, though the cut paths' rewards differed: they pair with none."""
    cfg = tree_config("algorithm.name=dpo", "rollout.budget=24")  # beam's first replies spend the budget
    console = Console(file=io.StringIO(), width=400)
    run_rl(cfg, console=console)
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert paths and not finished_paths(paths)
    said = " ".join(console.file.getvalue().split())
    assert (
        f"no preference pair: no branch point's finished replies led to different rewards ({len(paths)} of the" in said
    )
    assert "cut short by the search, and pair with none: raise rollout.budget" in said


def test_train_command_with_a_tree_strategy(tiny_model_dir, tmp_path, register_plugin):
    register_plugin(SampleIndexReward("leaf_index"), name="leaf-index")  # sibling leaves differ
    out = tmp_path / "cli-run"
    result = train_command(
        tiny_model_dir,
        out,
        *("rollout.strategy=beam", "algorithm.advantage=tree_grpo", "tasks_per_step=1"),
        "reward.weights={leaf_index: 1.0}",
    )
    assert result.exit_code == 0, result.output
    record = read_metrics(out)[0]
    assert record["step"] == 1 and record["trained_token_share"] < 1  # group_size 2: two beam trees per task


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (("rollout.strategy=bean",), UnknownNameError, "Did you mean 'beam'"),
        (("rollout.budget=4",), ConfigError, "budget 4 is smaller than one reply"),
    ],
)
def test_rollout_settings_that_cannot_train_are_refused_before_any_model_loads(tree_config, overrides, error, match):
    recipe = RLRecipe(tree_config(*overrides), console=QUIET)
    try:
        with pytest.raises(error, match=match):
            recipe.setup()
        assert not hasattr(recipe, "model")
    finally:
        recipe.cleanup()
