"""CISPO, SAPO and REINFORCE against their formulas, computed by hand token by token."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AlgoConfig, PolicyLossInput
from omrl.errors import OmrlError
from omrl_plugins.algos.policy_losses import ppo_clip
from omrl_plugins.algos.token_weighted_losses import cispo, reinforce, sapo
from tests.algos.helpers import MASK, MASKS, check_config_refused, check_garbage_off_the_mask_is_unread, loss_input

NAN, INF = float("nan"), float("inf")

LOG_PROBS = [[-0.5, -1.0, NAN, -INF, -0.2, -2.0, NAN], [-0.3, -0.8, -1.5, NAN, -INF, NAN, NAN], [NAN] * 7]
RATIOS = [[1.5, 0.5, 1.0, 1.0, 1.1, 1.0, 1.0], [0.9, 2.0, 0.7, 1.0, 1.0, 1.0, 1.0], [1.0] * 7]
ADV = [[1.0, -2.0, NAN, NAN, 0.5, -1.0, NAN], [2.0, 1.0, -0.5, NAN, NAN, NAN, NAN], [NAN] * 7]
# old = log_probs - log(ratio) on the mask, garbage off it
OLD = [
    [lp - math.log(r) if m else NAN for lp, r, m in zip(lp_row, r_row, m_row)]
    for lp_row, r_row, m_row in zip(LOG_PROBS, RATIOS, MASK)
]
N_TOKENS = 7


def batch(log_probs=LOG_PROBS, old_log_probs=OLD, advantages=ADV, mask=MASK) -> PolicyLossInput:
    return loss_input(log_probs, old_log_probs, advantages, mask)


def tokens(mask=MASK):
    """(row, position) of every masked token, row by row."""
    return [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]


def as_tensor(grads) -> torch.Tensor:
    return torch.tensor(grads, dtype=torch.float64)


def test_cispo_keeps_every_tokens_gradient_and_clips_only_its_weight():
    low, high = 0.2, 0.28
    data = batch()
    loss, metrics = cispo(data, AlgoConfig(clip_ratio_low=low, clip_ratio_high=high))
    loss.backward()
    want_loss, clipped = 0.0, 0
    want_grads = [[0.0] * 7 for _ in range(3)]
    for i, t in tokens():
        ratio = math.exp(LOG_PROBS[i][t] - OLD[i][t])
        weight = min(max(ratio, 1 - low), 1 + high)  # sg(clip(r)): a constant
        want_loss += -weight * ADV[i][t] * LOG_PROBS[i][t] / N_TOKENS  # token-mean
        want_grads[i][t] = -weight * ADV[i][t] / N_TOKENS
        clipped += weight != ratio
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, as_tensor(want_grads))
    # ratios 1.5, 0.5, 2.0, 0.7 are clipped, yet their tokens keep a gradient (PPO's would be 0)
    assert all(data.log_probs.grad[i, t] != 0.0 for i, t in tokens())
    assert data.log_probs.grad[0, 0].item() == pytest.approx(-1.28 * 1.0 / 7)
    assert data.log_probs.grad[0, 1].item() == pytest.approx(-0.8 * -2.0 / 7)
    assert metrics["clip_frac"] == pytest.approx(clipped / N_TOKENS) == pytest.approx(4 / 7)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 1.0 + 0.9 + 2.0 + 0.7) / 7)


def test_cispo_without_a_lower_bound():
    # clip_ratio_low = 1: the bound 1 - 1 = 0 never binds (the paper sets no lower bound)
    data = batch([[-3.0]], [[-3.0 - math.log(0.01)]], [[-1.0]], mask=[[1]])
    loss, metrics = cispo(data, AlgoConfig(clip_ratio_low=1.0, clip_ratio_high=0.28))
    loss.backward()
    assert data.log_probs.grad.item() == pytest.approx(0.01)  # -w * A with w = r = 0.01
    assert metrics["clip_frac"] == 0.0


def test_sapo_soft_gate_value_and_gradient():
    tau_pos, tau_neg = 1.0, 1.05  # the paper's
    data = batch()
    loss, metrics = sapo(data, AlgoConfig(loss_agg_mode="seq-mean-token-mean"))
    loss.backward()
    rows = {i for i, _ in tokens()}
    want_loss, gate_weights = 0.0, []
    want_grads = [[0.0] * 7 for _ in range(3)]
    for i, t in tokens():
        n_row = sum(MASK[i])
        ratio = math.exp(LOG_PROBS[i][t] - OLD[i][t])
        tau = tau_pos if ADV[i][t] > 0 else tau_neg
        p = 1 / (1 + math.exp(-tau * (ratio - 1)))
        weight = 1 / (len(rows) * n_row)  # seq-mean-token-mean
        want_loss += weight * -(4 / tau) * p * ADV[i][t]
        # d f(r) / d log pi = f'(r) * r = 4 p (1 - p) * r
        want_grads[i][t] = weight * -4 * p * (1 - p) * ratio * ADV[i][t]
        gate_weights.append(4 * p * (1 - p))
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, as_tensor(want_grads))
    assert metrics["gate_weight_mean"] == pytest.approx(sum(gate_weights) / N_TOKENS)


def test_sapo_on_policy_is_the_plain_policy_gradient():
    # at ratio 1 the gate's gradient weight 4 p (1 - p) is 1 for either temperature
    old = [[lp if m else NAN for lp, m in zip(lp_row, m_row)] for lp_row, m_row in zip(LOG_PROBS, MASK)]
    data = batch(old_log_probs=old)
    loss, metrics = sapo(data, AlgoConfig(sapo_tau_pos=2.0, sapo_tau_neg=3.0))
    loss.backward()
    want = [[-ADV[i][t] / N_TOKENS if m else 0.0 for t, m in enumerate(MASK[i])] for i in range(3)]
    torch.testing.assert_close(data.log_probs.grad, as_tensor(want))
    assert metrics["gate_weight_mean"] == pytest.approx(1.0)
    # the value: -(4 / tau) * 1/2 * A per token
    want_loss = sum(-(4 / (2.0 if ADV[i][t] > 0 else 3.0)) * 0.5 * ADV[i][t] for i, t in tokens()) / N_TOKENS
    assert loss.item() == pytest.approx(want_loss)


def test_reinforce_is_minus_advantage_times_log_prob():
    data = batch()
    loss, metrics = reinforce(data, AlgoConfig())
    loss.backward()
    want_loss = sum(-ADV[i][t] * LOG_PROBS[i][t] for i, t in tokens()) / N_TOKENS
    want = [[-ADV[i][t] / N_TOKENS if m else 0.0 for t, m in enumerate(MASK[i])] for i in range(3)]
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, as_tensor(want))  # the ratios play no part
    assert "clip_frac" not in metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_reinforce_on_policy_has_ppo_clips_gradient(mode):
    old = [[lp if m else NAN for lp, m in zip(lp_row, m_row)] for lp_row, m_row in zip(LOG_PROBS, MASK)]
    pg, ppo = batch(old_log_probs=old), batch(old_log_probs=old)
    reinforce(pg, AlgoConfig(loss_agg_mode=mode))[0].backward()
    ppo_clip(ppo, AlgoConfig(loss_agg_mode=mode))[0].backward()
    torch.testing.assert_close(pg.log_probs.grad, ppo.log_probs.grad)


@pytest.mark.parametrize("loss_fn", [cispo, sapo, reinforce])
@MASKS
def test_garbage_off_the_mask_never_reaches_loss_or_gradient(loss_fn, mask):
    check_garbage_off_the_mask_is_unread(loss_fn, batch(mask=mask), AlgoConfig())


@pytest.mark.parametrize("loss_fn", [cispo, sapo, reinforce])
def test_mismatched_shapes_are_rejected(loss_fn):
    data = batch([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], mask=[[1, 1, 1]])
    with pytest.raises(OmrlError, match=f"{loss_fn.__name__}: loss_mask has shape \\(1, 3\\)"):
        loss_fn(data, AlgoConfig())


@pytest.mark.parametrize(
    "loss_fn, field, value, message",
    [
        (cispo, "clip_ratio_low", 1.5, "algorithm.clip_ratio_low must be in \\[0.0, 1.0\\], got 1.5"),
        (cispo, "clip_ratio_high", -0.1, "algorithm.clip_ratio_high must be >= 0.0, got -0.1"),
        (sapo, "sapo_tau_pos", 0.0, "algorithm.sapo_tau_pos must be > 0.0, got 0.0"),
        (sapo, "sapo_tau_neg", -1.0, "algorithm.sapo_tau_neg must be > 0.0, got -1.0"),
        (reinforce, "loss_agg_mode", "sum", "algorithm.loss_agg_mode 'sum' is unknown"),
    ],
)
def test_out_of_range_config_is_a_config_error(loss_fn, field, value, message):
    check_config_refused(loss_fn, {field: value}, message)


def test_a_loss_agg_mode_spelled_with_an_underscore_is_pointed_to_its_name():
    from omrl.algos import require_agg_mode
    from omrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'token_mean' is unknown \(did you mean 'token-mean'\?\)"):
        require_agg_mode("token_mean")
