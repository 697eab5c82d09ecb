"""Rollout corrections: ``fn(data: CorrectionInput, cfg: AlgoConfig) -> (weights, keep, metrics)``.

The tokens were sampled by the rollout's sampler (vLLM, a bf16 model, a server), whose log-probs
differ from the trainer's forward of the same weights (other kernels, precision, caching) and more
so when the sampler's weights are stale. The PPO ratio is taken against the trainer's old
log-probs (the proximal policy); these functions correct for the sampler behind it with the
per-token ratio ``rho_t = exp(old_log_probs_t - sampler_log_probs_t)``:

- ``weights`` [bs, T]: the importance weight each token's loss is multiplied by (detached);
- ``keep`` [bs, T] bool: the tokens left in the loss. A dropped token leaves the loss's
  denominator too: it is not trained, rather than trained with weight 0;
- ``metrics``: ``rollout_weight_mean`` and ``rollout_weight_max``, the mean and the largest of the
  weights applied, over the kept loss tokens (after truncation: never above the cap of a TIS);
  ``rollout_masked_share``, the share of loss tokens dropped.

Positions off ``loss_mask`` get weight 1 and keep False. A token's log ratio is clamped to +-20
before ``exp`` (:meth:`omrl.algos.CorrectionInput.log_ratio`), a sequence's after its tokens' log
ratios are summed, so no weight overflows.
"""

from __future__ import annotations

import torch

from omrl.algos import MAX_CORRECTION_LOG_RATIO, AlgoConfig, CorrectionInput, masked_mean, require_range


def _sequence_log_ratio(data: CorrectionInput) -> tuple[torch.Tensor, torch.Tensor]:
    """(log of each row's product of token ratios, on every position of the row [bs, T]; the mask as
    bool). The row's log ratios are summed unclamped and only the sum is clamped, as verl's
    sequence-level IS does: clamping each token first would turn [25, -24] (a product of e) into 1."""
    _, mask = data.log_ratio()  # checks the shapes
    gap = (data.old_log_probs.detach().float() - data.sampler_log_probs.float()).masked_fill(~mask, 0.0)
    bound = MAX_CORRECTION_LOG_RATIO
    return gap.sum(-1, keepdim=True).clamp(-bound, bound).expand_as(gap), mask


def _result(weights: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor):
    """(the weights, 1 where not kept, detached; keep; the metrics above)."""
    weights = torch.where(keep, weights, 1.0).detach()
    kept = weights[keep]
    metrics = {
        "rollout_weight_mean": float(kept.mean()) if kept.numel() else 1.0,
        "rollout_weight_max": float(kept.max()) if kept.numel() else 1.0,
        "rollout_masked_share": float(masked_mean((~keep).float(), mask)),
    }
    return weights, keep, metrics


def none(data: CorrectionInput, cfg: AlgoConfig):
    """No correction: every weight 1, every loss token kept (the sampler is taken to be the old policy).

    Reads old_log_probs, sampler_log_probs, loss_mask [bs, T] (only their shapes and the mask).
    """
    _, mask = data.log_ratio()
    return _result(torch.ones_like(data.old_log_probs, dtype=torch.float32), mask, mask)


def token_tis(data: CorrectionInput, cfg: AlgoConfig):
    """Token-level truncated importance sampling, TIS (Yao, Liu, Zhang, Yu, Ouyang, Gao 2025, "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site).

    Reads old_log_probs, sampler_log_probs, loss_mask [bs, T]; cfg.rollout_is_cap C (> 0).
    w_t = min(rho_t, C); every loss token kept. Truncation bounds the variance a rare token with a
    large ratio would bring, at the price of a bias towards the sampler.
    """
    cap = require_range(cfg, "rollout_is_cap", 0.0, low_inclusive=False)
    log_ratio, mask = data.log_ratio()
    return _result(torch.exp(log_ratio).clamp(max=cap), mask, mask)


def seq_tis(data: CorrectionInput, cfg: AlgoConfig):
    """Sequence-level truncated importance sampling (the sequence form of TIS, Yao et al. 2025 as
    :func:`token_tis`).

    Reads old_log_probs, sampler_log_probs, loss_mask [bs, T]; cfg.rollout_is_cap C (> 0).
    w_t = min(prod_s rho_s, C) for every token t of the row (the product over the row's loss
    tokens, exp of the clamped sum of their log ratios): the whole episode is weighted as one
    sample. Unbiased before truncation, but the product's variance grows with the episode's length.
    """
    cap = require_range(cfg, "rollout_is_cap", 0.0, low_inclusive=False)
    log_ratio, mask = _sequence_log_ratio(data)
    return _result(torch.exp(log_ratio).clamp(max=cap), mask, mask)


def token_mask(data: CorrectionInput, cfg: AlgoConfig):
    """IcePop: token-level masking of the mismatch (Ling Team 2025, "Every Step Evolves: Scaling
    Reinforcement Learning for Trillion-Scale Thinking Model", the Ring-1T report).

    Reads old_log_probs, sampler_log_probs, loss_mask [bs, T]; cfg.rollout_band_low < cfg.rollout_band_high
    (0.5 and 5.0 in the paper). A token whose rho_t leaves [low, high] is dropped from the loss;
    a kept token is weighted by rho_t.
    """
    low = require_range(cfg, "rollout_band_low", 0.0, 1.0)
    high = require_range(cfg, "rollout_band_high", 1.0)
    log_ratio, mask = data.log_ratio()
    ratio = torch.exp(log_ratio)
    return _result(ratio, mask & (ratio >= low) & (ratio <= high), mask)


def seq_mask(data: CorrectionInput, cfg: AlgoConfig):
    """Sequence-level masked importance sampling, MIS (Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed
    Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch").

    Reads old_log_probs, sampler_log_probs, loss_mask [bs, T]; cfg.rollout_is_cap C (> 0).
    A row whose product prod_s rho_s (exp of the clamped sum of its log ratios) exceeds C is dropped
    whole; a kept row's tokens are weighted by that product. Dropping rather than truncating
    removes the bias truncation brings, and the episodes the sampler saw most differently. (verl's
    ``seq_sum_k1`` rejection takes a lower bound too and drops a row below it; this one keeps such a
    row, at its small weight.)
    """
    cap = require_range(cfg, "rollout_is_cap", 0.0, low_inclusive=False)
    log_ratio, mask = _sequence_log_ratio(data)
    ratio = torch.exp(log_ratio)
    return _result(ratio, mask & (ratio <= cap), mask)
