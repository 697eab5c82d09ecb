"""One RL micro-batch's loss: policy loss, entropy bonus, KL penalty and value loss added as configured."""

from __future__ import annotations

import pytest
import torch

from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.data import Batch
from omrl.training.losses import policy_gradient_loss
from omrl_plugins.algos.kl import k1
from omrl_plugins.algos.policy_losses import ppo_clip


def _micro_batch(**extra) -> Batch:
    # 1 row, 3 tokens; token 0 is a prompt token (mask 0)
    return Batch(
        {
            "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]),
            "old_log_probs": torch.tensor([[0.0, -1.0, -2.0]]),
            "advantages": torch.tensor([[0.0, 1.0, -1.0]]),
            **extra,
        }
    )


def _out(**extra) -> dict[str, torch.Tensor]:
    return {
        "log_probs": torch.tensor([[0.0, -1.0, -2.0]]),  # ratio 1: the surrogate is -A, token-mean 0
        "entropy": torch.tensor([[9.0, 2.0, 4.0]]),
        **extra,
    }


def test_entropy_bonus_and_kl_penalty_are_added_with_their_coefficients():
    cfg = load_config(TrainRunConfig, None, ["algorithm.entropy_coef=0.1", "algorithm.kl_coef=0.5"])
    mb = _micro_batch(ref_log_probs=torch.tensor([[0.0, -1.5, -1.0]]))
    loss, parts = policy_gradient_loss(_out(), mb, cfg.algorithm, ppo_clip, k1)
    # pg: token-mean of -A = (-1 + 1) / 2 = 0; entropy: (2 + 4) / 2 = 3; k1 = logp - ref: (0.5 + -1) / 2 = -0.25
    assert parts["pg_loss"] == pytest.approx(0.0)
    assert parts["entropy"] == pytest.approx(3.0) and parts["kl"] == pytest.approx(-0.25)
    assert loss.item() == pytest.approx(0.0 - 0.1 * 3.0 + 0.5 * -0.25) == parts["loss"]


def test_kl_in_the_reward_is_reported_but_not_added_to_the_loss():
    cfg = load_config(TrainRunConfig, None, ["algorithm.kl_coef=0.5", "algorithm.kl_in_reward=true"])
    mb = _micro_batch(ref_log_probs=torch.tensor([[0.0, -1.5, -1.0]]))
    loss, parts = policy_gradient_loss(_out(), mb, cfg.algorithm, ppo_clip, k1)
    assert parts["kl"] == pytest.approx(-0.25) and loss.item() == pytest.approx(0.0)


def test_a_critic_adds_its_weighted_value_loss():
    cfg = load_config(TrainRunConfig, None, ["algorithm.value_coef=0.5", "algorithm.value_clip=0"])
    mb = _micro_batch(values=torch.zeros(1, 3), returns=torch.tensor([[0.0, 2.0, 0.0]]))
    loss, parts = policy_gradient_loss(_out(values=torch.tensor([[5.0, 1.0, 0.0]])), mb, cfg.algorithm, ppo_clip, k1)
    # unclipped value loss: 0.5 * token-mean of (V - R)^2 = 0.5 * (1 + 0) / 2 = 0.25
    assert parts["value_loss"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(0.5 * 0.25)
