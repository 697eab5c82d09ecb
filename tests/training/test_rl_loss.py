"""One RL micro-batch's loss: policy loss, entropy bonus, KL penalty and value loss added as configured."""

from __future__ import annotations

import pytest
import torch

from omrl.algos import LOSS_AGG_MODES
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.data import Batch
from omrl.training.losses import figure_weight, policy_gradient_loss
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
    # logged as documented (they were value_value_clip_frac, value_value_mean, value_value_error)
    assert {"value_clip_frac", "value_mean", "value_error"} <= set(parts) and not any("value_value" in k for k in parts)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_a_pass_s_logged_figures_do_not_depend_on_how_it_is_cut_into_micro_batches(mode):
    # 4 rows of uneven lengths (one without a token), cut 1+3 and 2+2: every figure adds up alike
    cfg = load_config(TrainRunConfig, None, [f"algorithm.loss_agg_mode={mode}", "algorithm.loss_norm_tokens=4"])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    rows = {"loss_mask": mask, "old_log_probs": torch.zeros(4, 3), "advantages": torch.tensor([[1.0, 2.0, 3.0]] * 4)}
    out = {"log_probs": torch.zeros(4, 3), "entropy": torch.arange(12.0).view(4, 3)}
    totals = ((5.0, 3.0), (5.0, 3.0))  # (tokens, sequences) of the pass, all of whose rows ran

    def pass_figures(cuts):
        figures: dict[str, float] = {}
        for cut in cuts:
            mb = Batch({k: v[cut] for k, v in rows.items()})
            _, parts = policy_gradient_loss({k: v[cut] for k, v in out.items()}, mb, cfg.algorithm, ppo_clip, k1)
            for key, value in parts.items():
                weight = figure_weight(key, mode, mb["loss_mask"], *totals, 1)
                figures[key] = figures.get(key, 0.0) + weight * value
        return figures

    whole = pass_figures([slice(0, 4)])
    for cuts in ([slice(0, 1), slice(1, 4)], [slice(0, 2), slice(2, 4)]):
        assert pass_figures(cuts) == pytest.approx(whole), cuts
