"""The loss of one RL micro-batch: the policy loss plus the entropy bonus, the KL penalty to the
reference model and the critic's value loss, each as the config asks."""

from __future__ import annotations

from typing import Callable

import torch

from omrl.algos import PolicyLossInput, aggregate_loss
from omrl.data import Batch
from omrl.options import TrainRunConfig
from omrl_plugins.algos import value_loss


def policy_gradient_loss(out: dict[str, torch.Tensor], mb: Batch, cfg: TrainRunConfig,
                         policy_loss_fn: Callable, kl_fn: Callable) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, its parts as floats) for micro-batch ``mb``.

    ``out`` is the policy's forward on ``mb`` (:func:`omrl.training.policy.policy_forward`):
    log_probs and entropy [bs, L], and values [bs, L] when there is a critic. ``mb`` holds
    response_mask, old_log_probs and advantages [bs, L], plus ref_log_probs when there is a
    reference model and values and returns when there is a critic.
    """
    mask = mb["response_mask"]
    agg = cfg.algorithm.loss_agg_mode
    loss, parts = policy_loss_fn(PolicyLossInput(out["log_probs"], mb["old_log_probs"], mb["advantages"], mask),
                                 cfg.algorithm)
    parts = {f"pg_{k}": float(v) for k, v in parts.items()}
    parts["pg_loss"] = loss.item()
    entropy = aggregate_loss(out["entropy"], mask, agg)
    parts["entropy"] = entropy.item()
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * entropy
    if "ref_log_probs" in mb.tensors:
        kl = aggregate_loss(kl_fn(out["log_probs"], mb["ref_log_probs"]), mask, agg)
        parts["kl"] = kl.item()
        if not cfg.kl_in_reward:  # in the reward, it already shaped the advantages
            loss = loss + cfg.kl_coef * kl
    if "values" in out:
        v_loss, v_parts = value_loss(out["values"], mb["values"], mb["returns"], mask, cfg.value_clip, agg)
        loss = loss + cfg.value_coef * v_loss
        parts.update({f"value_{k}": float(v) for k, v in v_parts.items()}, value_loss=v_loss.item())
    parts["loss"] = loss.item()
    return loss, parts
