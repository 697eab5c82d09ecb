"""Policy losses that weigh each token's policy gradient instead of dropping clipped tokens:
CISPO, SAPO and plain REINFORCE. ``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``.

Every token on the mask keeps a gradient; what differs is its weight. Metrics, floats computed
without gradient (as in :mod:`omrl_plugins.algos.policy_losses`):

- ``approx_kl``:  mean over the mask of ratio - 1 - log ratio (Schulman's k3 of KL(old || new))
- ``ratio_mean``: mean over the mask of ratio = exp(log_probs - old_log_probs)
- ``clip_frac``:  CISPO only: share of tokens whose weight was clipped (they keep their gradient)
"""

from __future__ import annotations

import torch

from omrl.algos import AlgoConfig, PolicyLossInput, aggregate, masked_mean, require_range
from omrl_plugins.algos.policy_losses import MAX_LOG_RATIO, masked_inputs, masked_log_probs, ratio_metrics


def cispo(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped importance-sampling-weight policy optimisation (MiniMax 2025, "MiniMax-M1",
    arXiv:2506.13585).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.clip_ratio_low (in
    [0, 1]), cfg.clip_ratio_high (>= 0), cfg.loss_agg_mode.

        w_t    = sg(clip(ratio_t, 1 - clip_ratio_low, 1 + clip_ratio_high))
        loss_t = -w_t * A_t * log_probs_t

    The clipped importance weight is detached (sg: stop-gradient), so the gradient of token t is
    -w_t * A_t * grad log_probs_t: PPO drops a clipped token's gradient, CISPO only bounds its
    weight, and every token (the rare "fork" tokens especially) keeps contributing. The paper sets
    no lower bound in practice (a large epsilon_low) and tunes only the upper one:
    clip_ratio_low=1.0 gives the lower bound 0, i.e. none, as ratios are positive. The paper
    reduces by token-mean (cfg.loss_agg_mode applies). Returns (loss, metrics); metrics add
    ``clip_frac``: the share of tokens whose weight was clipped.
    """
    low = require_range(cfg, "clip_ratio_low", 0.0, 1.0)
    high = require_range(cfg, "clip_ratio_high", 0.0)
    mask, log_ratio, advantages = masked_inputs(data, "cispo")
    ratio = torch.exp(log_ratio.detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    weight = ratio.clamp(1.0 - low, 1.0 + high)
    token_loss = torch.where(mask, -weight * advantages * masked_log_probs(data, mask), 0.0)
    metrics = ratio_metrics(log_ratio, mask)
    metrics["clip_frac"] = float(masked_mean((weight != ratio).float(), mask))
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def sapo(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg.sapo_tau_pos and
    cfg.sapo_tau_neg (both > 0; the paper's defaults 1.0 and 1.05), cfg.loss_agg_mode.
    A smooth, temperature-controlled gate replaces PPO's hard clip:

        tau_t  = sapo_tau_pos if A_t > 0 else sapo_tau_neg
        f(r)   = (4 / tau_t) * sigmoid(tau_t * (r - 1))
        loss_t = -f(ratio_t) * A_t

    Its gradient is -w_t * ratio_t * A_t * grad log_probs_t with w_t = 4 p_t (1 - p_t),
    p_t = sigmoid(tau_t * (ratio_t - 1)): w = 1 at ratio 1 (the ordinary policy gradient
    on-policy), decaying smoothly as the ratio leaves 1, faster for larger tau; the paper takes
    tau_neg > tau_pos because negative advantages spread probability over many unsampled tokens.
    The paper averages tokens per sequence, then sequences (seq-mean-token-mean); cfg.loss_agg_mode
    applies. Returns (loss, metrics); metrics add ``gate_weight_mean``: the mean of w_t.
    """
    tau_pos = require_range(cfg, "sapo_tau_pos", 0.0, low_inclusive=False)
    tau_neg = require_range(cfg, "sapo_tau_neg", 0.0, low_inclusive=False)
    mask, log_ratio, advantages = masked_inputs(data, "sapo")
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    token_loss = torch.where(mask, -(4.0 / tau) * gate * advantages, 0.0)
    metrics = ratio_metrics(log_ratio, mask)
    with torch.no_grad():
        metrics["gate_weight_mean"] = float(masked_mean(4.0 * gate * (1.0 - gate), mask))
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def reinforce(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE, the plain policy gradient (Williams 1992, "Simple statistical gradient-following
    algorithms for connectionist reinforcement learning", Machine Learning 8; no arXiv id).

    Reads log_probs, advantages, loss_mask, all [bs, T] (old_log_probs only for the metrics and
    the shape check); cfg.loss_agg_mode.

        loss_t = -A_t * log_probs_t

    No importance ratio and no clip: the gradient is -A_t * grad log_probs_t, which is the
    on-policy gradient of ppo_clip (ratio 1); off-policy it is biased, as nothing corrects for the
    sampling policy. Returns (loss, metrics); no ``clip_frac``, nothing is clipped.
    """
    mask, log_ratio, advantages = masked_inputs(data, "reinforce")
    token_loss = torch.where(mask, -advantages * masked_log_probs(data, mask), 0.0)
    return aggregate(token_loss, data.loss_mask, cfg), ratio_metrics(log_ratio, mask)
