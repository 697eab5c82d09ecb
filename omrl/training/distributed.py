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

With an FSDP config (configs/accelerate/fsdp.yaml) or a DeepSpeed ZeRO-3 config
(configs/accelerate/zero3.yaml) the model is sharded instead of replicated
(:mod:`omrl.training.fsdp`, :mod:`omrl.training.zero3`); the same methods then hide
the difference: a recipe builds its models with :meth:`Distributed.prepare` and
:meth:`Distributed.prepare_optimizer`, runs each micro-batch's forward through
:meth:`Distributed.forward` and its backward through :meth:`Distributed.backward`,
and ends a step with :meth:`Distributed.optimizer_step`.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable, Iterable, Sequence, TypeVar

import torch
from torch import nn

from omrl.errors import ConfigError
from omrl.training import fsdp, zero3
from omrl.training.zero3 import Trainables

T = TypeVar("T")


def is_main_process() -> bool:
    """True in a single process, and in process 0 of several (before any process group exists)."""
    return os.environ.get("RANK", "0") == "0"


class Distributed:
    """The process group a recipe runs in (world size 1 when not launched by accelerate).

    ``mode``: "single", "ddp" (replicated weights), "fsdp" or "zero3" (sharded: ``sharded`` is True,
    each process holds a shard of the weights, gradients and optimizer state)."""

    def __init__(self, model_dtype: str = "float32") -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.accelerator = None
        self.mode = "single"
        self.engine = None  # ZeRO-3: the DeepSpeed engine training `owner`
        self.owner: nn.Module | None = None  # every trained module (see prepare_optimizer)
        if self.world_size > 1:
            from accelerate import Accelerator

            self.mode = "fsdp" if fsdp.requested() else "zero3" if zero3.requested() else "ddp"
            if self.mode == "zero3":  # before the Accelerator, which fails less clearly without deepspeed
                zero3.check_options(model_dtype)
            # joins the process group accelerate launch set up: nccl on GPUs, gloo on a machine without CUDA
            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self._check_mode()
            if self.mode == "fsdp":
                fsdp.check_options()
            elif self.mode == "zero3":
                zero3.load_models_whole()
        self.sharded = self.mode in ("fsdp", "zero3")
        self.rank = self.accelerator.process_index if self.accelerator else 0
        self.is_main = self.rank == 0

    def _check_mode(self) -> None:
        from accelerate.utils import DistributedType

        kind = self.accelerator.distributed_type
        # on CPUs accelerate reports MULTI_CPU for FSDP and DeepSpeed configs; the request is read from the environment
        supported = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.FSDP,
                     DistributedType.DEEPSPEED)
        if kind not in supported:
            raise ConfigError(
                f"accelerate is set up for {kind.value}; omrl's recipes run data parallel, FSDP or DeepSpeed ZeRO-3 "
                f"(valid: {', '.join(m.value for m in supported)}, e.g. configs/accelerate/ddp.yaml, fsdp.yaml "
                "or zero3.yaml)")

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None and self.accelerator.device.type != "cpu":
            return self.accelerator.device
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # -- models and optimizer ---------------------------------------------------------------------
    def prepare(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        """A model for the recipe: sharded under FSDP; under ZeRO-3 a ``frozen`` one (the reference)
        is partitioned now and a trained one in :meth:`prepare_optimizer`. Else ``model`` itself."""
        if self.mode == "fsdp":
            return fsdp.shard(model)
        if self.mode == "zero3" and frozen:
            return zero3.partition_frozen(model)
        return model

    def prepare_optimizer(self, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer,
                          max_grad_norm: float) -> nn.Module:
        """Register every module ``optimizer`` trains, by name (checkpoints name optimizer states by
        parameter names in the returned module); under ZeRO-3 the DeepSpeed engine takes them over."""
        self.owner = Trainables(modules)
        if self.mode == "zero3":
            self.engine = zero3.initialize(self.owner, optimizer, max_grad_norm)
        return self.owner

    # -- one step: forward, backward, update ------------------------------------------------------
    def forward(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: a micro-batch's forward through the trained modules (under
        ZeRO-3 it runs inside the engine's forward, which counts micro-batches)."""
        if self.engine is not None:
            return self.engine(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (already weighted by the step's global token count)."""
        if self.engine is not None:
            zero3.backward(self.engine, loss)
        else:
            loss.backward()

    def idle_pass(self, forward: Callable[[], Any], backward: bool = True) -> None:
        """Take part in another process's extra micro-batch (sharded modes): ``forward`` runs the same
        modules as a real micro-batch on a dummy row, then (if ``backward``) a zero loss goes back,
        so every process joins the same gathers and reductions and no gradient changes."""
        with torch.set_grad_enabled(backward):
            out = self.forward(forward)
            tensors = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else [out]
            loss = sum(t.float().sum() for t in tensors if torch.is_tensor(t) and t.is_floating_point())
        if backward:
            self.backward(loss * 0.0)

    def idle_batch(self) -> dict[str, torch.Tensor]:
        """The dummy row of an idle pass: two tokens, the second one a response token."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(2)[None].to(ids),
                "response_mask": torch.tensor([[0, 1]]).to(ids)}

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients accumulated since the last update."""
        if self.engine is not None:
            zero3.zero_grad(self.engine)
        else:
            optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer,
                       max_norm: float) -> float:
        """End the step: sum the gradients over processes, clip them to ``max_norm`` and update, unless
        their norm is not finite (then drop them). Returns the norm before clipping. Under ZeRO-3
        the engine does all of it (``max_norm`` was given to :meth:`prepare_optimizer`)."""
        if self.engine is not None:
            return zero3.step(self.engine)
        self.sum_gradients(params)
        grad_norm = self.clip_grad_norm(params, max_norm)
        if math.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def lockstep(self, items: Sequence[T]) -> list[T | None]:
        """``items`` padded with None to as many as any process has. When sharded every process must
        run as many forward and backward passes; a None is an idle pass (:meth:`idle_pass`)."""
        items = list(items)
        if not self.sharded:
            return items
        most = torch.tensor([len(items)], device=self.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return items + [None] * (int(most) - len(items))

    # -- whole weights and checkpoints ------------------------------------------------------------
    def _sharding(self):
        return fsdp if self.mode == "fsdp" else zero3

    def _is_sharded(self, model: nn.Module) -> bool:
        """Under ZeRO-3 every module the recipe trains or freezes is partitioned; under FSDP those
        passed to :meth:`prepare` (a value head beside them is not)."""
        return self.mode == "zero3" or (self.mode == "fsdp" and any(fsdp.is_sharded(p) for p in model.parameters()))

    def state_dict(self, model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
        """The whole (unsharded) weights on every process, or (``all_ranks=False``, for a file the
        main process writes) in the main process's CPU memory alone (every process must call)."""
        if self._is_sharded(model):
            return self._sharding().full_state_dict(model, all_ranks=all_ranks)
        return model.state_dict()

    def copy_whole_weights(self, model: nn.Module, replica: nn.Module) -> None:
        """Copy the sharded ``model``'s weights into its unsharded ``replica`` in place, one tensor at a
        time (every process must call)."""
        self._sharding().copy_whole_weights(model, replica)

    def load_weights(self, model: nn.Module, weights: dict[str, torch.Tensor], ignore: set[str] = frozenset()
                     ) -> tuple[list[str], list[str]]:
        """Load whole ``weights`` (read by every process) into ``model``, sharded or not; returns the
        (missing, unexpected) names."""
        if self.mode == "zero3":
            return zero3.load_full_state_dict(model, weights, engine=self.engine, ignore=ignore)
        if self._is_sharded(model):
            return fsdp.load_full_state_dict(model, weights, ignore=ignore)
        result = model.load_state_dict(weights, strict=False)
        return [k for k in result.missing_keys if k not in ignore], list(result.unexpected_keys)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a whole optimizer state keyed by parameter name (see :meth:`gather_for_checkpoint`);
        a state whose groups or parameter names differ from this run's raises ValueError naming them."""
        saved = [set(group["params"]) for group in state.get("param_groups", [])]
        if self.mode == "zero3":  # DeepSpeed emptied the groups: their names were kept at initialize
            own = [set(names) for names in self.engine.omrl_group_names]
        else:
            name_of = {id(p): name for name, p in self.owner.named_parameters()}
            own = [{name_of[id(p)] for p in group["params"]} for group in optimizer.param_groups]
        if saved != own:
            own_names, saved_names = set().union(*own), set().union(*saved)
            missing, unexpected = sorted(own_names - saved_names), sorted(saved_names - own_names)
            raise ValueError(f"the saved optimizer state does not fit this run: {len(saved)} parameter group(s) "
                             f"against {len(own)}, missing {missing[:5]}, unexpected {unexpected[:5]}")
        if self.mode == "zero3":
            zero3.load_full_optimizer_state(self.owner, self.engine, state)
        else:
            fsdp.load_full_optimizer_state(self.owner, optimizer, state)

    def gather_for_checkpoint(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                              ) -> dict[str, Any]:
        """In a sharded mode, the whole weights (``model_state``) and optimizer state (``optimizer_state``,
        keyed by parameter names in the module :meth:`prepare_optimizer` returned) on the main process,
        to pass to ``save_checkpoint``; every process must call. Otherwise nothing: the files come from
        the main process's own copies."""
        if not self.sharded:
            return {}
        gathered = {"model_state": self._sharding().full_state_dict(model, all_ranks=False)}
        if optimizer is not None:
            gathered["optimizer_state"] = zero3.full_optimizer_state(self.owner, self.engine) \
                if self.mode == "zero3" else fsdp.full_optimizer_state(self.owner, optimizer)
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
        """Leave the process group (idempotent). Called while an error propagates (a recipe's cleanup
        in ``finally``), it leaves at once: the other processes may be waiting in a collective this one
        will never join, and the launcher stops them when this one exits with the error."""
        failing = sys.exc_info()[0] is not None
        if self.accelerator is not None and torch.distributed.is_initialized() and not failing:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        self.accelerator = None
