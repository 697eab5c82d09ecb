"""Calling conventions for algorithm plugins, and the small tensor helpers they share.

Every function of one kind has one signature, so the training recipe calls any
of them the same way:

- ``advantage``:   ``fn(data: AdvantageInput, cfg: AlgoConfig) -> (advantages, returns)``,
  both (bs, T) and zero where ``response_mask`` is 0.
- ``policy_loss``: ``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``,
  ``loss`` a scalar tensor, ``metrics`` a dict of floats.
- ``kl``:          ``fn(log_probs, ref_log_probs) -> kl`` elementwise, (bs, T) -> (bs, T).

Shapes: ``bs`` rows (one per trajectory), ``T`` token positions of the trained
sequence, ``K`` the most turns in any row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omrl.errors import ConfigError

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@dataclass
class AlgoConfig:
    """Hyper-parameters the algorithm functions read."""

    gamma: float = field(default=1.0, metadata={"help": "Discount per token (gae) or per turn (gigpo)."})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda."})
    norm_adv_by_std: bool = field(default=True, metadata={"help": "GRPO: divide by the group's std (Dr. GRPO: no)."})
    eps: float = field(default=1e-6, metadata={"help": "Added to denominators."})
    clip_ratio_low: float = field(default=0.2, metadata={"help": "PPO clip: ratio >= 1 - clip_ratio_low."})
    clip_ratio_high: float = field(default=0.2, metadata={"help": "PPO clip: ratio <= 1 + clip_ratio_high (DAPO clip-higher: 0.28)."})
    clip_ratio_c: float = field(default=3.0, metadata={"help": "Dual-clip bound for negative advantages."})
    loss_agg_mode: str = field(default="token-mean", metadata={"help": f"How token losses become one number: {', '.join(LOSS_AGG_MODES)}."})
    gigpo_step_weight: float = field(default=1.0, metadata={"help": "GiGPO: weight of the step-level advantage."})


@dataclass
class AdvantageInput:
    """What an advantage estimator may read. Shapes in brackets.

    token_rewards  [bs, T]  reward placed on response tokens (allocation and any KL-in-reward applied)
    response_mask  [bs, T]  1 on model-generated tokens, 0 elsewhere
    group_ids      [bs]     rows with equal ids are samples of the same task
    values         [bs, T]  critic values (gae only), else None
    turn_index     [bs, T]  index of the model turn each token belongs to, -1 elsewhere
    turn_rewards   [bs, K]  reward of each turn (0 past the last turn)
    turn_state_ids [bs, K]  id of the observation each turn answered (GiGPO anchor states), -1 padding
    """

    token_rewards: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    turn_state_ids: torch.Tensor | None = None


@dataclass
class PolicyLossInput:
    """What a policy loss reads. All [bs, T]."""

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1 (0 when nothing is masked in)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a [bs, T] token loss to a scalar.

    token-mean:          sum over all tokens / number of tokens (DAPO)
    seq-mean-token-sum:  per sequence the token sum, then the mean over sequences (Dr. GRPO)
    seq-mean-token-mean: per sequence the token mean, then the mean over sequences (GRPO paper)
    """
    mask = mask.to(loss.dtype)
    has_tokens = (mask.sum(-1) > 0).to(loss.dtype)
    n_seq = has_tokens.sum().clamp(min=1.0)
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-sum":
        return ((loss * mask).sum(-1) * has_tokens).sum() / n_seq
    if mode == "seq-mean-token-mean":
        return (masked_mean(loss, mask, dim=-1) * has_tokens).sum() / n_seq
    raise ConfigError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
