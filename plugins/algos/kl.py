"""KL estimators: ``fn(log_probs, ref_log_probs) -> kl``, elementwise [bs, T] -> [bs, T].

Each estimates KL(policy || reference) per token from the sampled token's
log-probs only (Schulman, "Approximating KL Divergence", 2020,
http://joschu.net/blog/kl-approx.html). Used as a loss term (reduced with
:func:`omrl.algos.aggregate_loss`) or put into the reward with
:func:`omrl.training.losses.apply_kl_in_reward`.
"""

from __future__ import annotations

import torch

from omrl.algos import require_same_shape

# k3 exponentiates the log ratio: bound it so one far-off token cannot overflow
K3_MAX_LOG_RATIO = 20.0
K3_MAX = 10.0


def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1: the log ratio log p - log p_ref (unbiased, high variance, can be negative). [bs, T] -> [bs, T]."""
    require_same_shape("k1", 2, log_probs=log_probs, ref_log_probs=ref_log_probs)
    return log_probs - ref_log_probs


def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k2 ("mse"): 0.5 * (log p - log p_ref)^2 (biased, low variance, >= 0). [bs, T] -> [bs, T]."""
    require_same_shape("k2", 2, log_probs=log_probs, ref_log_probs=ref_log_probs)
    return 0.5 * (log_probs - ref_log_probs) ** 2


def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 ("low_var_kl"): exp(d) - d - 1 with d = log p_ref - log p (unbiased, low variance, >= 0).

    [bs, T] -> [bs, T]. For stability d is clamped to [-20, 20] and the result to
    at most 10 (as verl does), so a token the reference finds near-impossible
    cannot blow up the loss.
    """
    require_same_shape("k3", 2, log_probs=log_probs, ref_log_probs=ref_log_probs)
    d = (ref_log_probs - log_probs).clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return (torch.exp(d) - d - 1.0).clamp(max=K3_MAX)


def abs_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """abs: |log p - log p_ref| (biased, >= 0; verl's "abs"). [bs, T] -> [bs, T]."""
    require_same_shape("abs", 2, log_probs=log_probs, ref_log_probs=ref_log_probs)
    return (log_probs - ref_log_probs).abs()


def straight_through(estimator):
    """``estimator``'s value with k2's gradient: k2's gradient, (log p - log p_ref) * grad log p, is
    the unbiased gradient of KL(policy || reference) for tokens sampled from the policy, which k1's
    (grad log p, zero in expectation) and k3's are not (Zhang et al. 2025, "On the Design of
    KL-Regularized Policy Gradient Algorithms for LLM Reasoning", arXiv:2505.17508; verl's "+"
    estimators). The reported number stays the chosen estimate."""

    def kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
        value = estimator(log_probs, ref_log_probs)
        gradient = k2(log_probs, ref_log_probs)
        return gradient - gradient.detach() + value.detach()

    return kl


def k1_plus(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1+: k1's value, k2's gradient (straight-through, see :func:`straight_through`). [bs, T] -> [bs, T]."""
    return straight_through(k1)(log_probs, ref_log_probs)


def k3_plus(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3+: k3's value, k2's gradient (straight-through, see :func:`straight_through`). [bs, T] -> [bs, T]."""
    return straight_through(k3)(log_probs, ref_log_probs)
