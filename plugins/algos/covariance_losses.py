"""Policy losses that hold back the tokens driving entropy collapse: Clip-Cov and KL-Cov.
``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``.

Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv:2505.22617) show that a policy-gradient step lowers the entropy by about the covariance
between a token's log-probability and its advantage, so a few high-covariance tokens (confident
and rewarded) make the entropy collapse. Both losses measure, for every masked token,

    cov_t = (A_t - mean A) * (log_probs_t - mean log_probs)

(the means over all masked tokens of the batch the loss sees, everything detached) and restrain
the gradient of a small share of tokens. The batch the loss sees is a micro-batch: unlike every
other loss, these two do not add up over micro-batches to the mini-batch's loss, as the means and
the share of tokens they single out are the micro-batch's own. Metrics, floats computed without
gradient: ``approx_kl`` and ``ratio_mean`` of the per-token ratios (as ppo_clip's), and the share
of masked tokens each method singled out (``cov_clip_frac``, ``kl_cov_frac``).
"""

from __future__ import annotations

import math

import torch

from omrl.algos import AlgoConfig, PolicyLossInput, aggregate, masked_mean, require_range
from omrl_plugins.algos.policy_losses import MAX_LOG_RATIO, masked_inputs, masked_log_probs, ratio_metrics


def token_covariance(advantages: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cov_t [bs, T] as above, detached; -inf off the mask (so that it is never selected)."""
    with torch.no_grad():
        centred_advantages = advantages - masked_mean(advantages, mask)
        centred_log_probs = log_probs - masked_mean(log_probs, mask)
        return torch.where(mask, centred_advantages * centred_log_probs, -math.inf)


def _share(cfg: AlgoConfig, name: str, n_tokens: int) -> int:
    """max(1, int(cfg.<name> * n_tokens)) tokens, at most n_tokens."""
    return min(n_tokens, max(1, int(getattr(cfg, name) * n_tokens)))


def clip_cov(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO's clipped loss with the gradient of a few random high-covariance tokens cut
    (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv:2505.22617).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.clip_ratio_low,
    cfg.clip_ratio_high (as ppo_clip), cfg.cov_clip_ratio (in (0, 1]), cfg.cov_clip_low,
    cfg.cov_clip_high (>= cov_clip_low), cfg.loss_agg_mode.

        loss_t = 0                                                            if t in I_clip
                 max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high))  else
        I_clip = max(1, int(cov_clip_ratio * N)) tokens drawn uniformly without replacement from
                 the masked tokens with cov_clip_low <= cov_t <= cov_clip_high whose PPO clip is
                 not active (all of them when fewer)

    N is the number of masked tokens; the defaults are the authors' code's (and verl's):
    cov_clip_ratio 2e-4, bounds [1, 5]. The draw is torch.randperm over the candidates in
    row-major order, on torch's global CPU RNG: a seeded run draws the same tokens. As in the
    authors' implementation (and verl's clip_cov), tokens whose PPO clip is already active are
    no candidates: their gradient is already 0, and the budget goes to tokens that still have
    one. The paper writes the surrogate without PPO's clip (r_t * A_t); its implementation keeps
    the clip, and so does this one. Returns (loss, metrics); metrics add ppo_clip's
    ``clip_frac`` and ``cov_clip_frac`` (share of masked tokens cut).
    """
    low = require_range(cfg, "clip_ratio_low", 0.0, 1.0)
    high = require_range(cfg, "clip_ratio_high", 0.0)
    require_range(cfg, "cov_clip_ratio", 0.0, 1.0, low_inclusive=False)
    cov_low = require_range(cfg, "cov_clip_low", -math.inf)
    cov_high = require_range(cfg, "cov_clip_high", cov_low)
    mask, log_ratio, advantages = masked_inputs(data, "clip_cov")
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    ppo_clipped = clipped > unclipped
    cov = token_covariance(advantages, masked_log_probs(data, mask), mask)
    candidates = (mask & ~ppo_clipped & (cov >= cov_low) & (cov <= cov_high)).flatten().nonzero().squeeze(-1)
    cut = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    n_tokens = int(mask.sum())
    if len(candidates) and n_tokens:
        order = torch.randperm(len(candidates)).to(candidates.device)
        cut[candidates[order[: _share(cfg, "cov_clip_ratio", n_tokens)]]] = True
    cut = cut.view_as(mask)
    token_loss = torch.where(mask & ~cut, torch.maximum(unclipped, clipped), 0.0)
    metrics = ratio_metrics(log_ratio, mask)
    with torch.no_grad():
        metrics["clip_frac"] = float(masked_mean(ppo_clipped.float(), mask))
        metrics["cov_clip_frac"] = float(masked_mean(cut.float(), mask))
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def kl_cov(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: the policy gradient with a KL penalty on the highest-covariance tokens (Cui et al.
    2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv:2505.22617).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.kl_cov_ratio (in
    (0, 1]), cfg.kl_cov_coef (>= 0), cfg.loss_agg_mode.

        loss_t = -A_t * r_t + kl_cov_coef * |log_probs_t - old_log_probs_t|   if t in I_KL
                 -A_t * r_t                                                    else
        I_KL   = the k = max(1, int(kl_cov_ratio * N)) masked tokens of largest cov_t

    r_t = exp(log_probs_t - old_log_probs_t), N the number of masked tokens. There is no ratio
    clip: the paper's KL-Cov loss is r_t * A_t for the other tokens, and its implementation (as
    verl's kl_cov) agrees; the penalty is its per-token KL(old || new), taken as |log ratio|.
    Defaults: kl_cov_ratio 2e-3 and kl_cov_coef 1.0; verl 0.9.1's are 2e-4 and 0.1 (ppo_kl_coef).
    Ties in cov are broken by torch.topk. Returns (loss, metrics); metrics add ``kl_cov_frac``
    (share of masked tokens penalised); no ``clip_frac``, as nothing is clipped.
    """
    require_range(cfg, "kl_cov_ratio", 0.0, 1.0, low_inclusive=False)
    coef = require_range(cfg, "kl_cov_coef", 0.0)
    mask, log_ratio, advantages = masked_inputs(data, "kl_cov")
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    policy_gradient = -advantages * ratio
    penalised = policy_gradient + coef * log_ratio.abs()
    cov = token_covariance(advantages, masked_log_probs(data, mask), mask)
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    n_tokens = int(mask.sum())
    if n_tokens:
        selected[torch.topk(cov.flatten(), _share(cfg, "kl_cov_ratio", n_tokens)).indices] = True
    selected = selected.view_as(mask)
    token_loss = torch.where(mask, torch.where(selected, penalised, policy_gradient), 0.0)
    metrics = ratio_metrics(log_ratio, mask)
    metrics["kl_cov_frac"] = float(masked_mean(selected.float(), mask))
    return aggregate(token_loss, data.loss_mask, cfg), metrics
