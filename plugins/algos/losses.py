"""Losses the recipes call directly: the PPO critic's value loss and the DPO loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omrl.algos import aggregate_loss, masked_mean
from omrl.errors import ConfigError
from omrl_plugins.algos.checks import require_agg_mode, require_same_shape


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, agg_mode: str) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO value loss with value clipping (Schulman et al. 2017; as in OpenAI baselines).

    values, old_values, returns, mask [bs, T]. The new value may move at most
    ``clip`` away from the rollout-time value; the loss is the worse of the two:

        clipped_t = old_t + clamp(values_t - old_t, -clip, clip)
        loss_t    = 0.5 * max((values_t - returns_t)^2, (clipped_t - returns_t)^2)

    reduced by ``agg_mode`` (see :func:`omrl.algos.aggregate_loss`). ``clip <= 0``
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
    return aggregate_loss(token_loss, mask, agg_mode), metrics


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290).

    All inputs [bs]: each sequence's summed log-probs over its response tokens.
    The implicit reward of a response is beta * (log pi - log pi_ref); the loss is
    -log sigmoid(reward_chosen - reward_rejected), averaged over pairs. At equal
    log-probs it is log 2. Metrics: ``reward_chosen``, ``reward_rejected``,
    ``reward_margin`` (means) and ``reward_accuracy`` (share of pairs with
    reward_chosen > reward_rejected).
    """
    require_same_shape("dpo_loss", 1, policy_chosen_logps=policy_chosen_logps,
                       policy_rejected_logps=policy_rejected_logps, ref_chosen_logps=ref_chosen_logps,
                       ref_rejected_logps=ref_rejected_logps)
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
