"""Data parallelism for the recipes: one process, or several under ``accelerate launch``.

    accelerate launch --config_file configs/accelerate/ddp.yaml -m omrl train --algo grpo --env gridworld

Every process holds the whole model and works on its share of each step's data
(SFT: micro-batches; RL: tasks, with all samples of a task on one process so
group-relative advantages stay exact). Before each optimizer step the gradients
are summed across processes in one all-reduce. Each process weights its losses
by its tokens over the *global* token count, so the summed gradient equals the
single-process gradient of the same step: a run's result does not depend on how
many processes computed it (up to floating-point summation order).

Why not wrap the model in ``DistributedDataParallel``: DDP all-reduces inside
every ``backward`` and deadlocks when processes run different numbers of
micro-batches, which multi-turn rollouts of different lengths cause; it also
misses parameters outside the wrapped module (PPO's value head). One explicit
all-reduce per optimizer step has neither problem.

The main process alone writes logs, checkpoints and the final model; the others
wait at a barrier, so no process reads a half-written file.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence, TypeVar

import torch

from omrl.errors import ConfigError

T = TypeVar("T")


class Distributed:
    """The process group a recipe runs in (world size 1 when not launched by accelerate)."""

    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.accelerator = None
        if self.world_size > 1:
            from accelerate import Accelerator

            # joins the process group accelerate launch set up: nccl on GPUs, gloo on a machine without CUDA
            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self._check_mode()
        self.rank = self.accelerator.process_index if self.accelerator else 0
        self.is_main = self.rank == 0

    def _check_mode(self) -> None:
        from accelerate.utils import DistributedType

        mode = self.accelerator.distributed_type
        supported = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        if mode not in supported:
            raise ConfigError(
                f"accelerate is set up for {mode.value}; omrl's recipes run data parallel "
                f"(valid: {', '.join(m.value for m in supported)}, e.g. configs/accelerate/ddp.yaml)")

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None and self.accelerator.device.type != "cpu":
            return self.accelerator.device
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share of ``items``: every world_size-th one, starting at its rank."""
        return list(items[self.rank::self.world_size])

    def check_divisible(self, name: str, value: int) -> None:
        """Refuse a per-step count that cannot be split evenly across processes."""
        if value % self.world_size:
            raise ConfigError(f"{name}={value} does not split evenly across {self.world_size} processes; "
                              f"use a multiple of {self.world_size}")

    def sum(self, values: Iterable[float]) -> list[float]:
        """Element-wise sum of ``values`` over all processes (the values themselves with one process)."""
        values = [float(v) for v in values]
        if self.world_size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def sum_dicts(self, values: dict[str, float]) -> dict[str, float]:
        """Per-key sums over all processes (a key missing on a process counts as 0 there)."""
        if self.world_size == 1:
            return dict(values)
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        torch.distributed.all_gather_object(gathered, dict(values))
        keys = sorted({k for d in gathered for k in d})
        return {k: sum(d.get(k, 0.0) for d in gathered) for k in keys}

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over all processes (missing gradients count as zero)."""
        if self.world_size == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for dtype in sorted({p.grad.dtype for p in params}, key=str):  # one flat all-reduce per dtype
            group = [p for p in params if p.grad.dtype == dtype]
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            torch.distributed.all_reduce(flat)
            offset = 0
            for p in group:
                p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
                offset += p.grad.numel()

    def on_main(self, fn, *args, **kwargs):
        """Run ``fn`` on the main process alone (a file every process would write alike); the
        others wait until it is done. Returns ``fn``'s result there, None elsewhere."""
        result = fn(*args, **kwargs) if self.is_main else None
        self.barrier()
        return result

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if self.accelerator is not None and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        self.accelerator = None
