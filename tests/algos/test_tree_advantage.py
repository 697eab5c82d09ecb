"""tree_grpo: GRPO over a task's leaves plus a step level, by hand: the sibling-subtree comparison at
branch points (the default) or Tree-GRPO's intra-tree GRPO over one tree's leaves."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AdvantageInput, AlgoConfig
from omrl.errors import ConfigError, OmrlError
from omrl.registry import algorithms
from omrl_plugins.algos.advantages import grpo
from omrl_plugins.algos.tree import TREE_STEP_MODES, branch_advantages, tree_grpo

R = 1 / math.sqrt(3)  # 0.57735: the std of the scores [1, 0, 1] (see test_tree_grpo_three_leaves)
S = math.sqrt(0.5)  # 0.70711: GRPO advantage of [1, 0]

# token layout of a row with n turns: [prompt, turn 0, turn 0, obs, turn 1, turn 1, obs, turn 2, turn 2],
# the tokens past the row's last turn are padding
LAYOUT = [-1, 0, 0, -1, 1, 1, -1, 2, 2]


def paths(*rows, groups=None, trees=None) -> AdvantageInput:
    """Rows ``(score, [node ids], [parent ids])``, one per root-to-leaf path; the score lies on the
    row's last token. Node and parent lists are padded with -1 to K = 3 turns; ``trees`` the
    rows' tree ids (None: no tree_ids column)."""
    bs = len(rows)
    turn_index = torch.tensor([[k if 0 <= k < len(nodes) else -1 for k in LAYOUT] for _, nodes, _ in rows])
    mask = (turn_index >= 0).long()
    rewards = torch.zeros(bs, len(LAYOUT))
    for i, (score, nodes, _) in enumerate(rows):
        rewards[i, 3 * len(nodes) - 1] = score
    pad = lambda ids: list(ids) + [-1] * (3 - len(ids))  # noqa: E731
    return AdvantageInput(
        token_rewards=rewards,
        loss_mask=mask,
        group_ids=torch.zeros(bs, dtype=torch.long) if groups is None else torch.tensor(groups),
        turn_index=turn_index,
        turn_node_ids=torch.tensor([pad(nodes) for _, nodes, _ in rows]),
        turn_parent_ids=torch.tensor([pad(parents) for _, _, parents in rows]),
        tree_ids=None if trees is None else torch.tensor(trees),
    )


def on_tokens(*turns: float) -> list[float]:
    """Per-turn advantages on the token layout (0 on prompt, observations and padding)."""
    return [turns[k] if 0 <= k < len(turns) else 0.0 for k in LAYOUT]


# root -> n1, n2;  n1 -> n3, n4;  n3 -> n5.  Leaves: n5 (score 1), n4 (score 0), n2 (score 1).
THREE_LEAVES = ((1.0, [1, 3, 5], [-1, 1, 3]), (0.0, [1, 4], [-1, 1]), (1.0, [2], [-1]))


def test_tree_grpo_three_leaves():
    # Episode level (GRPO over the 3 leaves): scores [1, 0, 1], mean 2/3, deviations [1/3, -2/3, 1/3],
    #   unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3 -> std 0.57735 -> [+0.57735, -1.15470, +0.57735].
    # Step level: n1 and n2 grew from the root (the episode level's comparison) -> 0.
    #   Branch point n1: V(n3) = 1 (leaf n5), V(n4) = 0 -> mean 0.5, std 0.70711 -> n3 +0.70711, n4 -0.70711.
    #   n5 is n3's only child -> 0.
    # Tokens (weight 1): row 0: turn 0 0.57735, turn 1 0.57735 + 0.70711 = 1.28446, turn 2 0.57735
    #                    row 1: turn 0 -1.15470, turn 1 -1.15470 - 0.70711 = -1.86181;  row 2: 0.57735
    advantages, returns = tree_grpo(paths(*THREE_LEAVES), AlgoConfig())
    expected = torch.tensor([on_tokens(R, R + S, R), on_tokens(-2 * R, -2 * R - S), on_tokens(R)])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_tree_grpo_without_std_and_with_a_step_weight():
    # episode: [1/3, -2/3, 1/3]; step at n1: n3 1 - 0.5 = +0.5, n4 -0.5; weight 2 -> +-1
    advantages, _ = tree_grpo(paths(*THREE_LEAVES), AlgoConfig(norm_adv_by_std=False, tree_step_weight=2.0))
    expected = torch.tensor([on_tokens(1 / 3, 4 / 3, 1 / 3), on_tokens(-2 / 3, -5 / 3), on_tokens(1 / 3)])
    torch.testing.assert_close(advantages, expected)


