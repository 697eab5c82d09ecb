"""Losses the recipes compute themselves: the PPO critic's value loss, the DPO loss, the KL
penalty put into rewards, and the whole loss of one policy-gradient micro-batch (which calls
the registered policy-loss and KL plugins)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from omrl.algos import (
    AlgoConfig,
    PolicyLossInput,
    aggregate,
    aggregate_loss,
    masked_mean,
    micro_batch_share,
    require_agg_mode,
    require_same_shape,
)
from omrl.data import Batch
from omrl.errors import ConfigError


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg_mode: str,
    norm_tokens: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO value loss with value clipping (Schulman et al. 2017; as in OpenAI baselines).

    values, old_values, returns, mask [bs, T]. The new value may move at most
    ``clip`` away from the rollout-time value; the loss is the worse of the two:

        clipped_t = old_t + clamp(values_t - old_t, -clip, clip)
        loss_t    = 0.5 * max((values_t - returns_t)^2, (clipped_t - returns_t)^2)

    reduced by ``agg_mode`` (and ``norm_tokens``, see :func:`omrl.algos.aggregate_loss`). ``clip <= 0``
    turns clipping off. Metrics: ``value_clip_frac`` (share of response tokens where
    the clipped term is larger), ``value_mean``, ``value_error`` (mean squared error).
    """
    require_same_shape("value_loss", 2, values=values, old_values=old_values, returns=returns, mask=mask)
    require_agg_mode(agg_mode)
    keep = mask.bool()
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip > 0:
        old = old_values.detach()
        clipped_values = old + (values - old).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
    else:
        clipped = unclipped
    token_loss = torch.where(keep, 0.5 * torch.maximum(unclipped, clipped), 0.0)
    with torch.no_grad():
        metrics = {
            "value_clip_frac": float(masked_mean((clipped > unclipped).float(), keep)),
            "value_mean": float(masked_mean(values, keep)),
            "value_error": float(masked_mean(unclipped, keep)),
        }
    return aggregate_loss(token_loss, mask, agg_mode, norm_tokens), metrics


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290).

    All inputs [bs]: each sequence's summed log-probs over its response tokens.
    The implicit reward of a response is beta * (log pi - log pi_ref); the loss is
    -log sigmoid(reward_chosen - reward_rejected), averaged over pairs. At equal
    log-probs it is log 2. Metrics: ``reward_chosen``, ``reward_rejected``,
    ``reward_margin`` (means) and ``reward_accuracy`` (share of pairs with
    reward_chosen > reward_rejected).
    """
    require_same_shape(
        "dpo_loss",
        1,
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    if beta <= 0:
        raise ConfigError(f"dpo_beta must be > 0, got {beta}")
    reward_chosen = beta * (policy_chosen_logps - ref_chosen_logps.detach())
    reward_rejected = beta * (policy_rejected_logps - ref_rejected_logps.detach())
    margin = reward_chosen - reward_rejected
    loss = -F.logsigmoid(margin).mean()
    with torch.no_grad():
        metrics = {
            "reward_chosen": float(reward_chosen.mean()),
            "reward_rejected": float(reward_rejected.mean()),
            "reward_margin": float(margin.mean()),
            "reward_accuracy": float((margin > 0).float().mean()),
        }
    return loss, metrics


def apply_kl_in_reward(
    token_rewards: torch.Tensor, kl: torch.Tensor, loss_mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """KL-in-reward: token_rewards - coef * kl on response tokens, unchanged elsewhere.

    All [bs, T]; ``kl`` from a registered KL estimator. The penalty is a reward,
    not a loss: ``kl`` is detached. Returns a new float32 tensor.
    """
    require_same_shape("apply_kl_in_reward", 2, token_rewards=token_rewards, kl=kl, loss_mask=loss_mask)
    penalty = torch.where(loss_mask.bool(), coef * kl.detach().float(), 0.0)
    return token_rewards.float() - penalty


def policy_gradient_loss(
    out: dict[str, torch.Tensor], mb: Batch, algo: AlgoConfig, policy_loss_fn: Callable, kl_fn: Callable
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, its parts as floats) of one policy-gradient micro-batch: the registered policy
    loss, minus the entropy bonus, plus the KL penalty to the reference (unless it went into the
    rewards) and the critic's value loss, each weighted as ``algo`` says.

    ``out`` is the policy's forward on ``mb`` (:func:`omrl.training.policy.policy_forward`):
    log_probs and entropy [bs, L], and values [bs, L] when there is a critic. ``mb`` holds
    loss_mask, old_log_probs and advantages [bs, L], plus ref_log_probs when there is a
    reference model, values and returns when there is a critic, and rollout_weights when a rollout
    correction weighs the tokens (:mod:`omrl.training.rollout_correction`). Those weights (>= 0)
    multiply the advantages, which weighs each token's loss for every policy loss that scales
    with its advantage token by token (max(-A w r, -A w clip(r)) = w max(-A r, -A clip(r)): all the
    built-ins but gmpo, which averages w A over a sequence, and kl_cov's penalty term, which has no A).
    """
    mask = mb["loss_mask"]
    agg = algo.loss_agg_mode
    advantages = mb["advantages"] * mb["rollout_weights"] if "rollout_weights" in mb.tensors else mb["advantages"]
    loss, parts = policy_loss_fn(PolicyLossInput(out["log_probs"], mb["old_log_probs"], advantages, mask), algo)
    parts = {f"pg_{k}": float(v) for k, v in parts.items()}
    parts["pg_loss"] = loss.item()
    entropy = aggregate(out["entropy"], mask, algo)
    parts["entropy"] = entropy.item()
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * entropy
    if "ref_log_probs" in mb.tensors:
        per_token = kl_fn(out["log_probs"], mb["ref_log_probs"])
        kl = aggregate(per_token, mask, algo)
        parts["kl"] = kl.item()
        parts["kl_token_mean"] = float(masked_mean(per_token.detach(), mask))  # what adaptive KL steers
        if not algo.kl_in_reward:  # in the reward, it already shaped the advantages
            loss = loss + algo.kl_coef * kl
    if "values" in out:
        v_loss, v_parts = value_loss(
            out["values"], mb["values"], mb["returns"], mask, algo.value_clip, agg, algo.loss_norm_tokens
        )
        loss = loss + algo.value_coef * v_loss
        parts.update(v_parts, value_loss=v_loss.item())  # named value_* already
    parts["loss"] = loss.item()
    return loss, parts


# the figures of policy_gradient_loss that loss_agg_mode aggregates; the others are token means or fractions
MODE_AGGREGATED = frozenset({"loss", "pg_loss", "entropy", "kl", "value_loss"})


def figure_weight(
    key: str, mode: str, mb_mask: torch.Tensor, every: tuple[float, float], ran: tuple[float, float], minis: int
) -> float:
    """The weight of one micro-batch's figure ``key`` (from :func:`policy_gradient_loss`) in the figure
    logged for one pass of ``minis`` mini-batches, so that no figure moves with the micro-batch size.

    ``every`` is the (tokens, sequences) trained in the pass and ``ran`` those of the rows that ran,
    on all processes: loss and pg_loss cover every token (a row left out adds 0), the other figures
    the rows that ran. A figure ``mode`` aggregates weighs as its gradient does
    (:func:`omrl.algos.micro_batch_share`), token-sum's sums averaged over the mini-batches; the rest
    weigh by tokens."""
    tokens, seqs = every if key in ("loss", "pg_loss") else ran
    mode = mode if key in MODE_AGGREGATED else "token-mean"
    return micro_batch_share(mode, mb_mask, tokens, seqs) / (minis if mode == "token-sum" else 1)
