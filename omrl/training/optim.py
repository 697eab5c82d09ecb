"""AdamW and the learning-rate schedule every recipe uses.

The schedule is a multiplier on ``optim.learning_rate``: a linear warm-up from
0 over ``warmup_steps``, then ``constant`` (1), ``linear`` (down to 0 at the last
step) or ``cosine`` (half a cosine down to 0 at the last step). It counts the
updates applied: :func:`apply_update` advances it only when the optimizer stepped.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from omrl.config.options import OptimConfig
from omrl.config.sections import check_schedule
from omrl.errors import ConfigError

if TYPE_CHECKING:
    from omrl.parallel import Strategy
    from omrl.training.common import SkippedUpdates


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """The factor on the peak learning rate for optimizer step ``step`` (counted from 0).

    >>> [round(lr_multiplier(s, 4, 2, "linear"), 2) for s in range(4)]
    [0.0, 0.5, 1.0, 0.5]
    """
    check_schedule(schedule)
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, extra_params: list[nn.Parameter] | None = None, fused: bool = True
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (plus ``extra_params``, e.g. a value head).

    Weight decay applies to matrices only: biases and norm scales (1-D) are not decayed. ``fused``:
    torch's fused kernel (one pass over all parameters; about 6x faster than the default on a CPU)
    where every parameter is a plain tensor on a device it supports.
    """
    for key in ("learning_rate", "weight_decay"):
        value = getattr(cfg, key)
        if not (value >= 0 and value < float("inf")):  # also refuses NaN
            raise ConfigError(f"optim.{key} must be a finite number >= 0, got {value}")
    params = [p for p in model.parameters() if p.requires_grad] + list(extra_params or [])
    if not params:
        raise ConfigError("the model has no trainable parameters (is every weight frozen?)")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = (
        fused
        and all(type(p) in (torch.Tensor, nn.Parameter) and p.is_floating_point() for p in params)
        and all(p.device.type in ("cpu", "cuda") for p in params)
    )
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.learning_rate, fused=fused or None)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler to ``step()`` once per optimizer step; its state goes into checkpoints."""
    lr_multiplier(0, total_steps, cfg.warmup_steps, cfg.lr_schedule)  # validate the name now
    if cfg.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps must be >= 0, got {cfg.warmup_steps}")
    if 0 < total_steps <= cfg.warmup_steps:  # a rate that only rises: the peak is never used
        warnings.warn(
            f"optim.warmup_steps={cfg.warmup_steps} is not fewer than the run's {total_steps} optimizer steps: the "
            f"learning rate rises the whole run and never reaches optim.learning_rate={cfg.learning_rate:g}; "
            "lower optim.warmup_steps (a tenth of the steps is usual)",
            stacklevel=2,
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, cfg.warmup_steps, cfg.lr_schedule)
    )


def schedule_advances(mini_batches: int, planned: int) -> list[int]:
    """How far each of a pass's ``mini_batches`` updates moves a schedule sized for ``planned`` a pass,
    so that the pass moves it ``planned`` steps whatever its rollout gave (a search rollout's rows are
    its finished paths: many more than tasks x samples, which would end the schedule early).

    >>> schedule_advances(3, 3), schedule_advances(6, 2), schedule_advances(2, 3)
    ([1, 1, 1], [0, 0, 1, 0, 0, 1], [1, 2])
    """
    return [(k + 1) * planned // mini_batches - k * planned // mini_batches for k in range(mini_batches)]


class Update(NamedTuple):
    """What :func:`apply_update` did."""

    grad_norm: float  # before clipping; nan when the loss was not finite (no gradient was summed)
    lr: float  # the learning rate this update used (a skipped one: would have used)
    applied: bool  # False: skipped, the weights, the optimizer's moments and the schedule as they were


def apply_update(
    strategy: Strategy,
    params: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    skipped: SkippedUpdates,
    logger: Any,
    step: int,
    max_grad_norm: float,
    finite: bool = True,
    advance: int = 1,
) -> Update:
    """The end of every recipe's optimizer step: sum the gradients over processes, clip them to
    ``max_grad_norm`` (0 or less: no clipping), update and advance the schedule, unless the loss
    (``finite``: whether it was finite on every process) or the gradient norm is not finite: then
    drop the gradients and record the skip in ``skipped`` (warning through ``logger`` as ``step``).

    The schedule's rule: a skipped update does not advance the schedule, so the schedule counts the
    updates applied, as AdamW counts its own steps (its moments and bias correction move only on an
    applied update, and warm-up is there to protect the first updates applied). This is the one rule
    that holds for every recipe: an RL step's number of updates varies with its rollout, and a step
    may apply none. The cost: after k skipped updates the schedule ends k updates short of its last
    value. A checkpoint keeps the scheduler's state, so a resumed run continues it exactly either way.
    ``advance``: the schedule steps an applied update moves (:func:`schedule_advances`; 1 but where a
    rollout gave more or fewer mini-batches than the schedule was sized for).
    """
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    grad_norm = strategy.optimizer_step(params, optimizer, max_norm) if finite else float("nan")
    lr = scheduler.get_last_lr()[0]
    if finite and math.isfinite(grad_norm):
        for _ in range(advance):
            scheduler.step()
        skipped.applied()
        return Update(grad_norm, lr, True)
    strategy.zero_grad(optimizer)
    skipped.skip("non-finite loss" if not finite else f"non-finite gradient norm ({grad_norm})", logger, step, nan=True)
    return Update(grad_norm, lr, False)