def test_a_subtree_is_worth_the_mean_of_its_leaves_and_siblings_count_once():
    # root -> n1; n1 -> n3, n4; n3 -> n5 (1), n6 (1), n7 (0); n4 is a leaf (0). No std, weight 0.5.
    # Episode: scores [1, 1, 0, 0], mean 0.5 -> [+0.5, +0.5, -0.5, -0.5].
    # Branch n3: V = [1, 1, 0], mean 2/3 -> n5 +1/3, n6 +1/3, n7 -2/3.
    # Branch n1: V(n3) = mean of its 3 leaves = 2/3, V(n4) = 0; the mean over the two siblings is 1/3
    #   (not 1/2, the mean over the 4 rows) -> n3 +1/3, n4 -1/3.
    # Tokens: rows 0, 1: [0.5, 0.5 + 1/6, 0.5 + 1/6]; row 2: [-0.5, -0.5 + 1/6, -0.5 - 1/3];
    #         row 3: [-0.5, -0.5 - 1/6]
    data = paths(
        (1.0, [1, 3, 5], [-1, 1, 3]), (1.0, [1, 3, 6], [-1, 1, 3]), (0.0, [1, 3, 7], [-1, 1, 3]), (0.0, [1, 4], [-1, 1])
    )
    advantages, _ = tree_grpo(data, AlgoConfig(norm_adv_by_std=False, tree_step_weight=0.5))
    expected = torch.tensor(
        [
            on_tokens(0.5, 2 / 3, 2 / 3),
            on_tokens(0.5, 2 / 3, 2 / 3),
            on_tokens(-0.5, -1 / 3, -5 / 6),
            on_tokens(-0.5, -2 / 3),
        ]
    )
    torch.testing.assert_close(advantages, expected)


