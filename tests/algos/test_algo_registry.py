"""Every built-in algorithm is registered through the entry point and honours its kind's calling convention."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AdvantageInput, AlgoConfig, PolicyLossInput
from omrl.errors import UnknownNameError
from omrl.registry import algorithms

ADVANTAGES = ["dr_grpo", "gae", "gigpo", "grpo", "reinforce_plus_plus", "rloo", "tree_grpo"]
POLICY_LOSSES = ["clip_higher", "dual_clip", "ppo_clip"]
KL_ESTIMATORS = ["k1", "k2", "k3"]
CORRECTIONS = ["none", "seq_mask", "seq_tis", "token_mask", "token_tis"]


@pytest.mark.parametrize(
    "kind, names",
    [
        ("advantage", ADVANTAGES),
        ("policy_loss", POLICY_LOSSES),
        ("kl", KL_ESTIMATORS),
        ("rollout_correction", CORRECTIONS),
    ],
)
def test_builtins_are_listed_with_a_docstring(kind, names):
    assert set(names) <= set(algorithms.names(kind))
    for name in names:
        component = algorithms.component(name, kind)
        assert component.distribution == "omrl"
        assert "[bs" in (component.obj.__doc__ or ""), f"{name}'s docstring gives no tensor shapes"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as info:
        algorithms.get("gpro", kind="advantage")
    message = str(info.value)
    assert "Did you mean 'grpo'?" in message
    assert all(name in message for name in ADVANTAGES)


def full_advantage_input() -> AdvantageInput:
    """Two tasks x two samples, two turns each, with env tokens between the turns and right padding."""
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0], [0, 1, 0, 0, 1, 0, 0], [0, 1, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 0, 0]])
    turn_index = torch.where(mask.bool(), (torch.arange(7) >= 3).long().expand(4, 7), -1)
    rewards = torch.zeros(4, 7)
    rewards[[0, 1, 2, 3], [5, 4, 6, 1]] = torch.tensor([1.0, 0.0, 0.5, 1.0])
    return AdvantageInput(
        token_rewards=rewards,
        loss_mask=mask,
        group_ids=torch.tensor([0, 0, 1, 1]),
        values=torch.randn(4, 7),
        turn_index=turn_index,
        turn_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [1.0, 0.0]]),
        turn_state_ids=torch.tensor([[3, 4], [3, 5], [6, 7], [6, -1]]),
    )


@pytest.mark.parametrize("name", ADVANTAGES)
def test_every_estimator_gives_bs_by_T_zero_off_the_mask(name):
    data = full_advantage_input()
    advantages, returns = algorithms.get(name, kind="advantage")(data, AlgoConfig(gamma=0.9, lam=0.95))
    off_mask = ~data.loss_mask.bool()
    for out in (advantages, returns):
        assert out.shape == (4, 7) and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        assert out[off_mask].eq(0).all()
    assert advantages.abs().sum() > 0


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_every_policy_loss_gives_a_scalar_with_finite_gradients(name):
    torch.manual_seed(0)
    log_probs = (-torch.rand(3, 5)).requires_grad_()
    data = PolicyLossInput(
        log_probs=log_probs,
        old_log_probs=-torch.rand(3, 5),
        advantages=torch.randn(3, 5),
        loss_mask=torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]]),
    )
    loss, metrics = algorithms.get(name, kind="policy_loss")(data, AlgoConfig())
    assert loss.dim() == 0
    loss.backward()
    assert torch.isfinite(log_probs.grad).all() and log_probs.grad.abs().sum() > 0
    assert {"clip_frac", "approx_kl", "ratio_mean"} <= set(metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", KL_ESTIMATORS)
def test_every_kl_estimator_is_elementwise_and_zero_at_equal_log_probs(name):
    estimator = algorithms.get(name, kind="kl")
    log_probs = torch.tensor([[-0.5, -2.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-0.7, -1.0, -1.0]])
    kl = estimator(log_probs, ref)
    assert kl.shape == (1, 3) and kl[0, 2] == 0.0
    kl.sum().backward()
    assert torch.isfinite(log_probs.grad).all()
