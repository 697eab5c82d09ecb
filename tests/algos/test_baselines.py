"""opo, reinforce_plus_plus_baseline, pass_at_k and remax against their papers' equations, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AdvantageInput, AlgoConfig
from omrl.data import Episode, Turn
from omrl.errors import ConfigError, OmrlError
from omrl.rollout.spec import Played, RolloutLimits
from omrl.training.greedy_baseline import greedy_scores
from omrl.training.rl_data import advantage_input
from omrl.training.tree_batch import chain_rows
from omrl_plugins.algos.advantages import grpo
from omrl_plugins.algos.baselines import opo, pass_at_k, reinforce_plus_plus_baseline, remax

EPS = AlgoConfig().eps

# token masks of T = 7: two turns with env tokens between and after them, one turn, one token, none
TWO_TURNS = [1, 1, 0, 0, 1, 1, 0]
ONE_TURN = [1, 1, 1, 0, 0, 0, 0]
ONE_TOKEN = [0, 0, 0, 0, 1, 0, 0]
NO_TOKENS = [0] * 7


def rows(*spec, greedy=None) -> AdvantageInput:
    """Rows ``(group, mask, token rewards)``; rewards given as {position: reward}."""
    rewards = torch.zeros(len(spec), 7)
    for i, (_, _, placed) in enumerate(spec):
        for position, reward in placed.items():
            rewards[i, position] = reward
    return AdvantageInput(
        token_rewards=rewards,
        loss_mask=torch.tensor([mask for _, mask, _ in spec]),
        group_ids=torch.tensor([group for group, _, _ in spec]),
        greedy_scores=None if greedy is None else torch.tensor(greedy),
    )


# Groups of 4, 3, 1 (a row alone) and 2 (one row without tokens); rewards spread over turns, and
# rewards on env tokens (positions 2, 3, 6) that no estimator may read.
MIXED = rows(
    (5, TWO_TURNS, {1: 0.5, 5: 0.5, 2: 9.0}),  # score 1.0, 4 tokens
    (5, ONE_TURN, {2: 0.25}),  # 0.25, 3 tokens
    (2, TWO_TURNS, {5: 2.0, 6: -4.0}),  # 2.0, 4 tokens
    (5, ONE_TOKEN, {4: 1.0}),  # 1.0, 1 token
    (9, TWO_TURNS, {5: 3.0}),  # 3.0, alone in group 9
    (2, ONE_TURN, {}),  # 0.0, 3 tokens
    (7, NO_TOKENS, {3: 5.0}),  # 0.0, no tokens
    (5, TWO_TURNS, {0: -0.5}),  # -0.5, 4 tokens
    (2, ONE_TOKEN, {4: 0.5}),  # 0.5, 1 token
    (7, ONE_TURN, {0: 1.0}),  # 1.0, 3 tokens
)


# -- the equations, with plain Python loops -----------------------------------------------------------


def scores_and_lengths(data: AdvantageInput) -> tuple[list[float], list[int]]:
    scores, lengths = [], []
    for rewards, mask in zip(data.token_rewards.tolist(), data.loss_mask.tolist()):
        scores.append(sum(r for r, m in zip(rewards, mask) if m))
        lengths.append(sum(mask))
    return scores, lengths


def members(data: AdvantageInput, i: int) -> list[int]:
    groups = data.group_ids.tolist()
    return [j for j in range(len(groups)) if groups[j] == groups[i]]


def on_mask(data: AdvantageInput, per_row: list[float]) -> torch.Tensor:
    mask = data.loss_mask.tolist()
    return torch.tensor([[per_row[i] if m else 0.0 for m in mask[i]] for i in range(len(mask))])


def opo_by_hand(data: AdvantageInput) -> torch.Tensor:
    scores, lengths = scores_and_lengths(data)
    per_row = []
    for i in range(len(scores)):
        group = members(data, i)
        if len(group) == 1:
            per_row.append(0.0)
            continue
        total_length = sum(lengths[j] for j in group)
        baseline = sum(lengths[j] * scores[j] for j in group) / total_length if total_length else 0.0
        per_row.append(scores[i] - baseline)
    return on_mask(data, per_row)


def reinforce_pp_baseline_by_hand(data: AdvantageInput) -> torch.Tensor:
    scores, _ = scores_and_lengths(data)
    centred = []
    for i in range(len(scores)):
        group = members(data, i)
        centred.append(scores[i] - sum(scores[j] for j in group) / len(group) if len(group) > 1 else None)
    tokens = [
        centred[i] for i, mask in enumerate(data.loss_mask.tolist()) for m in mask if m and centred[i] is not None
    ]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1))
    return on_mask(data, [0.0 if c is None else (c - mean) / (std + EPS) for c in centred])


def pass_at_k_by_hand(n: int, c: int, k: int) -> tuple[float, float]:
    """(A_pass, A_fail) of a group of n with c passes (Chen et al. 2025's analytical advantage)."""
    mean = 1 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(mean * (1 - mean))
    if sigma == 0:
        return 0.0, 0.0
    fail_alone = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1) if n - c >= 1 else 0.0
    return (1 - mean) / (sigma + EPS), (1 - mean - fail_alone) / (sigma + EPS)


