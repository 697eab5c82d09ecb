"""The RL recipe's correction for its sampler: which one runs, what it does to the batch, and the
mismatch it measures every step.

Each sampled token carries the log-prob its sampler reported (``Episode.logprobs``, the batch's
``sampler_log_probs``). The trainer's forward of the same weights gives the old log-probs, and the
two differ by other kernels, precision and caching. A registered ``rollout_correction``
(:mod:`omrl.algos`) turns the gap into per-token weights and a mask. ``auto`` picks none where the
gap is rounding alone (the ``hf`` backend sampling the trainer's own float32 model: measured below
1e-3 per token, on a CPU and on an H100) and token-level truncated IS elsewhere, as verl's docs
advise against ignoring the sampler. Sequence-level corrections stay a choice: an agent's
episode has hundreds of sampled tokens, and their product's variance grows with its length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omrl.algos import CorrectionInput, masked_mean
from omrl.errors import ConfigError

if TYPE_CHECKING:  # the settings block names the correction before torch is loaded
    import torch

EXACT_SAMPLER = ("hf", "float32")  # (generation.backend, model.dtype) whose log-probs are the trainer's
DEFAULT_CORRECTION = "token_tis"


def correction_name(cfg: Any) -> str:
    """The ``rollout_correction`` a run of ``cfg`` applies: ``algorithm.rollout_correction``, with
    ``auto`` resolved by the backend, the weights' dtype, ``bf16`` and whether generation runs behind the trainer
    (``rollout.async_generation`` with ``max_staleness`` above 0)."""
    chosen = cfg.algorithm.rollout_correction
    if chosen != "auto":
        from omrl import registry
        from omrl.errors import UnknownNameError

        try:
            registry.algorithms.component(chosen, kind="rollout_correction")
        except UnknownNameError as exc:  # the registry's names, and the default that is none of them
            raise UnknownNameError(f"{exc}, or auto (the default: chosen for the run's sampler)") from exc
        return chosen
    rollout = getattr(cfg, "rollout", None)
    behind = rollout is not None and getattr(rollout, "async_generation", False) and rollout.max_staleness > 0
    # bf16: the sampler and the update each run under bfloat16 autocast, through different kernels
    exact = (
        (cfg.generation.backend, cfg.model.dtype) == EXACT_SAMPLER and not getattr(cfg, "bf16", False) and not behind
    )
    return "none" if exact else DEFAULT_CORRECTION


def correct(batch, correction_fn, algo) -> dict[str, float]:
    """Apply ``correction_fn`` to ``batch`` in place (its ``old_log_probs`` set): the weights go to
    ``rollout_weights``, and the dropped tokens leave ``loss_mask``. Returns the correction's metrics."""
    if "sampler_log_probs" not in batch.tensors:
        raise ConfigError(
            f"algorithm.rollout_correction={algo.rollout_correction} needs the log-prob the sampler reported for each "
            "token, and some episodes of this rollout have none; set algorithm.rollout_correction=none"
        )
    data = CorrectionInput(batch["old_log_probs"], batch["sampler_log_probs"], batch["loss_mask"])
    weights, keep, metrics = correction_fn(data, algo)
    if weights.shape != data.loss_mask.shape or keep.shape != data.loss_mask.shape:
        raise ConfigError(
            f"rollout correction {algo.rollout_correction!r} returned weights {tuple(weights.shape)} and keep "
            f"{tuple(keep.shape)}; both must have the loss mask's shape {tuple(data.loss_mask.shape)}"
        )
    batch.tensors["rollout_weights"] = weights.detach().float()
    batch.tensors["loss_mask"] = batch["loss_mask"] * keep.to(batch["loss_mask"].dtype)
    return {key: float(value) for key, value in metrics.items()}


def mismatch_over_processes(strategy: Any, batch: Any) -> dict[str, float]:
    """:func:`mismatch_means` of ``batch``'s loss tokens, averaged over processes by their tokens."""
    tokens = float(batch["loss_mask"].sum())
    means = mismatch_means(batch["old_log_probs"], batch["sampler_log_probs"], batch["loss_mask"])
    total = max(strategy.sum([tokens])[0], 1.0)
    return strategy.sum_dicts({key: value * tokens / total for key, value in means.items()})


def mismatch_means(
    old_log_probs: torch.Tensor, sampler_log_probs: torch.Tensor, loss_mask: torch.Tensor
) -> dict[str, float]:
    """How far the sampler is from the old policy on the loss tokens, per token: ``mismatch_kl_k1``
    the mean of log p_sampler - log p_old, ``mismatch_kl_k3`` the mean of rho - 1 - log rho with
    rho = p_old / p_sampler. Both estimate KL(sampler || old) from the sampled tokens (Schulman
    2020, "Approximating KL Divergence"); k3 is never negative. All inputs [bs, T]."""
    log_ratio, mask = CorrectionInput(old_log_probs, sampler_log_probs, loss_mask).log_ratio()
    return {
        "mismatch_kl_k1": float(masked_mean(-log_ratio, mask)),
        "mismatch_kl_k3": float(masked_mean(log_ratio.exp() - 1.0 - log_ratio, mask)),
    }
