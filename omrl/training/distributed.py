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

With an FSDP config (configs/accelerate/fsdp.yaml) the model is sharded instead of
replicated (:mod:`omrl.training.fsdp`); the same methods then hide the difference.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence, TypeVar

import torch

from omrl.errors import ConfigError
from omrl.training import fsdp

T = TypeVar("T")


def is_main_process() -> bool:
    """True in a single process, and in process 0 of several (before any process group exists)."""
    return os.environ.get("RANK", "0") == "0"


class Distributed:
    """The process group a recipe runs in (world size 1 when not launched by accelerate)."""

    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.accelerator = None
        self.sharded = False  # FSDP: each process holds a shard of the weights and optimizer state
        if self.world_size > 1:
            from accelerate import Accelerator

            # joins the process group accelerate launch set up: nccl on GPUs, gloo on a machine without CUDA
            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self._check_mode()
            self.sharded = fsdp.requested()
            if self.sharded:
                fsdp.check_options()
        self.rank = self.accelerator.process_index if self.accelerator else 0
        self.is_main = self.rank == 0

    def _check_mode(self) -> None:
        from accelerate.utils import DistributedType

        mode = self.accelerator.distributed_type
        # FSDP: on CPUs accelerate reports MULTI_CPU and the FSDP request is read from the environment
        supported = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.FSDP)
        if mode == DistributedType.DEEPSPEED:
            raise ConfigError("accelerate is set up for DeepSpeed, which omrl's recipes do not support; FSDP shards "
                              "weights, gradients and optimizer state as ZeRO-3 does: use configs/accelerate/fsdp.yaml "
                              f"(valid: {', '.join(m.value for m in supported)})")
        if mode not in supported:
            raise ConfigError(
                f"accelerate is set up for {mode.value}; omrl's recipes run data parallel or FSDP (valid: "
                f"{', '.join(m.value for m in supported)}, e.g. configs/accelerate/ddp.yaml or fsdp.yaml)")

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None and self.accelerator.device.type != "cpu":
            return self.accelerator.device
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model to train: sharded across processes under FSDP, else ``model`` itself."""
        return fsdp.shard(model) if self.sharded else model

    def lockstep(self, items: Sequence[T]) -> list[T | None]:
        """``items`` padded with None to as many as any process has. Under FSDP every process must run
        as many forward and backward passes; a None is an idle pass (:func:`fsdp.idle_pass`)."""
        items = list(items)
        if not self.sharded:
            return items
        most = torch.tensor([len(items)], device=self.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return items + [None] * (int(most) - len(items))

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole (unsharded) weights on every process (every process must call)."""
        return fsdp.full_state_dict(model) if self.sharded else model.state_dict()

    def gather_for_checkpoint(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                              owner: torch.nn.Module | None = None) -> dict[str, Any]:
        """Under FSDP, the unsharded weights (``model_state``) and optimizer state (``optimizer_state``,
        keyed by parameter names in ``owner``, default ``model``) on the main process, to pass to
        ``save_checkpoint``; every process must call. Without FSDP, nothing: the files come from
        the main process's own copies."""
        if not self.sharded:
            return {}
        gathered = {"model_state": fsdp.full_state_dict(model, all_ranks=False)}
        if optimizer is not None:
            gathered["optimizer_state"] = fsdp.full_optimizer_state(owner or model, optimizer)
        return gathered

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
        """Sum every parameter's gradient over all processes (missing gradients count as zero).
        FSDP has already summed the sharded ones in backward."""
        if self.world_size == 1:
            return
        params = [p for p in params if not fsdp.is_sharded(p)]
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

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Scale the gradients to a total 2-norm of at most ``max_norm``; returns the norm before.
        Under FSDP the norm spans the sharded gradients of every process and the replicated rest."""
        if not self.sharded:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        grads = [p.grad for p in params if p.grad is not None]
        sharded = [g for g in grads if fsdp.is_sharded(g)]
        replicated = [g for g in grads if not fsdp.is_sharded(g)]
        norms = [torch.nn.utils.get_total_norm(sharded).full_tensor()] if sharded else []
        norms += [torch.nn.utils.get_total_norm(replicated)] if replicated else []
        total = float(torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms]))) if norms else 0.0
        if math.isfinite(total) and total > max_norm:
            scale = max_norm / (total + 1e-6)  # the factor torch's clip_grad_norm_ uses
            for g in grads:
                g.mul_(scale)
        return total

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