# -- OPO ------------------------------------------------------------------------------------------------


def test_opo_length_weighted_baseline_worked_example():
    # one group: scores [1, 0, 1] on 4, 3 and 1 tokens -> b = (4*1 + 3*0 + 1*1) / 8 = 0.625
    #   -> A = [0.375, -0.625, 0.375]   (the plain mean 2/3 would give [1/3, -2/3, 1/3])
    data = rows((0, TWO_TURNS, {5: 1.0}), (0, ONE_TURN, {}), (0, ONE_TOKEN, {4: 1.0}))
    advantages, returns = opo(data, AlgoConfig())
    torch.testing.assert_close(advantages, on_mask(data, [0.375, -0.625, 0.375]))
    torch.testing.assert_close(returns, advantages)


def test_opo_against_the_equation_on_mixed_groups():
    # group 5: lengths [4, 3, 1, 4], scores [1, 0.25, 1, -0.5] -> b = (4 + 0.75 + 1 - 2) / 12 = 0.3125
    # group 2: lengths [4, 3, 1], scores [2, 0, 0.5] -> b = 8.5 / 8 = 1.0625; group 9 alone -> 0
    # group 7: the row without tokens weighs nothing: b = 1.0 -> [-1 (no token to carry it), 0]
    advantages, _ = opo(MIXED, AlgoConfig())
    expected = opo_by_hand(MIXED)
    torch.testing.assert_close(advantages, expected)
    assert advantages[0, 0].item() == pytest.approx(1.0 - 0.3125)
    assert advantages[2, 0].item() == pytest.approx(2.0 - 1.0625)
    assert advantages[4].eq(0).all() and advantages[9].eq(0).all()


def test_opo_group_without_any_token_gives_zero_not_nan():
    data = rows((0, NO_TOKENS, {0: 1.0}), (0, NO_TOKENS, {}), (1, ONE_TURN, {0: 1.0}), (1, ONE_TURN, {}))
    advantages, _ = opo(data, AlgoConfig())
    assert torch.isfinite(advantages).all() and advantages[:2].eq(0).all()
    torch.testing.assert_close(advantages, on_mask(data, [0.0, 0.0, 0.5, -0.5]))


# -- REINFORCE++ with baseline --------------------------------------------------------------------------


def test_reinforce_plus_plus_baseline_worked_example():
    # group 0: scores [1, 0] on 2 and 1 tokens -> centred [+0.5, -0.5]; group 1: one row (score 4): left out
    # whitening over the 3 grouped tokens [0.5, 0.5, -0.5]: mean 1/6, centred [1/3, 1/3, -2/3],
    #   unbiased var (1/9 + 1/9 + 4/9) / 2 = 1/3, std 0.57735 -> [0.57735, 0.57735, -1.15470]
    data = rows((0, [1, 0, 0, 0, 1, 0, 0], {4: 1.0}), (0, ONE_TOKEN, {}), (1, TWO_TURNS, {5: 4.0}))
    advantages, returns = reinforce_plus_plus_baseline(data, AlgoConfig())
    r = 1 / math.sqrt(3)
    expected = torch.zeros(3, 7)
    expected[0, 0] = expected[0, 4] = r
    expected[1, 4] = -2 * r
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_reinforce_plus_plus_baseline_against_the_equation_on_mixed_groups():
    advantages, _ = reinforce_plus_plus_baseline(MIXED, AlgoConfig())
    torch.testing.assert_close(advantages, reinforce_pp_baseline_by_hand(MIXED), atol=1e-5, rtol=1e-5)
    assert advantages[4].eq(0).all()  # alone in group 9


