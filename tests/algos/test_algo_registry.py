"""Every built-in algorithm is registered through the entry point and honours its kind's calling convention."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import LOSS_AGG_MODES, AdvantageInput, AlgoConfig, PolicyLossInput
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


ROW_LOCAL = "zero_advantage_rows_add_nothing"


def mixed_rows() -> PolicyLossInput:
    """Five rows of float64: rows 1 and 3 have advantages all 0 (a group that all got the same reward)."""
    generator = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.float64)
    advantages = torch.randn(5, 1, generator=generator, dtype=torch.float64).expand(5, 4).clone()
    advantages[2, 1] = 0.0  # a zero on one token of a row that learns leaves the row in
    advantages[[1, 3]] = 0.0
    return PolicyLossInput(
        log_probs=(-torch.rand(5, 4, generator=generator, dtype=torch.float64)).requires_grad_(),
        old_log_probs=-torch.rand(5, 4, generator=generator, dtype=torch.float64),
        advantages=advantages * mask,
        loss_mask=mask,
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", algorithms.names("policy_loss"))
def test_a_loss_that_says_zero_advantage_rows_add_nothing_loses_nothing_without_them(name, mode):
    """What the recipe does under the trait (omrl.algos): it runs only the rows that have an advantage,
    weighted as part of the whole batch. For a loss with the trait that gives the loss and gradient of
    every row; the covariance losses, whose penalty reads the whole batch, do not have it and differ."""
    from omrl.algos import micro_batch_share
    from omrl.data import Batch
    from omrl.training.rl_data import rows_that_learn

    component = algorithms.component(name, "policy_loss")
    config = AlgoConfig(loss_agg_mode=mode, loss_norm_tokens=4, kl_cov_ratio=0.5, cov_clip_ratio=0.5, cov_clip_low=-5.0)
    data = mixed_rows()
    tokens, seqs = float(data.loss_mask.sum()), float((data.loss_mask.sum(-1) > 0).sum())
    whole, _ = component.obj(data, config)
    whole = whole * micro_batch_share(mode, data.loss_mask, tokens, seqs)
    (grad,) = torch.autograd.grad(whole, data.log_probs)
    columns = {"advantages": data.advantages, "loss_mask": data.loss_mask, "row": torch.arange(5)}
    kept = rows_that_learn(Batch(columns))["row"].tolist()
    assert kept == [0, 2, 4]
    part = PolicyLossInput(data.log_probs[kept], data.old_log_probs[kept], data.advantages[kept], data.loss_mask[kept])
    alone, _ = component.obj(part, config)
    alone = alone * micro_batch_share(mode, part.loss_mask, tokens, seqs)
    (grad_alone,) = torch.autograd.grad(alone, data.log_probs)
    same = torch.allclose(alone, whole, atol=1e-12) and torch.allclose(grad_alone, grad, atol=1e-12)
    assert same == bool(component.traits.get(ROW_LOCAL)), f"{name} under {mode}"
    if component.traits.get(ROW_LOCAL):
        assert (grad[[1, 3]] == 0).all()


def test_rows_that_learn_keeps_one_row_where_none_has_an_advantage():
    """The optimizer step then still sees the zero gradient it always saw (and the step's metrics have
    tokens to average over); an empty batch stays empty."""
    from omrl.data import Batch
    from omrl.training.rl_data import rows_that_learn

    trained = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])  # sorted: the last row has no token
    rows = Batch({"advantages": torch.zeros(3, 4), "loss_mask": trained, "row": torch.arange(3)})
    assert rows_that_learn(rows)["row"].tolist() == [1]  # the shortest row with a trained token
    empty = Batch({"advantages": torch.zeros(0, 4), "loss_mask": torch.zeros(0, 4)})
    assert len(rows_that_learn(empty)) == 0
