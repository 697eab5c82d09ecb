"""Clip-Cov and KL-Cov against the paper's formulas, computed by hand token by token."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AlgoConfig, PolicyLossInput
from omrl.errors import OmrlError
from omrl_plugins.algos.covariance_losses import clip_cov, kl_cov
from tests.algos.helpers import MASK, MASKS, check_config_refused, check_garbage_off_the_mask_is_unread, loss_input

NAN, INF = float("nan"), float("inf")

LOG_PROBS = [[-0.1, -3.0, NAN, -INF, -0.2, -2.5, NAN], [-0.3, -2.0, -0.05, NAN, -INF, NAN, NAN], [NAN] * 7]
ADV = [[2.0, -1.5, NAN, NAN, 1.5, 1.0, NAN], [-1.0, 2.5, 2.2, NAN, NAN, NAN, NAN], [NAN] * 7]
# only (1, 2) is clipped by PPO's [0.8, 1.2] (A > 0, ratio 1.5)
RATIOS = [[1.1, 0.9, 1.0, 1.0, 1.05, 0.7, 1.0], [1.3, 0.6, 1.5, 1.0, 1.0, 1.0, 1.0], [1.0] * 7]
OLD = [
    [lp - math.log(r) if m else NAN for lp, r, m in zip(lp_row, r_row, m_row)]
    for lp_row, r_row, m_row in zip(LOG_PROBS, RATIOS, MASK)
]
TOKENS = [(i, t) for i, row in enumerate(MASK) for t, m in enumerate(row) if m]  # row-major
N = len(TOKENS)


def batch(mask=MASK) -> PolicyLossInput:
    return loss_input(LOG_PROBS, OLD, ADV, mask)


def covariances() -> dict[tuple[int, int], float]:
    """cov_t = (A_t - mean A) * (log pi_t - mean log pi), the means over the masked tokens."""
    mean_adv = sum(ADV[i][t] for i, t in TOKENS) / N
    mean_lp = sum(LOG_PROBS[i][t] for i, t in TOKENS) / N
    return {(i, t): (ADV[i][t] - mean_adv) * (LOG_PROBS[i][t] - mean_lp) for i, t in TOKENS}


def ratio(i, t) -> float:
    return math.exp(LOG_PROBS[i][t] - OLD[i][t])


def ppo_token(i, t, low=0.2, high=0.2) -> tuple[float, float, bool]:
    """(ppo_clip's token loss, its d / d log pi, whether its clip is active)."""
    a, r = ADV[i][t], ratio(i, t)
    unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
    return max(unclipped, clipped), (-a * r if unclipped >= clipped else 0.0), clipped > unclipped


CLIP_COV_CFG = dict(cov_clip_ratio=0.3, cov_clip_low=0.5, cov_clip_high=5.0)  # cut int(0.3 * 7) = 2


def clip_cov_candidates() -> list[tuple[int, int]]:
    cov = covariances()
    return [
        (i, t)
        for i, t in TOKENS
        if CLIP_COV_CFG["cov_clip_low"] <= cov[i, t] <= CLIP_COV_CFG["cov_clip_high"] and not ppo_token(i, t)[2]
    ]


def test_the_clip_cov_example_has_candidates_and_a_ppo_clipped_token_in_range():
    cov = covariances()
    in_range = [(i, t) for i, t in TOKENS if 0.5 <= cov[i, t] <= 5.0]
    assert in_range == [(0, 0), (0, 1), (0, 4), (1, 2)]
    assert ppo_token(1, 2)[2]  # in range, but PPO's clip already cut its gradient: no candidate
    assert clip_cov_candidates() == [(0, 0), (0, 1), (0, 4)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clip_cov_cuts_a_seeded_random_draw_of_candidates(seed):
    candidates = clip_cov_candidates()
    torch.manual_seed(seed)
    order = torch.randperm(len(candidates)).tolist()  # the draw, by hand
    cut = {candidates[k] for k in order[:2]}
    torch.manual_seed(seed)
    data = batch()
    loss, metrics = clip_cov(data, AlgoConfig(**CLIP_COV_CFG))
    loss.backward()
    want_loss = 0.0
    want_grads = [[0.0] * 7 for _ in range(3)]
    for i, t in TOKENS:
        token_loss, grad, _ = ppo_token(i, t)
        if (i, t) not in cut:  # a cut token's loss is 0: no gradient
            want_loss += token_loss / N
            want_grads[i][t] = grad / N
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, torch.tensor(want_grads, dtype=torch.float64))
    assert metrics["cov_clip_frac"] == pytest.approx(2 / 7)
    assert metrics["clip_frac"] == pytest.approx(1 / 7)


def test_clip_cov_same_seed_same_cut_and_all_candidates_when_too_few():
    grads = []
    for _ in range(2):
        torch.manual_seed(7)
        data = batch()
        clip_cov(data, AlgoConfig(**CLIP_COV_CFG))[0].backward()
        grads.append(data.log_probs.grad)
    torch.testing.assert_close(grads[0], grads[1])
    # a share of 1 asks for 7 tokens; only the 3 candidates can be cut
    data = batch()
    loss, metrics = clip_cov(data, AlgoConfig(**{**CLIP_COV_CFG, "cov_clip_ratio": 1.0}))
    loss.backward()
    assert metrics["cov_clip_frac"] == pytest.approx(3 / 7)
    for i, t in TOKENS:
        cut_or_clipped = (i, t) in clip_cov_candidates() or ppo_token(i, t)[2]
        assert (data.log_probs.grad[i, t] == 0.0) == cut_or_clipped


def test_kl_cov_penalises_the_top_covariance_tokens_and_clips_nothing():
    coef = 0.5
    data = batch()
    loss, metrics = kl_cov(data, AlgoConfig(kl_cov_ratio=0.3, kl_cov_coef=coef))  # k = int(0.3 * 7) = 2
    loss.backward()
    cov = covariances()
    top = sorted(TOKENS, key=lambda token: cov[token], reverse=True)[:2]
    assert top == [(0, 1), (1, 2)]
    want_loss = 0.0
    want_grads = [[0.0] * 7 for _ in range(3)]
    for i, t in TOKENS:
        a, r = ADV[i][t], ratio(i, t)
        log_ratio = LOG_PROBS[i][t] - OLD[i][t]
        token_loss, grad = -a * r, -a * r  # no ratio clip, even for (1, 2) at ratio 1.5
        if (i, t) in top:
            token_loss += coef * abs(log_ratio)
            grad += coef * math.copysign(1.0, log_ratio)
        want_loss += token_loss / N
        want_grads[i][t] = grad / N
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=torch.float64))
    torch.testing.assert_close(data.log_probs.grad, torch.tensor(want_grads, dtype=torch.float64))
    assert metrics["kl_cov_frac"] == pytest.approx(2 / 7)
    assert "clip_frac" not in metrics