def test_reinforce_plus_plus_baseline_with_only_lone_rows_is_zero():
    data = rows((0, TWO_TURNS, {1: 1.0}), (1, ONE_TURN, {0: 2.0}))
    advantages, _ = reinforce_plus_plus_baseline(data, AlgoConfig())
    assert torch.equal(advantages, torch.zeros(2, 7))


# -- pass@k ---------------------------------------------------------------------------------------------


def test_pass_at_k_worked_example():
    # n = 4, c = 1, k = 2: Rbar = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, sigma = 0.5
    #   A_pass = 0.5 / 0.5 = 1;  A_fail = (0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3
    data = rows((0, TWO_TURNS, {5: 1.0}), (0, ONE_TURN, {}), (0, ONE_TOKEN, {}), (0, TWO_TURNS, {1: 0.5}))
    advantages, returns = pass_at_k(data, AlgoConfig(pass_k=2))
    torch.testing.assert_close(advantages, on_mask(data, [1.0, -1 / 3, -1 / 3, -1 / 3]), atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, advantages)


@pytest.mark.parametrize(
    "n, c, k",
    [(4, 1, 2), (4, 2, 2), (5, 2, 3), (6, 1, 4), (8, 3, 4), (8, 7, 3), (5, 1, 5), (2, 1, 2), (3, 3, 2), (3, 0, 2)],
)
def test_pass_at_k_against_math_comb(n, c, k):
    # passes score 0.7, fails 0.2, threshold 0.5; the passes sit last, on varying masks
    masks = [TWO_TURNS, ONE_TURN, ONE_TOKEN]
    placed = [(masks[i % 3], 0.7 if i >= n - c else 0.2) for i in range(n)]
    data = rows(*((0, mask, {mask.index(1): score}) for mask, score in placed))
    advantages, _ = pass_at_k(data, AlgoConfig(pass_k=k, pass_threshold=0.5))
    a_pass, a_fail = pass_at_k_by_hand(n, c, k)
    expected = on_mask(data, [a_pass if i >= n - c else a_fail for i in range(n)])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    if c in (0, n):  # sigma 0: every row passed, or none did
        assert advantages.eq(0).all()


def test_pass_at_k_groups_of_different_sizes_and_the_threshold_is_inclusive():
    # threshold 1.0: a score of exactly 1.0 passes. Group 0: n 3, c 1; group 1: n 4, c 2; group 2: n 2, c 0
    spec = [(0, 1.0), (1, 1.0), (0, 0.5), (1, 0.0), (2, 0.0), (1, 2.0), (0, 0.99), (2, 0.5), (1, 0.0)]
    data = rows(*((group, TWO_TURNS if i % 2 else ONE_TURN, {0: score}) for i, (group, score) in enumerate(spec)))
    advantages, _ = pass_at_k(data, AlgoConfig(pass_k=2))
    by_group = {0: pass_at_k_by_hand(3, 1, 2), 1: pass_at_k_by_hand(4, 2, 2), 2: pass_at_k_by_hand(2, 0, 2)}
    per_row = [by_group[group][0 if score >= 1.0 else 1] for group, score in spec]
    torch.testing.assert_close(advantages, on_mask(data, per_row), atol=1e-5, rtol=1e-5)


