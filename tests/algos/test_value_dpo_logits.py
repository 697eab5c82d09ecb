"""Value loss, DPO loss, and log-probs / entropy from logits, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.errors import ConfigError, OmrlError
from omrl.training.logits import entropy_from_logits, token_log_probs
from omrl.training.losses import dpo_loss, value_loss

# -- value loss ---------------------------------------------------------------


def test_value_clipping_by_hand():
    # old value 1.0, return 2.0, clip 0.2 (the new value may be read as at most 1.2 / at least 0.8):
    #   v=1.5: clipped 1.2; max((1.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) = 0.64 -> 0.5 * 0.64 = 0.32  (clipped)
    #   v=1.1: within range; (1.1-2)^2 = 0.81                               -> 0.405             (not)
    #   v=0.5: clipped 0.8; max(2.25, 1.44) = 2.25, the unclipped term      -> 1.125             (not)
    # token-mean: (0.32 + 0.405 + 1.125) / 3 = 0.616667
    values = torch.tensor([[1.5, 1.1, 0.5]], requires_grad=True)
    old, returns = torch.ones(1, 3), torch.full((1, 3), 2.0)
    loss, metrics = value_loss(values, old, returns, torch.ones(1, 3), clip=0.2, agg_mode="token-mean")
    assert loss.item() == pytest.approx(0.616667, abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    # the clipped token has no gradient; others: (v - R) / 3 = -0.3, -0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.9 / 3, -1.5 / 3]]))


def test_value_loss_without_clipping_and_with_a_mask():
    # clip 0: plain 0.5 * (v - R)^2 = 0.5 * 0.25 = 0.125 on the one response token
    values = torch.tensor([[1.5, 99.0]])
    loss, metrics = value_loss(
        values, torch.ones(1, 2), torch.full((1, 2), 2.0), torch.tensor([[1, 0]]), clip=0.0, agg_mode="token-mean"
    )
    assert loss.item() == pytest.approx(0.125)
    assert metrics["value_clip_frac"] == 0.0
    assert metrics["value_mean"] == pytest.approx(1.5)


# -- DPO ----------------------------------------------------------------------


def test_dpo_at_equal_log_probs_is_log_2():
    # margin 0: -log sigmoid(0) = log 2
    zeros = torch.zeros(3)
    loss, metrics = dpo_loss(zeros - 5, zeros - 5, zeros - 5, zeros - 5, beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    assert metrics["reward_accuracy"] == 0.0


def test_dpo_by_hand_and_gradient_direction():
    # beta 0.1: chosen reward 0.1 * (-1 - -2) = 0.1, rejected 0.1 * (-3 - -2) = -0.1, margin 0.2
    # loss = -log sigmoid(0.2) = log(1 + e^-0.2) = 0.598139
    chosen = torch.tensor([-1.0], requires_grad=True)
    rejected = torch.tensor([-3.0], requires_grad=True)
    loss, metrics = dpo_loss(chosen, rejected, torch.tensor([-2.0]), torch.tensor([-2.0]), beta=0.1)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.2)))
    assert metrics == pytest.approx(
        {"reward_chosen": 0.1, "reward_rejected": -0.1, "reward_margin": 0.2, "reward_accuracy": 1.0}
    )
    loss.backward()
    # dL/d chosen = -beta * sigmoid(-0.2) = -0.1 * 0.450166: raising chosen lowers the loss
    assert chosen.grad.item() == pytest.approx(-0.1 / (1 + math.exp(0.2)))
    assert rejected.grad.item() == pytest.approx(0.1 / (1 + math.exp(0.2)))


def test_dpo_rejects_bad_beta_and_shapes():
    x = torch.zeros(2)
    with pytest.raises(ConfigError, match="dpo_beta must be > 0, got 0"):
        dpo_loss(x, x, x, x, beta=0)
    with pytest.raises(OmrlError, match=r"dpo_loss: ref_rejected_logps has shape \(3,\)"):
        dpo_loss(x, x, x, torch.zeros(3), beta=0.1)


# -- log-probs and entropy from logits ---------------------------------------

LN3 = math.log(3.0)


def test_token_log_probs_by_hand():
    # logits [0, ln 3] -> probs [0.25, 0.75]; [0, 0] -> [0.5, 0.5]
    logits = torch.tensor([[[0.0, LN3], [0.0, 0.0]]])
    out = token_log_probs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.5)]]))


def test_entropy_by_hand():
    # uniform over 4: ln 4 = 1.386294
    # [0.25, 0.75]: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -1e9, -1e9]]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[math.log(4), 0.562335]]))


def test_chunked_results_match_the_direct_formulas_and_take_gradients():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5))
    log_probs = token_log_probs(logits, labels, chunk_tokens=4)  # 15 positions: chunks of 4, 4, 4, 3
    entropy = entropy_from_logits(logits, chunk_tokens=4)
    direct = torch.log_softmax(logits, -1)
    torch.testing.assert_close(log_probs, direct.gather(-1, labels[..., None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(direct.exp() * direct).sum(-1))
    (log_probs.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


def test_bfloat16_logits_give_float32():
    logits = torch.zeros(1, 2, 4, dtype=torch.bfloat16)
    assert token_log_probs(logits, torch.zeros(1, 2, dtype=torch.long)).dtype == torch.float32
    assert entropy_from_logits(logits).dtype == torch.float32


def test_logits_shape_errors():
    with pytest.raises(OmrlError, match=r"labels must be logits' shape without V"):
        token_log_probs(torch.zeros(1, 3, 4), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(OmrlError, match=r"logits must be \[bs, T, V\]"):
        entropy_from_logits(torch.zeros(3, 4))