def test_kl_cov_penalises_at_least_one_token():
    data = batch()
    _, metrics = kl_cov(data, AlgoConfig(kl_cov_ratio=1e-6))
    assert metrics["kl_cov_frac"] == pytest.approx(1 / 7)


@pytest.mark.parametrize("loss_fn", [clip_cov, kl_cov])
@MASKS
def test_garbage_off_the_mask_never_reaches_loss_or_gradient(loss_fn, mask):
    torch.manual_seed(0)
    config = AlgoConfig(cov_clip_low=-10.0, cov_clip_ratio=0.5, kl_cov_ratio=0.5)
    check_garbage_off_the_mask_is_unread(loss_fn, batch(mask=mask), config)


@pytest.mark.parametrize("loss_fn", [clip_cov, kl_cov])
def test_mismatched_shapes_are_rejected(loss_fn):
    data = PolicyLossInput(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 2), torch.ones(2, 3))
    with pytest.raises(OmrlError, match=f"{loss_fn.__name__}: advantages has shape \\(3, 2\\)"):
        loss_fn(data, AlgoConfig())


@pytest.mark.parametrize(
    "loss_fn, fields, message",
    [
        (clip_cov, {"cov_clip_ratio": 0.0}, "algorithm.cov_clip_ratio must be in \\(0.0, 1.0\\], got 0.0"),
        (clip_cov, {"cov_clip_ratio": 1.5}, "algorithm.cov_clip_ratio must be in \\(0.0, 1.0\\], got 1.5"),
        (clip_cov, {"cov_clip_low": 2.0, "cov_clip_high": 1.0}, "algorithm.cov_clip_high must be >= 2.0"),
        (clip_cov, {"clip_ratio_low": 1.5}, "algorithm.clip_ratio_low must be in \\[0.0, 1.0\\], got 1.5"),
        (kl_cov, {"kl_cov_ratio": 0.0}, "algorithm.kl_cov_ratio must be in \\(0.0, 1.0\\], got 0.0"),
        (kl_cov, {"kl_cov_coef": -1.0}, "algorithm.kl_cov_coef must be >= 0.0, got -1.0"),
    ],
)
def test_out_of_range_config_is_a_config_error(loss_fn, fields, message):
    check_config_refused(loss_fn, fields, message)