def test_pass_at_k_with_k_1_is_grpo_with_the_population_std():
    # k = 1: Rbar = c/n = p, sigma = sqrt(p (1 - p)) (the population std of the 0/1 outcomes),
    #   A_pass = (1 - p) / sigma, A_fail = (1 - p - 1) / sigma = -p / sigma: (outcome - p) / sigma.
    # grpo divides by the unbiased std sqrt(n / (n - 1)) * sigma instead, so pass_at_k = grpo * sqrt(n / (n - 1)).
    outcomes = {0: [1, 0, 0, 1, 0], 1: [1, 1, 1, 0], 2: [0, 1]}
    spec = [(group, o) for group, values in outcomes.items() for o in values]
    data = rows(*((group, TWO_TURNS, {5: float(o)}) for group, o in spec))
    advantages, _ = pass_at_k(data, AlgoConfig(pass_k=1))
    per_row, factor = [], []
    for group, o in spec:
        n, p = len(outcomes[group]), sum(outcomes[group]) / len(outcomes[group])
        per_row.append((o - p) / (math.sqrt(p * (1 - p)) + EPS))
        factor.append(math.sqrt(n / (n - 1)))
    torch.testing.assert_close(advantages, on_mask(data, per_row), atol=1e-5, rtol=1e-5)
    scaled = grpo(data, AlgoConfig())[0] * torch.tensor(factor)[:, None]
    torch.testing.assert_close(advantages, scaled, atol=1e-4, rtol=1e-4)


def test_pass_at_k_with_k_1_leaves_a_lone_row_at_zero():
    data = rows((0, TWO_TURNS, {5: 1.0}), (1, TWO_TURNS, {5: 1.0}), (1, ONE_TURN, {}))
    advantages, _ = pass_at_k(data, AlgoConfig(pass_k=1))
    assert advantages[0].eq(0).all() and advantages[1:].abs().sum() > 0


@pytest.mark.parametrize("k", [0, 4])
def test_pass_at_k_refuses_k_outside_1_to_the_largest_group(k):
    data = rows((0, TWO_TURNS, {5: 1.0}), (0, ONE_TURN, {}), (0, ONE_TURN, {}), (1, TWO_TURNS, {}), (1, ONE_TURN, {}))
    with pytest.raises(ConfigError, match=rf"pass_k .*pass_k is {k} and the largest group has 3 rows"):
        pass_at_k(data, AlgoConfig(pass_k=k))


def test_pass_at_k_gives_0_to_a_group_smaller_than_k_and_keeps_the_others():
    # group 1 lost a row (an env error drops untrainable rows before the estimator): one row, k = 2
    whole = rows((0, TWO_TURNS, {5: 1.0}), (0, ONE_TURN, {}))
    data = rows((0, TWO_TURNS, {5: 1.0}), (0, ONE_TURN, {}), (1, TWO_TURNS, {5: 1.0}))
    advantages, _ = pass_at_k(data, AlgoConfig(pass_k=2))
    assert advantages[2].eq(0).all()
    torch.testing.assert_close(advantages[:2], pass_at_k(whole, AlgoConfig(pass_k=2))[0])


# -- ReMax ----------------------------------------------------------------------------------------------


def test_remax_subtracts_the_greedy_score_even_for_a_lone_row():
    # scores [1, 0.25, 2, 1, 3, 0, 0, -0.5, 0.5, 1] minus the greedy episodes' scores
    greedy = [0.5, 0.5, 1.0, 0.0, 1.0, -1.0, 2.0, 0.0, 0.5, 3.0]
    data = AdvantageInput(MIXED.token_rewards, MIXED.loss_mask, MIXED.group_ids, greedy_scores=torch.tensor(greedy))
    advantages, returns = remax(data, AlgoConfig())
    scores, _ = scores_and_lengths(data)
    torch.testing.assert_close(advantages, on_mask(data, [s - g for s, g in zip(scores, greedy)]))
    assert advantages[4, 0].item() == pytest.approx(2.0)  # alone in group 9: 3 - 1
    torch.testing.assert_close(returns, advantages)


def test_remax_needs_greedy_scores_and_says_how_to_get_them():
    with pytest.raises(OmrlError, match=r"remax needs AdvantageInput.greedy_scores.*needs=\(\"greedy_scores\",\)"):
        remax(MIXED, AlgoConfig())


