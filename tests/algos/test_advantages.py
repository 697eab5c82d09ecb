"""Advantage estimators against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AdvantageInput, AlgoConfig
from omrl.errors import ConfigError, OmrlError
from omrl_plugins.algos.advantages import dr_grpo, gae, grpo, reinforce_plus_plus, rloo

SQRT_HALF = math.sqrt(0.5)  # 0.70711


def rows(*token_rewards, mask=None, groups=None, values=None) -> AdvantageInput:
    rewards = torch.tensor(token_rewards, dtype=torch.float32)
    return AdvantageInput(
        token_rewards=rewards,
        loss_mask=torch.ones_like(rewards, dtype=torch.long) if mask is None else torch.tensor(mask),
        group_ids=torch.arange(len(rewards)) if groups is None else torch.tensor(groups),
        values=None if values is None else torch.tensor(values, dtype=torch.float32),
    )


# -- GRPO / Dr. GRPO / RLOO ---------------------------------------------------


def test_grpo_two_groups_of_two():
    # group 0 scores [1, 0]: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711
    #   -> advantages +0.5 / 0.70711 = +0.70711 and -0.70711
    # group 1 scores [1, 1]: mean 1, std 0 -> 0 / (0 + eps) = 0 for both
    data = rows([0, 1], [0, 0], [0, 1], [0, 1], groups=[0, 0, 1, 1])
    advantages, returns = grpo(data, AlgoConfig())
    expected_rows = torch.tensor([SQRT_HALF, -SQRT_HALF, 0.0, 0.0])
    torch.testing.assert_close(advantages, expected_rows[:, None].expand(4, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_grpo_without_std_and_dr_grpo_subtract_the_mean_only():
    # scores [1, 0] in one group: mean 0.5 -> +0.5, -0.5
    data = rows([1.0], [0.0], groups=[0, 0])
    no_std, _ = grpo(data, AlgoConfig(norm_adv_by_std=False))
    dr, _ = dr_grpo(data, AlgoConfig(norm_adv_by_std=True))  # dr_grpo ignores the flag
    torch.testing.assert_close(no_std, torch.tensor([[0.5], [-0.5]]))
    torch.testing.assert_close(dr, torch.tensor([[0.5], [-0.5]]))


def test_grpo_score_is_the_sum_over_response_tokens_and_groups_may_interleave():
    # row scores: 0.5 + 0.5 = 1 (group 7), 3 (group 3), 0 (group 7), 1 (group 3);
    # the reward 9 sits on a masked-out token and is not read.
    # group 7: [1, 0] -> +-0.5; group 3: [3, 1] -> mean 2 -> +1, -1 (no std)
    data = rows(
        [0.5, 0.5, 9.0],
        [3.0, 0, 0],
        [0, 0, 0],
        [1.0, 0, 0],
        mask=[[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]],
        groups=[7, 3, 7, 3],
    )
    advantages, _ = grpo(data, AlgoConfig(norm_adv_by_std=False))
    expected = torch.tensor([[0.5, 0.5, 0.0], [1.0, 1.0, 1.0], [-0.5, -0.5, -0.5], [-1.0, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)


def test_rloo_leave_one_out_baseline_and_singleton_group():
    # group 0 scores [1, 0, 0]:
    #   row 0: baseline (0 + 0) / 2 = 0    -> 1 - 0 = 1
    #   row 1: baseline (1 + 0) / 2 = 0.5  -> 0 - 0.5 = -0.5 (row 2 the same)
    # group 1 has one row (score 5): no other sample to compare with -> 0
    data = rows([1.0], [0.0], [0.0], [5.0], groups=[0, 0, 0, 1])
    advantages, _ = rloo(data, AlgoConfig())
    torch.testing.assert_close(advantages, torch.tensor([[1.0], [-0.5], [-0.5], [0.0]]))


@pytest.mark.parametrize("estimator", [grpo, dr_grpo, rloo])
def test_singleton_groups_get_zero(estimator):
    data = rows([3.0, 1.0], [-2.0, 0.5], groups=[0, 1])
    advantages, returns = estimator(data, AlgoConfig())
    assert torch.equal(advantages, torch.zeros(2, 2))
    assert torch.equal(returns, torch.zeros(2, 2))


# -- GAE ----------------------------------------------------------------------

# rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 0.9, lam 0.8 (gamma * lam = 0.72):
#   t=2: delta = 1 + 0.9*0   - 0.7 = 0.30   A = 0.30
#   t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03   A = 0.03 + 0.72*0.30  = 0.246
#   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04   A = 0.04 + 0.72*0.246 = 0.21712
#   returns = A + V = [0.71712, 0.846, 1.0]
# whitened: mean 0.254373, centred [-0.037253, -0.008373, 0.045627],
#   unbiased var (0.0013878 + 0.0000701 + 0.0020818) / 2 = 0.0017699, std 0.042070
#   -> [-0.8855, -0.1990, 1.0845]
GAE_RETURNS = [0.71712, 0.846, 1.0]
GAE_WHITENED = [-0.8855, -0.1990, 1.0845]
GAE_CFG = AlgoConfig(gamma=0.9, lam=0.8)


def test_gae_three_tokens_step_by_step():
    data = rows([0, 0, 1.0], values=[[0.5, 0.6, 0.7]])
    advantages, returns = gae(data, GAE_CFG)
    torch.testing.assert_close(returns, torch.tensor([GAE_RETURNS]), atol=1e-5, rtol=0)
    torch.testing.assert_close(advantages, torch.tensor([GAE_WHITENED]), atol=1e-3, rtol=0)


def test_gae_skips_env_tokens_between_turns():
    # Two observation tokens (values 9, reward 5 that must be ignored) sit between
    # the turns: the value after token 1 is the next *response* token's (0.7), so
    # the response tokens get exactly the three-token numbers above.
    data = rows([0, 0, 5.0, 5.0, 1.0], mask=[[1, 1, 0, 0, 1]], values=[[0.5, 0.6, 9.0, 9.0, 0.7]])
    advantages, returns = gae(data, GAE_CFG)
    torch.testing.assert_close(returns, torch.tensor([[0.71712, 0.846, 0, 0, 1.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(advantages, torch.tensor([[-0.8855, -0.1990, 0, 0, 1.0845]]), atol=1e-3, rtol=0)
    assert advantages[0, 2:4].eq(0).all() and returns[0, 2:4].eq(0).all()


def test_gae_needs_values():
    with pytest.raises(OmrlError, match="gae needs AdvantageInput.values"):
        gae(rows([1.0]), AlgoConfig())


def test_gae_rejects_lambda_out_of_range():
    with pytest.raises(ConfigError, match=r"algorithm.lam must be in \[0.0, 1.0\], got 1.5"):
        gae(rows([1.0], values=[[0.0]]), AlgoConfig(lam=1.5))


# -- REINFORCE++ --------------------------------------------------------------


def test_reinforce_plus_plus_returns_to_go_then_batch_whitening():
    # gamma 0.5. row 0 rewards [0, 0, 1] -> G = [0.25, 0.5, 1]
    #            row 1 rewards [1, 0, -] (last token masked) -> G = [1, 0]
    # whitening over the 5 response tokens [0.25, 0.5, 1, 1, 0]: mean 0.55,
    #   centred [-0.3, -0.05, 0.45, 0.45, -0.55], squares sum 0.8, unbiased var 0.2,
    #   std 0.44721 -> [-0.6708, -0.1118, 1.0062, 1.0062, -1.2298]
    data = rows([0, 0, 1.0], [1.0, 0, 0], mask=[[1, 1, 1], [1, 1, 0]])
    advantages, returns = reinforce_plus_plus(data, AlgoConfig(gamma=0.5))
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]]))
    expected = torch.tensor([[-0.6708, -0.1118, 1.0062], [1.0062, -1.2298, 0.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-4, rtol=0)


def test_reinforce_plus_plus_discounts_per_response_token_across_turns():
    # the masked env token between the turns is skipped: G_0 = 0 + 0.5 * G_2 = 0.5
    data = rows([0, 0, 1.0], mask=[[1, 0, 1]])
    _, returns = reinforce_plus_plus(data, AlgoConfig(gamma=0.5))
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0.0, 1.0]]))


# -- input checks -------------------------------------------------------------


def test_mismatched_shapes_name_the_tensor():
    data = AdvantageInput(torch.zeros(2, 3), torch.ones(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(OmrlError, match=r"grpo: loss_mask has shape \(2, 4\)"):
        grpo(data, AlgoConfig())


def test_group_ids_must_have_one_entry_per_row():
    data = AdvantageInput(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(OmrlError, match=r"rloo: group_ids has shape \(3,\); it must be \[bs\] = \(2,\)"):
        rloo(data, AlgoConfig())
