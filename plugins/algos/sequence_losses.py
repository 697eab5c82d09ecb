"""Policy losses whose importance ratio is one per sequence, not one per token: GSPO and GMPO.
``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``.

A sequence is one row's tokens on ``loss_mask``: in a multi-turn trajectory, the model's tokens
of every turn, the env tokens between the turns left out. Rows without a masked token are no
sequence and never reach the loss. Metrics, floats computed without gradient:

- ``clip_frac``:      GSPO: share of masked tokens whose clipping is active (no gradient through them)
- ``log_ratio_clip_frac``: GMPO: share of masked tokens whose log ratio its pessimistic clip replaced
  by the bound (no gradient through them); not verl's GMPO ``pg_clipfrac``, see :func:`gmpo`
- ``approx_kl``:      mean over the mask of ratio - 1 - log ratio, per-token ratios (Schulman's k3)
- ``ratio_mean``:     mean over the mask of the per-token ratio exp(log_probs - old_log_probs)
- ``seq_ratio_mean``: mean over the sequences of the sequence ratio the loss uses
"""

from __future__ import annotations

import torch

from omrl.algos import AlgoConfig, PolicyLossInput, aggregate, masked_mean, require_range
from omrl_plugins.algos.policy_losses import MAX_LOG_RATIO, masked_inputs, masked_log_probs, ratio_metrics


def _sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per row the mean of ``x`` over its masked tokens, 0 for a row without one [bs]; which
    rows have a masked token [bs] bool)."""
    lengths = mask.sum(-1)
    return (x * mask).sum(-1) / lengths.clamp(min=1), lengths > 0


def gspo(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO, Group Sequence Policy Optimization in its GSPO-token form (Zheng et al. 2025, Qwen,
    arXiv:2507.18071).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.clip_ratio_low (in
    [0, 1]), cfg.clip_ratio_high (>= 0), cfg.loss_agg_mode.

        s_i     = exp(mean over row i's masked tokens of (log_probs - old_log_probs))
        s_{i,t} = sg[s_i] * pi_t / sg[pi_t]       (value s_i; d s_{i,t} = s_i * d log pi_t)
        loss_t  = max(-A_t * s_{i,t}, -A_t * clip(s_{i,t}, 1 - clip_ratio_low, 1 + clip_ratio_high))

    s_i is the length-normalised (geometric-mean) sequence likelihood ratio; sg is stop-gradient.
    log s_{i,t} is clamped to +-MAX_LOG_RATIO (20) before exp, and the clamp stops the gradient: a
    row whose mean log ratio is past +-20 adds a constant to the loss, whatever its advantage's sign
    (verl clamps log s_{i,t} at +10 only, with the same effect above it). Where unclipped, token t's
    gradient is -A_t * s_i * grad log pi_t (times the aggregation's 1/|y_i| / number of sequences
    under seq-mean-token-mean, the paper's normaliser). With one advantage per row (GRPO's), that
    mode makes GSPO-token's loss and gradient those of sequence-level GSPO; other modes weigh the
    sequences differently. Every token of a row shares s_i, so the clip keeps or drops whole rows
    unless the advantage's sign changes within one.

    The paper's clip ranges are 3e-4 (left) and 4e-4 (right), not PPO's 0.2: a sequence ratio
    moves far less than a token's. Set clip_ratio_low=0.0003 clip_ratio_high=0.0004.
    Returns (loss, metrics); ``clip_frac`` is the share of masked tokens clipped.
    """
    low = require_range(cfg, "clip_ratio_low", 0.0, 1.0)
    high = require_range(cfg, "clip_ratio_high", 0.0)
    mask, log_ratio, advantages = masked_inputs(data, "gspo")
    seq_log_ratio, has_tokens = _sequence_mean(log_ratio.detach(), mask)
    log_probs = masked_log_probs(data, mask)
    # value seq_log_ratio, gradient d log_probs_t; clamped after the sum so that a row past the
    # bound has no gradient (as ppo_clip's token and verl's row), not exp(bound) times d log_probs_t
    token_log_ratio = seq_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach()
    ratio = torch.exp(token_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    token_loss = torch.where(mask, torch.maximum(unclipped, clipped), 0.0)
    metrics = ratio_metrics(log_ratio, mask)
    with torch.no_grad():
        metrics["clip_frac"] = float(masked_mean((clipped > unclipped).float(), mask))
        seq_ratio = torch.exp(seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
        metrics["seq_ratio_mean"] = float(masked_mean(seq_ratio, has_tokens))
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def gmpo(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.clip_ratio_low and
    cfg.clip_ratio_high (>= 0), here bounds in log space. GRPO maximises the arithmetic mean of the
    token objectives ratio_t * A; GMPO their geometric mean, which an outlier ratio moves less:

        A_i   = mean of row i's masked advantages (GMPO's advantage is one per sequence)
        l_t   = log_probs_t - old_log_probs_t,  c_t = clip(l_t, -clip_ratio_low, clip_ratio_high)
        l'_t  = min(l_t, c_t) if A_i >= 0 else max(l_t, c_t)    (clipped pessimistically, per token)
        loss_i = -A_i * exp(mean over row i's masked tokens of l'_t)

    then reduced by cfg.loss_agg_mode as if each of row i's tokens had the loss loss_i:
    seq-mean-token-mean gives the paper's mean over sequences (1/G sum_i loss_i), token-mean
    weighs each sequence by its length (micro-batches accumulate to either exactly).

    The clip is in log space, so the ratio range is [e^-clip_ratio_low, e^clip_ratio_high]; the
    paper's is [e^-0.4, e^0.4] (clip_ratio_low=0.4 clip_ratio_high=0.4), much wider than PPO's. The
    mean of l' is clamped to +-MAX_LOG_RATIO before exp (no gradient past it). With
    seq-mean-token-mean, where unclipped, token t's gradient is -A_i * exp(mean l') / |y_i| *
    grad log pi_t, divided by the number of sequences.
    Returns (loss, metrics); ``log_ratio_clip_frac`` is the share of masked tokens whose l' is the
    bound (l_t past it on the side the sign of A_i makes pessimistic: no gradient), and
    ``seq_ratio_mean`` the mean of exp(mean l'). verl's GMPO ``pg_clipfrac`` counts other tokens:
    those with l_t outside [-clip_ratio_low, clip_ratio_high] on either side and A_t > 0
    (``pg_clipfrac_lower``: A_t < 0), whether or not the clip took away their gradient.
    """
    low = require_range(cfg, "clip_ratio_low", 0.0)
    high = require_range(cfg, "clip_ratio_high", 0.0)
    mask, log_ratio, advantages = masked_inputs(data, "gmpo")
    seq_advantages, has_tokens = _sequence_mean(advantages, mask)
    bounded = log_ratio.clamp(-low, high)
    pessimistic = torch.where(
        (seq_advantages >= 0).unsqueeze(-1), torch.minimum(log_ratio, bounded), torch.maximum(log_ratio, bounded)
    )
    pessimistic = torch.where(mask, pessimistic, 0.0)
    seq_log_ratio, _ = _sequence_mean(pessimistic, mask)
    seq_ratio = torch.exp(seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    seq_loss = -seq_advantages * seq_ratio
    loss = aggregate(torch.where(mask, seq_loss.unsqueeze(-1), 0.0), data.loss_mask, cfg)
    metrics = ratio_metrics(log_ratio, mask)
    with torch.no_grad():
        metrics["log_ratio_clip_frac"] = float(masked_mean((pessimistic != log_ratio).float(), mask))
        metrics["seq_ratio_mean"] = float(masked_mean(seq_ratio, has_tokens))
    return loss, metrics
