"""Policy losses: clipping, dual clip, clip-higher and loss aggregation, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import LOSS_AGG_MODES, AlgoConfig, PolicyLossInput, micro_batch_share
from omrl.errors import ConfigError
from omrl_plugins.algos.policy_losses import clip_higher, clipped_surrogate, dual_clip, ppo_clip


def policy_input(ratios, advantages, mask=None) -> PolicyLossInput:
    """log_probs = log(ratio) (a leaf that takes gradients), old_log_probs = 0."""
    log_probs = torch.log(torch.tensor(ratios, dtype=torch.float32)).requires_grad_()
    advantages = torch.tensor(advantages, dtype=torch.float32)
    return PolicyLossInput(
        log_probs=log_probs,
        old_log_probs=torch.zeros_like(log_probs),
        advantages=advantages,
        loss_mask=torch.ones_like(advantages) if mask is None else torch.tensor(mask, dtype=torch.float32),
    )


def test_ppo_clip_clipped_and_unclipped_tokens():
    # clip range [0.8, 1.2]; token loss = max(-A * r, -A * clip(r))
    #   A=+1, r=1.1: max(-1.1, -1.1) = -1.1  not clipped, d/dlogp = -A * r = -1.1
    #   A=+1, r=1.5: max(-1.5, -1.2) = -1.2  clipped (constant: no gradient)
    #   A=-1, r=0.5: max( 0.5,  0.8) =  0.8  clipped
    #   A=-1, r=1.5: max( 1.5,  1.2) =  1.5  not clipped, d/dlogp = +1.5
    # token-mean: (-1.1 - 1.2 + 0.8 + 1.5) / 4 = 0.0; gradients divided by 4
    data = policy_input([[1.1, 1.5, 0.5, 1.5]], [[1.0, 1.0, -1.0, -1.0]])
    token_loss, _ = clipped_surrogate(data, AlgoConfig())
    torch.testing.assert_close(token_loss, torch.tensor([[-1.1, -1.2, 0.8, 1.5]]))
    loss, metrics = ppo_clip(data, AlgoConfig())
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(data.log_probs.grad, torch.tensor([[-1.1 / 4, 0.0, 0.0, 1.5 / 4]]))
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 1.5) / 4)
    # approx KL = mean(r - 1 - log r) = (0.004690 + 0.094535 + 0.193147 + 0.094535) / 4
    assert metrics["approx_kl"] == pytest.approx(0.096727, abs=1e-5)


def test_dual_clip_bounds_negative_advantage_with_large_ratio():
    # clip_ratio_c = 3:
    #   A=-1, r=5:   PPO loss max(5, 1.2) = 5, capped at 3 * |A| = 3 (no gradient)
    #   A=-1, r=1.5: PPO loss 1.5 < 3, unchanged (gradient +1.5)
    #   A=+2, r=5:   positive advantage, PPO's max(-10, -2.4) = -2.4 unchanged
    # token-mean: (3 + 1.5 - 2.4) / 3 = 0.7
    data = policy_input([[5.0, 1.5, 5.0]], [[-1.0, -1.0, 2.0]])
    loss, metrics = dual_clip(data, AlgoConfig(clip_ratio_c=3.0))
    loss.backward()
    assert loss.item() == pytest.approx(0.7)
    torch.testing.assert_close(data.log_probs.grad, torch.tensor([[0.0, 1.5 / 3, 0.0]]))
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)
    ppo_loss, _ = ppo_clip(policy_input([[5.0, 1.5, 5.0]], [[-1.0, -1.0, 2.0]]), AlgoConfig())
    assert ppo_loss.item() == pytest.approx((5 + 1.5 - 2.4) / 3)


def test_dual_clip_needs_c_above_one():
    with pytest.raises(ConfigError, match="algorithm.clip_ratio_c must be > 1.0, got 0.5"):
        dual_clip(policy_input([[1.0]], [[1.0]]), AlgoConfig(clip_ratio_c=0.5))


def test_clip_higher_raises_the_upper_bound_to_at_least_0_28():
    # A=+1, r=1.25: ppo_clip (high 0.2) clips to -1.2; clip_higher (high 0.28) keeps -1.25
    data = policy_input([[1.25]], [[1.0]])
    assert ppo_clip(data, AlgoConfig())[0].item() == pytest.approx(-1.2)
    loss, metrics = clip_higher(data, AlgoConfig())
    assert loss.item() == pytest.approx(-1.25)
    assert metrics["clip_frac"] == 0.0
    # r=1.35 is clipped at 1.28, or at 1.3 when the configured range is higher
    data = policy_input([[1.35]], [[1.0]])
    assert clip_higher(data, AlgoConfig())[0].item() == pytest.approx(-1.28)
    assert clip_higher(data, AlgoConfig(clip_ratio_high=0.3))[0].item() == pytest.approx(-1.3)


def test_clip_higher_says_it_raises_a_clip_ratio_high_the_user_set_lower():
    """An explicit 0.1 gave exactly the default's losses, without a word."""
    import warnings

    data = policy_input([[1.35]], [[1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default (0.2, ppo_clip's) and a higher value: nothing to say
        clip_higher(data, AlgoConfig())
        clip_higher(data, AlgoConfig(clip_ratio_high=0.3))
    with pytest.warns(UserWarning, match=r"algorithm.clip_ratio_high=0.123 is raised to 0.28 by .*clip_higher"):
        assert clip_higher(data, AlgoConfig(clip_ratio_high=0.123))[0].item() == pytest.approx(-1.28)


# ratio 1 everywhere, so each token's loss is -A: row 0 [-1, -2, -3], row 1 [-4],
# row 2 has no response token (left out of every mean)
RAGGED = dict(
    ratios=[[1.0, 1.0, 1.0]] * 3,
    advantages=[[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]],
    mask=[[1, 1, 1], [1, 0, 0], [0, 0, 0]],
)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", -10 / 4),  # (-1 - 2 - 3 - 4) / 4 tokens
        ("seq-mean-token-sum", -10 / 2),  # (-6 + -4) / 2 sequences
        ("seq-mean-token-mean", -3.0),  # (-6/3 + -4/1) / 2 sequences
        ("token-sum", -10.0),  # -1 - 2 - 3 - 4
        ("seq-mean-token-sum-norm", -10 / 2 / 8),  # (-6/8 + -4/8) / 2 sequences, loss_norm_tokens=8
    ],
)
def test_loss_aggregation_modes_on_a_ragged_mask(mode, expected):
    loss, _ = ppo_clip(policy_input(**RAGGED), AlgoConfig(loss_agg_mode=mode, loss_norm_tokens=8))
    assert loss.item() == pytest.approx(expected)


def test_unknown_aggregation_mode_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="token-mean, seq-mean-token-sum, seq-mean-token-mean, token-sum"):
        ppo_clip(policy_input([[1.0]], [[1.0]]), AlgoConfig(loss_agg_mode="sum"))


def test_constant_normaliser_must_be_set():
    with pytest.raises(ConfigError, match="loss_norm_tokens, which must be > 0"):
        ppo_clip(policy_input([[1.0]], [[1.0]]), AlgoConfig(loss_agg_mode="seq-mean-token-sum-norm"))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_weighted_by_their_share_add_up_to_the_whole(mode):
    # rows 0-1 in one micro-batch, row 2 (no token) and a 4th row in the other: the weighted sum of the
    # micro-batches' losses is the loss of the whole batch, whatever the mode
    whole = policy_input(
        ratios=[[1.0, 1.0, 1.0]] * 4,
        advantages=[[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0], [-2.0, 5.0, 0.5]],
        mask=[[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]],
    )
    cfg = AlgoConfig(loss_agg_mode=mode, loss_norm_tokens=8)
    tokens, seqs = float(whole.loss_mask.sum()), float((whole.loss_mask.sum(-1) > 0).sum())
    parts = 0.0
    for rows in ([0, 1], [2, 3]):
        part = PolicyLossInput(
            *(t[rows] for t in (whole.log_probs, whole.old_log_probs, whole.advantages, whole.loss_mask))
        )
        loss, _ = ppo_clip(part, cfg)
        parts += micro_batch_share(mode, part.loss_mask, tokens, seqs) * loss.item()
    assert parts == pytest.approx(ppo_clip(whole, cfg)[0].item())


@pytest.mark.parametrize("loss_fn", [ppo_clip, dual_clip, clip_higher])
def test_masked_positions_never_reach_loss_or_gradient(loss_fn):
    # garbage off the mask: -inf log-prob, NaN advantage
    log_probs = torch.tensor([[-0.1, -float("inf")], [-0.3, -0.2]], requires_grad=True)
    data = PolicyLossInput(
        log_probs=log_probs,
        old_log_probs=torch.tensor([[-0.2, 0.0], [-0.1, -5.0]]),
        advantages=torch.tensor([[1.0, float("nan")], [-2.0, 0.5]]),
        loss_mask=torch.tensor([[1, 0], [1, 1]]),
    )
    loss, metrics = loss_fn(data, AlgoConfig())
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(log_probs.grad).all()
    assert log_probs.grad[0, 1] == 0.0
    assert all(math.isfinite(v) for v in metrics.values())
