"""Data parallelism: every process holds the whole model and works on its share of each step.

    accelerate launch --config_file configs/accelerate/ddp.yaml -m omrl train --algo grpo --env gridworld

SFT splits a step's micro-batches, RL its tasks (all samples of a task on one process, so
group-relative advantages stay exact). Before each optimizer step the gradients are summed
across processes in one all-reduce. Each process weights its losses by its tokens over the
*global* token count, so the summed gradient equals the single-process gradient of the same
step: a result does not depend on how many processes computed it (up to summation order).

Why not ``DistributedDataParallel``: DDP all-reduces inside every ``backward`` and deadlocks
when processes run different numbers of micro-batches, which multi-turn rollouts of different
lengths cause; it also misses parameters outside the wrapped module (PPO's value head). One
explicit all-reduce per optimizer step has neither problem.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import nn

from omrl.parallel.base import Strategy


class DataParallel(Strategy):
    """Whole models on every process; gradients summed in one all-reduce per optimizer step."""

    name = "ddp"

    @classmethod
    def requested(cls) -> bool:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1

    def sum_gradients(self, params: Sequence[nn.Parameter]) -> None:
        """Sum every parameter's gradient over all processes (missing gradients count as zero)."""
        all_reduce_gradients(params)


def all_reduce_gradients(params: Sequence[nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over all processes: one flat all-reduce per dtype."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for dtype in sorted({p.grad.dtype for p in params}, key=str):
        group = [p for p in params if p.grad.dtype == dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in group:
            p.grad.copy_(flat[offset : offset + p.grad.numel()].view_as(p.grad))
            offset += p.grad.numel()
