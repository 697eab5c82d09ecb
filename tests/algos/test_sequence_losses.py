"""GSPO and GMPO against their papers' formulas, computed by hand token by token."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AlgoConfig
from omrl.errors import OmrlError
from omrl_plugins.algos.sequence_losses import gmpo, gspo
from tests.algos.helpers import MASK, MASKS, check_config_refused, check_garbage_off_the_mask_is_unread, loss_input

NAN, INF = float("nan"), float("inf")

GSPO_CFG = dict(clip_ratio_low=0.0003, clip_ratio_high=0.0004)  # the paper's ranges


def masked(row) -> list[int]:
    return [t for t, m in enumerate(row) if m]


# log ratios on the mask: row 0 [1e-4, -2e-4, 3e-4, 2e-4] (s = e^1e-4, inside [1 - 3e-4, 1 + 4e-4]),
# row 1 [1e-3, 2e-3, 0] (s = e^1e-3, above it); garbage off the mask
GSPO_LOG_PROBS = [
    [-1.0, -2.0, -INF, NAN, -0.5, -0.7, -INF],
    [-0.2, -0.3, -0.4, NAN, NAN, -INF, NAN],
    [NAN] * 7,
]
GSPO_OLD = [
    [-1.0001, -1.9998, NAN, 0.0, -0.5003, -0.7002, NAN],
    [-0.201, -0.302, -0.4, NAN, 0.0, 0.0, 0.0],
    [-INF] * 7,
]
# row 1's advantage changes sign: its positive tokens are clipped, the negative one is not
GSPO_ADV = [[1.5, 1.5, NAN, NAN, 1.5, 1.5, NAN], [0.5, -1.0, 0.5, NAN, NAN, NAN, NAN], [NAN] * 7]


def gspo_by_hand(log_probs, old, adv, mask, low, high, mode):
    """GSPO-token, eq. by eq.: (loss, d loss / d log_probs, clip_frac, seq_ratio_mean)."""
    rows = [i for i in range(len(mask)) if any(mask[i])]
    n_tokens = sum(len(masked(mask[i])) for i in rows)
    loss, clipped, ratios = 0.0, 0, []
    grads = [[0.0] * len(mask[0]) for _ in mask]
    for i in rows:
        idx = masked(mask[i])
        s = math.exp(sum(log_probs[i][t] - old[i][t] for t in idx) / len(idx))
        ratios.append(s)
        for t in idx:
            a = adv[i][t]
            unclipped, clipped_loss = -a * s, -a * min(max(s, 1 - low), 1 + high)
            # the weight this token's loss gets in the aggregate
            weight = 1 / (len(rows) * len(idx)) if mode == "seq-mean-token-mean" else 1 / n_tokens
            loss += weight * max(unclipped, clipped_loss)
            # d s_{i,t} / d log pi_t = s_i (stop-gradient on s_i, pi_t / sg[pi_t])
            grads[i][t] = weight * -a * s if unclipped >= clipped_loss else 0.0
            clipped += clipped_loss > unclipped
    return loss, grads, clipped / n_tokens, sum(ratios) / len(ratios)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_matches_the_paper_token_by_token(mode):
    data = loss_input(GSPO_LOG_PROBS, GSPO_OLD, GSPO_ADV)
    loss, metrics = gspo(data, AlgoConfig(loss_agg_mode=mode, **GSPO_CFG))
    loss.backward()
    want_loss, want_grads, clip_frac, seq_ratio = gspo_by_hand(
        GSPO_LOG_PROBS, GSPO_OLD, GSPO_ADV, MASK, 0.0003, 0.0004, mode
    )
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, torch.tensor(want_grads, dtype=torch.float64))
    # row 0 (inside the range): every token's gradient is -A * s_0 / (|y_0| * 2 sequences)
    if mode == "seq-mean-token-mean":
        assert data.log_probs.grad[0, 0].item() == pytest.approx(-1.5 * math.exp(1e-4) / 8)
    # row 1: its two positive-advantage tokens are clipped (no gradient), its negative one is not
    assert data.log_probs.grad[1, 0] == 0.0 and data.log_probs.grad[1, 2] == 0.0
    assert data.log_probs.grad[1, 1] > 0.0
    assert metrics["clip_frac"] == pytest.approx(clip_frac) == pytest.approx(2 / 7)
    assert metrics["seq_ratio_mean"] == pytest.approx(seq_ratio)
    token_ratios = [math.exp(GSPO_LOG_PROBS[i][t] - GSPO_OLD[i][t]) for i in range(3) for t in masked(MASK[i])]
    assert metrics["ratio_mean"] == pytest.approx(sum(token_ratios) / 7)
    assert metrics["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in token_ratios) / 7)


def test_gspo_token_is_sequence_level_gspo_when_each_row_has_one_advantage():
    # the paper: with A_{i,t} = A_i, GSPO-token's objective and gradient are GSPO's
    log_probs = [[-1.0, -2.0, 0.0, 0.0, -0.5, -0.7, 0.0], [-0.2, -0.3, -0.4, 0, 0, 0, 0], [0.0] * 7]
    old = [[-1.0001, -1.9998, 0.0, 0.0, -0.5003, -0.7002, 0.0], [-0.201, -0.302, -0.4, 0, 0, 0, 0], [0.0] * 7]
    adv = [[2.0] * 7, [-1.0] * 7, [3.0] * 7]
    data = loss_input(log_probs, old, adv)
    loss, _ = gspo(data, AlgoConfig(loss_agg_mode="seq-mean-token-mean", **GSPO_CFG))
    loss.backward()
    # sequence-level GSPO: -1/G sum_i min(s_i A_i, clip(s_i) A_i), autograd through s_i itself
    leaf = torch.tensor(log_probs, dtype=torch.float64, requires_grad=True)
    objective = []
    for i in (0, 1):
        idx = masked(MASK[i])
        s = torch.stack([leaf[i, t] - old[i][t] for t in idx]).mean().exp()
        a = adv[i][0]
        objective.append(torch.minimum(s * a, s.clamp(1 - 0.0003, 1 + 0.0004) * a))
    sequence_loss = -torch.stack(objective).mean()
    sequence_loss.backward()
    torch.testing.assert_close(loss, sequence_loss)
    torch.testing.assert_close(data.log_probs.grad, leaf.grad)


def test_gspo_clamps_the_sequence_log_ratio_and_its_gradient():
    # mean log ratio 100 would overflow exp(); clamped to 20. A < 0 and s > 1 + eps: unclipped, yet
    # past the clamp the loss is constant, as ppo_clip's and verl's clamp make it: no gradient
    data = loss_input([[0.0, 0.0]], [[-100.0, -100.0]], [[-1.0, -1.0]], mask=[[1, 1]])
    loss, metrics = gspo(data, AlgoConfig(**GSPO_CFG))
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0))
    assert (data.log_probs.grad == 0).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("log_ratio", [25.0, -25.0])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_a_row_past_the_clamp_gets_no_gradient_while_the_others_keep_theirs(log_ratio, advantage):
    # row 0: every token at log ratio +-25, past +-20; row 1 inside the clip range
    log_probs = [[0.0] * 4, [-1.0, -1.0, -1.0, -1.0]]
    old = [[-log_ratio] * 4, [-1.0001, -0.9999, -1.0, -1.0]]
    data = loss_input(log_probs, old, [[advantage] * 4, [1.0] * 4], mask=[[1] * 4, [1] * 4])
    loss, _ = gspo(data, AlgoConfig(**GSPO_CFG))
    loss.backward()
    assert (data.log_probs.grad[0] == 0).all()
    assert (data.log_probs.grad[1] < 0).all()  # -A * s / 8 on each token of the live row


# log ratios on the mask: row 0 [0.5, -0.6, 0.1, -0.2] with advantages of mean +1,
# row 1 [0.7, -0.5, 0.0] with advantages of mean -2
GMPO_LOG_PROBS = [[-0.5, -1.6, NAN, -INF, -0.9, -1.2, NAN], [-0.3, -1.5, -1.0, NAN, NAN, NAN, -INF], [NAN] * 7]
GMPO_OLD = [[-1.0, -1.0, 0.0, NAN, -1.0, -1.0, -INF], [-1.0, -1.0, -1.0, 0.0, NAN, 0.0, 0.0], [-INF] * 7]
GMPO_ADV = [[0.5, 1.5, NAN, NAN, 1.0, 1.0, NAN], [-2.0, -1.0, -3.0, NAN, NAN, NAN, NAN], [NAN] * 7]


def gmpo_by_hand(log_probs, old, adv, mask, low, high):
    """GMPO, eq. by eq.: (loss, d loss / d log_probs, log_ratio_clip_frac, seq_ratio_mean)."""
    rows = [i for i in range(len(mask)) if any(mask[i])]
    n_tokens = sum(len(masked(mask[i])) for i in rows)
    seq_losses, seq_ratios, clipped = [], [], 0
    grads = [[0.0] * len(mask[0]) for _ in mask]
    for i in rows:
        idx = masked(mask[i])
        a = sum(adv[i][t] for t in idx) / len(idx)  # the sequence's advantage
        kept = {}
        for t in idx:
            lr = log_probs[i][t] - old[i][t]
            bound = min(max(lr, -low), high)
            kept[t] = min(lr, bound) if a >= 0 else max(lr, bound)  # pessimistic, by the sign of A_i
        geo = math.exp(sum(kept.values()) / len(idx))  # geometric mean of the clipped ratios
        seq_losses.append(-a * geo)
        seq_ratios.append(geo)
        for t in idx:
            live = kept[t] == log_probs[i][t] - old[i][t]  # the clipped bound carries no gradient
            grads[i][t] = -a * geo / len(idx) / len(rows) if live else 0.0
            clipped += not live
    return sum(seq_losses) / len(rows), grads, clipped / n_tokens, sum(seq_ratios) / len(rows)


def test_gmpo_matches_the_paper_with_the_mean_over_sequences():
    data = loss_input(GMPO_LOG_PROBS, GMPO_OLD, GMPO_ADV)
    cfg = AlgoConfig(clip_ratio_low=0.4, clip_ratio_high=0.4, loss_agg_mode="seq-mean-token-mean")
    loss, metrics = gmpo(data, cfg)
    loss.backward()
    want_loss, want_grads, clip_frac, seq_ratio = gmpo_by_hand(GMPO_LOG_PROBS, GMPO_OLD, GMPO_ADV, MASK, 0.4, 0.4)
    # row 0: l' = [0.4 (clipped), -0.6, 0.1, -0.2], loss -1 * e^-0.075; row 1: l' = [0.7, -0.4 (clipped), 0],
    # loss 2 * e^0.1; the mean over the two sequences
    assert want_loss == pytest.approx((-math.exp(-0.075) + 2 * math.exp(0.1)) / 2)
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, torch.tensor(want_grads, dtype=torch.float64))
    assert data.log_probs.grad[0, 0] == 0.0 and data.log_probs.grad[1, 1] == 0.0
    # the bound replaced row 0's 0.5 (A_0 > 0) and row 1's -0.5 (A_1 < 0). verl's pg_clipfrac counts
    # other tokens: row 0's 0.5 and -0.6 (outside the band, A_t > 0); pg_clipfrac_lower row 1's 0.7, -0.5
    assert metrics["log_ratio_clip_frac"] == pytest.approx(clip_frac) == pytest.approx(2 / 7)
    assert "clip_frac" not in metrics
    assert metrics["seq_ratio_mean"] == pytest.approx(seq_ratio)


def test_gmpo_under_token_mean_weighs_each_sequence_by_its_length():
    # the sequences' losses as above, row 0 with 4 tokens and row 1 with 3: (4 L0 + 3 L1) / 7
    data = loss_input(GMPO_LOG_PROBS, GMPO_OLD, GMPO_ADV)
    loss, _ = gmpo(data, AlgoConfig(clip_ratio_low=0.4, clip_ratio_high=0.4))
    assert loss.item() == pytest.approx((4 * -math.exp(-0.075) + 3 * 2 * math.exp(0.1)) / 7)


def test_gmpo_clamps_the_mean_log_ratio_and_its_gradient():
    # A < 0 keeps the larger log ratio, 100, unclipped: exp(100) would overflow float32; clamped to 20,
    # past which the loss is constant
    data = loss_input([[0.0, 0.0]], [[-100.0, -100.0]], [[-1.0, -1.0]], mask=[[1, 1]])
    loss, _ = gmpo(data, AlgoConfig())
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0))
    assert (data.log_probs.grad == 0).all()


@pytest.mark.parametrize("loss_fn", [gspo, gmpo])
@MASKS
def test_garbage_off_the_mask_never_reaches_loss_or_gradient(loss_fn, mask):
    data = loss_input(GSPO_LOG_PROBS, GSPO_OLD, GSPO_ADV, mask=mask)
    check_garbage_off_the_mask_is_unread(loss_fn, data, AlgoConfig(**GSPO_CFG))


@pytest.mark.parametrize("loss_fn", [gspo, gmpo])
def test_mismatched_shapes_are_rejected(loss_fn):
    data = loss_input([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0, 1.0]], mask=[[1, 1]])
    with pytest.raises(OmrlError, match=f"{loss_fn.__name__}: advantages has shape \\(1, 3\\)"):
        loss_fn(data, AlgoConfig())


@pytest.mark.parametrize(
    "loss_fn, field, value, message",
    [
        (gspo, "clip_ratio_low", 1.5, "algorithm.clip_ratio_low must be in \\[0.0, 1.0\\], got 1.5"),
        (gspo, "clip_ratio_high", -0.1, "algorithm.clip_ratio_high must be >= 0.0, got -0.1"),
        (gmpo, "clip_ratio_low", -0.4, "algorithm.clip_ratio_low must be >= 0.0, got -0.4"),
        (gmpo, "clip_ratio_high", -0.4, "algorithm.clip_ratio_high must be >= 0.0, got -0.4"),
    ],
)
def test_out_of_range_config_is_a_config_error(loss_fn, field, value, message):
    check_config_refused(loss_fn, {field: value}, message)
