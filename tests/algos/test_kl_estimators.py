"""KL estimators and KL-in-reward on known numbers."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.errors import OmrlError
from omrl.training.losses import apply_kl_in_reward
from omrl_plugins.algos.kl import abs_kl, k1, k1_plus, k2, k3, k3_plus

LN2 = math.log(2.0)  # 0.693147


def test_estimators_on_known_numbers():
    # token 0: log p = 0, log p_ref = ln 0.5 = -0.693147; token 1: equal log-probs
    log_probs = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-LN2, -1.0]])
    # k1 = 0 - (-0.693147) = 0.693147
    torch.testing.assert_close(k1(log_probs, ref), torch.tensor([[LN2, 0.0]]))
    # k2 = 0.5 * 0.693147^2 = 0.240227
    torch.testing.assert_close(k2(log_probs, ref), torch.tensor([[0.240227, 0.0]]))
    # k3: d = ref - logp = -0.693147, exp(d) = 0.5 -> 0.5 + 0.693147 - 1 = 0.193147
    torch.testing.assert_close(k3(log_probs, ref), torch.tensor([[0.193147, 0.0]]))


def test_k1_can_be_negative_k2_k3_cannot():
    log_probs, ref = torch.tensor([[-2.0]]), torch.tensor([[-1.0]])
    assert k1(log_probs, ref).item() == pytest.approx(-1.0)
    assert k2(log_probs, ref).item() == pytest.approx(0.5)
    # d = 1: e - 1 - 1 = 0.718282
    assert k3(log_probs, ref).item() == pytest.approx(math.e - 2)


def test_k3_is_clamped_and_keeps_finite_gradients():
    # d = 50 would give exp(50) ~ 5e21; clamped to 10 (and d to 20 before exp)
    log_probs = torch.tensor([[-60.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-10.0, -0.5]])
    kl = k3(log_probs, ref)
    assert kl[0, 0].item() == 10.0
    kl.sum().backward()
    assert torch.isfinite(log_probs.grad).all()
    # unclamped token: d/dlogp (exp(ref - logp) - (ref - logp) - 1) = -exp(-0.5) + 1 = 0.393469
    assert log_probs.grad[0, 1].item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)


def test_kl_in_reward_subtracts_on_response_tokens_only():
    # rewards [0, 0, 1, 2] with the last token masked, kl [0.1, 0.2, 0.3, 0.4], coef 0.5:
    # [0 - 0.05, 0 - 0.1, 1 - 0.15, 2 (unchanged)]
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4]], requires_grad=True)
    out = apply_kl_in_reward(torch.tensor([[0.0, 0.0, 1.0, 2.0]]), kl, torch.tensor([[1, 1, 1, 0]]), 0.5)
    torch.testing.assert_close(out, torch.tensor([[-0.05, -0.1, 0.85, 2.0]]))
    assert not out.requires_grad


def test_shape_mismatch_is_reported():
    with pytest.raises(OmrlError, match=r"k3: ref_log_probs has shape \(2, 2\)"):
        k3(torch.zeros(2, 3), torch.zeros(2, 2))


def test_abs_is_the_absolute_log_ratio():
    log_probs, ref = torch.tensor([[-2.0, -1.0, -0.5]]), torch.tensor([[-1.0, -1.5, -0.5]])
    torch.testing.assert_close(abs_kl(log_probs, ref), torch.tensor([[1.0, 0.5, 0.0]]))


@pytest.mark.parametrize(("name", "estimator", "plain"), [("k1+", k1_plus, k1), ("k3+", k3_plus, k3)])
def test_straight_through_keeps_the_value_and_takes_k2s_gradient(name, estimator, plain):
    # the value is the plain estimate; d(value)/d(log p) is k2's: log p - log p_ref, token by token
    log_probs = torch.tensor([[-2.0, -1.0, -0.25]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, -1.5, -0.25]], dtype=torch.float64)
    value = estimator(log_probs, ref)
    torch.testing.assert_close(value, plain(log_probs, ref), msg=name)
    value.sum().backward()
    by_hand = [lp - r for lp, r in zip([-2.0, -1.0, -0.25], [-1.0, -1.5, -0.25])]  # d/dlp of 0.5 (lp - r)^2
    torch.testing.assert_close(log_probs.grad, torch.tensor([by_hand], dtype=torch.float64), msg=name)


def test_straight_through_gradient_is_kls_on_policy():
    # over a whole (tiny) vocabulary, sum_x q(x) * grad k2(x) = grad KL(q || p) exactly, while the
    # plain k1's expected gradient is 0 and k3's is not KL's
    logits = torch.tensor([0.3, -0.2, 1.1], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.4], dtype=torch.float64), -1)
    log_q = torch.log_softmax(logits, -1)
    true_kl = (log_q.exp() * (log_q - ref)).sum()
    (true_grad,) = torch.autograd.grad(true_kl, logits, retain_graph=True)
    weights = log_q.exp().detach()  # samples x ~ q: each token weighted by its probability, not differentiated
    for estimator in (k1_plus, k3_plus):
        expected = (weights * estimator(log_q[None], ref[None])[0]).sum()
        (grad,) = torch.autograd.grad(expected, logits, retain_graph=True)
        torch.testing.assert_close(grad, true_grad)
    (k1_grad,) = torch.autograd.grad((weights * k1(log_q[None], ref[None])[0]).sum(), logits, retain_graph=True)
    torch.testing.assert_close(k1_grad, torch.zeros(3, dtype=torch.float64))