def test_branch_advantages_per_turn():
    # the step level alone for THREE_LEAVES, per turn: only n3 and n4 were compared
    data = paths(*THREE_LEAVES)
    step = branch_advantages(torch.tensor([1.0, 0.0, 1.0]), data.turn_node_ids, data.turn_parent_ids, True, 1e-6)
    torch.testing.assert_close(step, torch.tensor([[0.0, S, 0.0], [0.0, -S, 0.0], [0.0, 0.0, 0.0]]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", [True, False])
def test_chains_reduce_to_grpo(norm):
    # Chains branch only at the root: every node has one child, so no step group; two tasks of 3 and 2.
    data = paths(
        (1.0, [1, 2], [-1, 1]),
        (0.0, [3, 4, 5], [-1, 3, 4]),
        (0.5, [6], [-1]),
        (2.0, [7, 8], [-1, 7]),
        (0.0, [9], [-1]),
        groups=[0, 0, 0, 1, 1],
    )
    cfg = AlgoConfig(norm_adv_by_std=norm, tree_step_weight=3.0)
    torch.testing.assert_close(tree_grpo(data, cfg)[0], grpo(data, cfg)[0])
    # a chain rollout's rows carry no tree at all
    data.turn_node_ids = data.turn_parent_ids = None
    torch.testing.assert_close(tree_grpo(data, cfg)[0], grpo(data, cfg)[0])


def test_leaves_of_other_tasks_are_other_groups():
    # THREE_LEAVES as task 0, plus a task 1 of two leaves below one branch point m1 -> m2 (1), m3 (0)
    # Task 1: episode +-0.70711; step at m1: +-0.70711 (m1 itself grew from the root: 0).
    data = paths(*THREE_LEAVES, (1.0, [10, 11], [-1, 10]), (0.0, [10, 12], [-1, 10]), groups=[0, 0, 0, 1, 1])
    advantages, _ = tree_grpo(data, AlgoConfig())
    expected = torch.tensor(
        [
            on_tokens(R, R + S, R),
            on_tokens(-2 * R, -2 * R - S),
            on_tokens(R),
            on_tokens(S, 2 * S),
            on_tokens(-S, -2 * S),
        ]
    )
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_registered_with_shapes_and_zero_off_the_mask():
    component = algorithms.component("tree_grpo", "advantage")
    assert component.obj is tree_grpo and "[bs, K]" in tree_grpo.__doc__ and "2509.21240" in tree_grpo.__doc__
    data = paths(*THREE_LEAVES)
    advantages, returns = algorithms.get("tree_grpo", kind="advantage")(data, AlgoConfig())
    assert advantages.shape == returns.shape == data.loss_mask.shape and advantages.dtype == torch.float32
    assert torch.equal(advantages[data.loss_mask == 0], torch.zeros(int((data.loss_mask == 0).sum())))


def test_a_node_with_two_parents_is_refused():
    data = paths((1.0, [1, 3], [-1, 1]), (0.0, [2, 3], [-1, 2]))
    with pytest.raises(OmrlError, match="tree_grpo: node 3 has different parents in different rows"):
        tree_grpo(data, AlgoConfig())


def test_half_a_tree_and_a_negative_weight_are_refused():
    data = paths(*THREE_LEAVES)
    data.turn_parent_ids = None
    with pytest.raises(OmrlError, match="tree_grpo needs AdvantageInput.turn_parent_ids"):
        tree_grpo(data, AlgoConfig())
    with pytest.raises(ConfigError, match="algorithm.tree_step_weight must be >= 0.0, got -1.0"):
        tree_grpo(paths(*THREE_LEAVES), AlgoConfig(tree_step_weight=-1.0))


# -- step mode: siblings (default) or intra_tree (Tree-GRPO's Eq. 6) ------------------------------------


def grpo_by_hand(scores: list[float], keys: list, use_std: bool, eps: float = 1e-6) -> list[float]:
    """GRPO of each score within the rows of equal key, with plain loops (unbiased std; alone: 0)."""
    out = []
    for i, key in enumerate(keys):
        group = [scores[j] for j in range(len(keys)) if keys[j] == key]
        if len(group) == 1:
            out.append(0.0)
            continue
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        out.append((scores[i] - mean) / (std + eps) if use_std else scores[i] - mean)
    return out


# Two tasks x two trees of different shapes (tree ids 10, 11 for task 0; 12, 13 for task 1):
#   tree 10: THREE_LEAVES (root -> n1 -> {n3 -> n5 (1), n4 (0)}; root -> n2 (1))
#   tree 11: root -> m1 -> {m2 (0), m3 (1)}
#   tree 12: root -> c1 -> {c2 (2), c3 -> c4 (0)}; root -> c5 (1)
#   tree 13: one path root -> d1 -> d2 (0.5): a tree of one leaf, whose intra-tree advantage is 0
FOREST = (
    *THREE_LEAVES,
    (0.0, [20, 21], [-1, 20]),
    (1.0, [20, 22], [-1, 20]),
    (2.0, [30, 31], [-1, 30]),
    (0.0, [30, 32, 33], [-1, 30, 32]),
    (1.0, [34], [-1]),
    (0.5, [40, 41], [-1, 40]),
)
FOREST_GROUPS = [0, 0, 0, 0, 0, 1, 1, 1, 1]
FOREST_TREES = [10, 10, 10, 11, 11, 12, 12, 12, 13]


@pytest.mark.parametrize("norm, weight", [(True, 1.0), (False, 1.0), (True, 0.5), (False, 2.0)])
def test_intra_tree_is_grpo_over_each_trees_leaves_by_hand(norm, weight):
    # Task 0 by hand (std): episode over [1, 0, 1, 0, 1]: mean 0.6, unbiased var 1.2 / 4 = 0.3, std 0.54772
    #   -> [+0.73030, -1.09545, +0.73030, -1.09545, +0.73030]; intra tree 10: [R, -2R, R]; tree 11: [-S, +S].
    #   Row 0, weight 1: 0.73030 + 0.57735 = 1.30765 on each of its 3 turns.
    data = paths(*FOREST, groups=FOREST_GROUPS, trees=FOREST_TREES)
    advantages, returns = tree_grpo(
        data, AlgoConfig(tree_step_mode="intra_tree", norm_adv_by_std=norm, tree_step_weight=weight)
    )
    scores = [score for score, _, _ in FOREST]
    episode = grpo_by_hand(scores, FOREST_GROUPS, norm)
    intra = grpo_by_hand(scores, FOREST_TREES, norm)
    expected = []
    for (_, nodes, _), e, i in zip(FOREST, episode, intra):
        expected.append(on_tokens(*[e + weight * i] * len(nodes)))
    torch.testing.assert_close(advantages, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns, advantages)
    if norm and weight == 1.0:
        assert advantages[0, 1].item() == pytest.approx(0.73030 + R, abs=1e-4)
        assert intra[-1] == 0.0  # tree 13 has one leaf


def test_intra_tree_with_one_tree_per_task_doubles_grpo():
    # the tree is the task's whole group: intra-tree = inter-tree, so the sum is (1 + weight) x GRPO
    data = paths(*THREE_LEAVES, trees=[7, 7, 7])
    cfg = AlgoConfig(tree_step_mode="intra_tree", tree_step_weight=0.5)
    torch.testing.assert_close(tree_grpo(data, cfg)[0], 1.5 * grpo(data, cfg)[0])


def test_intra_tree_without_tree_ids_is_grpo():
    # a chain rollout's rows carry no tree_ids (and maybe no nodes either): exactly grpo, as siblings
    data = paths(*FOREST, groups=FOREST_GROUPS)
    cfg = AlgoConfig(tree_step_mode="intra_tree")
    assert torch.equal(tree_grpo(data, cfg)[0], grpo(data, cfg)[0])
    data.turn_node_ids = data.turn_parent_ids = None
    assert torch.equal(tree_grpo(data, cfg)[0], grpo(data, cfg)[0])


def test_siblings_is_the_default_and_ignores_tree_ids():
    assert AlgoConfig().tree_step_mode == "siblings" and TREE_STEP_MODES == ("siblings", "intra_tree")
    with_ids = paths(*FOREST, groups=FOREST_GROUPS, trees=FOREST_TREES)
    without = paths(*FOREST, groups=FOREST_GROUPS)
    default = tree_grpo(without, AlgoConfig())[0]
    assert torch.equal(tree_grpo(with_ids, AlgoConfig(tree_step_mode="siblings"))[0], default)
    assert torch.equal(tree_grpo(with_ids, AlgoConfig())[0], default)
    assert not torch.equal(tree_grpo(with_ids, AlgoConfig(tree_step_mode="intra_tree"))[0], default)


def test_an_unknown_step_mode_and_misshapen_tree_ids_are_refused():
    with pytest.raises(ConfigError, match="algorithm.tree_step_mode 'leaves' is unknown; valid: siblings, intra_tree"):
        tree_grpo(paths(*THREE_LEAVES), AlgoConfig(tree_step_mode="leaves"))
    data = paths(*THREE_LEAVES, trees=[[1], [1], [1]])
    with pytest.raises(OmrlError, match=r"tree_grpo: tree_ids has shape \(3, 1\); it must be \[bs\] = \(3,\)"):
        tree_grpo(data, AlgoConfig(tree_step_mode="intra_tree"))