def two_turn_episode(sample: int) -> Episode:
    """Task 0's episode: two model turns of 2 tokens, env tokens between, the reward 1 on the last turn."""
    return Episode(
        env="gridworld",
        task_id=0,
        split="train",
        instruction="",
        token_ids=[7, 7, 1, 1, 7, 1, 1],
        loss_mask=[0, 0, 1, 1, 0, 1, 1],
        turns=[Turn("o", "a", "a", True, 0.0, False, span=(2, 4)), Turn("o", "b", "b", True, 1.0, True, span=(5, 7))],
        rewards={"total": [0.0, 1.0]},
        sample=sample,
    )


class GreedySession:
    """Plays the same episode greedily, as a session at temperature 0 would."""

    backend = None
    mixture = False
    limits = RolloutLimits()

    def play(self, tasks, spec):
        assert spec.limits.temperature == 0.0 and spec.group_size == 1
        return Played([two_turn_episode(0) for _ in tasks])


@pytest.mark.parametrize("allocation, gamma", [("last_token", 1.0), ("discounted", 0.9), ("per_turn", 1.0)])
def test_remax_gives_a_sample_identical_to_the_greedy_episode_advantage_0(allocation, gamma):
    # discounted: each turn's 2 tokens hold its discounted value, 1 and 0.81, so the row's score is 1.81;
    # a greedy baseline of the reward alone (1) would give the greedy episode's own copy advantage 0.81
    batch = chain_rows([two_turn_episode(0), two_turn_episode(1)], 0, allocation, gamma)
    baseline, metrics = greedy_scores(GreedySession(), batch, "train", 0, allocation=allocation, gamma=gamma)
    data = advantage_input(batch)
    data.greedy_scores = baseline
    advantages, _ = remax(data, AlgoConfig())
    assert advantages.eq(0).all()
    assert metrics["greedy_score_sum"] == 1.0  # the episode's reward, whatever the allocation


# -- every estimator: shapes, dtype, 0 off the mask -------------------------------------------------------

ESTIMATORS = [opo, reinforce_plus_plus_baseline, pass_at_k, remax]


def with_greedy(data: AdvantageInput) -> AdvantageInput:
    return AdvantageInput(
        data.token_rewards, data.loss_mask, data.group_ids, greedy_scores=torch.linspace(-1, 1, len(data.group_ids))
    )


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_float32_and_zero_off_the_mask(estimator):
    data = with_greedy(MIXED)
    data.group_ids = torch.tensor([5, 5, 2, 5, 2, 2, 7, 5, 2, 7])  # no row alone (pass_at_k k=1 would allow it)
    advantages, returns = estimator(data, AlgoConfig(pass_k=2, pass_threshold=0.5))
    off = data.loss_mask == 0
    assert advantages.dtype == returns.dtype == torch.float32 and advantages.shape == (10, 7)
    assert advantages[off].eq(0).all() and returns[off].eq(0).all()
    assert advantages[~off].abs().sum() > 0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_mismatched_shapes_name_the_tensor(estimator):
    data = AdvantageInput(
        torch.zeros(2, 3), torch.ones(2, 4), torch.zeros(2, dtype=torch.long), greedy_scores=torch.zeros(2)
    )
    with pytest.raises(OmrlError, match=rf"{estimator.__name__}: loss_mask has shape \(2, 4\)"):
        estimator(data, AlgoConfig(pass_k=1))
    data = AdvantageInput(
        torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3, dtype=torch.long), greedy_scores=torch.zeros(2)
    )
    with pytest.raises(OmrlError, match=rf"{estimator.__name__}: group_ids has shape \(3,\)"):
        estimator(data, AlgoConfig(pass_k=1))


def test_remax_greedy_scores_must_be_one_per_row():
    data = AdvantageInput(
        torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, dtype=torch.long), greedy_scores=torch.zeros(2, 1)
    )
    with pytest.raises(OmrlError, match=r"remax: greedy_scores has shape \(2, 1\); it must be \[bs\] = \(2,\)"):
        remax(data, AlgoConfig())


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_docstrings_name_the_paper_and_shapes(estimator):
    first = estimator.__doc__.splitlines()[0]
    assert "20" in first and "[bs, T]" in estimator.__doc__
    assert "arXiv:" in " ".join(estimator.__doc__.splitlines()[:3])
