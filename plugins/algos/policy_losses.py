"""Policy losses: ``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``.

``loss`` is a scalar tensor (token losses reduced by cfg.loss_agg_mode through
:func:`omrl.algos.aggregate`); ``metrics`` holds floats:

- ``clip_frac``:  share of response tokens whose ratio clipping is active (no gradient)
- ``approx_kl``:  KL(old || new) estimated as mean(ratio - 1 - log ratio) (Schulman's k3)
- ``ratio_mean``: mean of ratio = exp(log_probs - old_log_probs)

Masked-out positions never reach the loss or its gradient, even when their
log-probs are garbage (padding, -inf).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import torch

from omrl.algos import (
    AlgoConfig,
    PolicyLossInput,
    aggregate,
    masked_mean,
    require_agg_mode,
    require_range,
    require_same_shape,
)

CLIP_HIGHER_MIN = 0.28  # DAPO's upper clip range
_RAISED: set[float] = set()  # the clip_ratio_high values warned of as raised


@functools.cache
def _default_high(config_class: type) -> float:
    """The default clip_ratio_high (ppo_clip's): clip_higher raises it without a word, as it is not the user's."""
    return config_class().clip_ratio_high


# exp() of a larger log-ratio overflows float32; such a token is clipped anyway
MAX_LOG_RATIO = 20.0


def masked_inputs(data: PolicyLossInput, fn_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the four [bs, T] shapes; return (mask as bool, log ratio = log_probs - old_log_probs
    (old detached), advantages (detached)), both 0 off the mask and not yet clamped.

    ``torch.where`` runs before any arithmetic that could meet the garbage (-inf, NaN) that
    padding and env tokens may hold, so it never reaches a loss or a gradient.
    """
    require_same_shape(
        fn_name,
        2,
        log_probs=data.log_probs,
        old_log_probs=data.old_log_probs,
        advantages=data.advantages,
        loss_mask=data.loss_mask,
    )
    mask = data.loss_mask.bool()
    log_ratio = torch.where(mask, data.log_probs - data.old_log_probs.detach(), 0.0)
    advantages = torch.where(mask, data.advantages.detach(), 0.0)
    return mask, log_ratio, advantages


def masked_log_probs(data: PolicyLossInput, mask: torch.Tensor) -> torch.Tensor:
    """``data.log_probs`` on the mask, 0 off it (a loss may multiply by it safely)."""
    return torch.where(mask, data.log_probs, 0.0)


def ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``approx_kl`` and ``ratio_mean`` of the per-token ratios, as floats."""
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = torch.exp(log_ratio)
        return {
            "approx_kl": float(masked_mean(ratio - 1.0 - log_ratio, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
        }


def clipped_surrogate(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped token losses [bs, T] (0 off the mask) and the metrics above.

    loss_t = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - clip_ratio_low, 1 + clip_ratio_high))
    """
    mask, log_ratio, advantages = masked_inputs(data, "policy loss")
    low = require_range(cfg, "clip_ratio_low", 0.0, 1.0)
    high = require_range(cfg, "clip_ratio_high", 0.0)
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    token_loss = torch.where(mask, torch.maximum(unclipped, clipped), 0.0)
    metrics = {"clip_frac": float(masked_mean((clipped > unclipped).float(), mask)), **ratio_metrics(log_ratio, mask)}
    return token_loss, metrics


def ppo_clip(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate objective (Schulman et al. 2017, arXiv:1707.06347).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T];
    cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.loss_agg_mode.
    loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)),
    reduced to a scalar by cfg.loss_agg_mode. Returns (loss, metrics).
    """
    token_loss, metrics = clipped_surrogate(data, cfg)
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def dual_clip(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games", arXiv:1912.09729).

    Reads log_probs, old_log_probs, advantages, loss_mask, all [bs, T]; cfg as
    ppo_clip plus cfg.clip_ratio_c (> 1). For a negative advantage the PPO loss
    -A * ratio grows without bound as the ratio grows; dual clip caps it at
    clip_ratio_c * |A|. Positive advantages are handled as in ppo_clip.
    Metrics add ``dual_clip_frac``: share of response tokens at that cap.
    """
    require_agg_mode(cfg.loss_agg_mode)
    cap = require_range(cfg, "clip_ratio_c", 1.0, low_inclusive=False)
    token_loss, metrics = clipped_surrogate(data, cfg)
    mask = data.loss_mask.bool()
    advantages = torch.where(mask, data.advantages.detach(), 0.0)
    bound = -advantages * cap  # positive where the advantage is negative
    capped = (advantages < 0) & (token_loss > bound)
    token_loss = torch.where(capped, bound, token_loss)
    metrics["dual_clip_frac"] = float(masked_mean(capped.float(), mask))
    return aggregate(token_loss, data.loss_mask, cfg), metrics


def clip_higher(data: PolicyLossInput, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip with a raised upper bound, DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476).

    Reads the same [bs, T] inputs as ppo_clip. The math is ppo_clip's with
    decoupled low/high ranges; this variant only makes sure the upper range is at
    least 0.28 (DAPO's value): clip_ratio_high = max(cfg.clip_ratio_high, 0.28),
    which leaves low-probability tokens room to grow and keeps entropy from
    collapsing. Returns (loss, metrics) as ppo_clip.
    """
    high = cfg.clip_ratio_high
    if high < CLIP_HIGHER_MIN and high not in _RAISED and high != _default_high(type(cfg)):  # said once, if asked
        _RAISED.add(cfg.clip_ratio_high)
        warnings.warn(
            f"algorithm.clip_ratio_high={cfg.clip_ratio_high:g} is raised to {CLIP_HIGHER_MIN} by "
            f"algorithm.policy_loss=clip_higher (DAPO's least upper range); ppo_clip takes it as it is",
            stacklevel=2,
        )
    raised = dataclasses.replace(cfg, clip_ratio_high=max(cfg.clip_ratio_high, CLIP_HIGHER_MIN))
    return ppo_clip(data, raised)
