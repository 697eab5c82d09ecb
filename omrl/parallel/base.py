"""The interface every parallel strategy implements, and the one-process strategy itself.

A recipe talks to its strategy and never to a process group:

- models: :meth:`Strategy.prepare` each model, :meth:`Strategy.prepare_optimizer` once;
- a step: ``for mb in strategy.micro_batches(items, idle=...)`` runs a forward (through
  :meth:`Strategy.forward`) and :meth:`Strategy.backward` per micro-batch, then
  :meth:`Strategy.optimizer_step`; a strategy that needs every process to run as many
  passes runs the idle ones itself, after the real ones;
- weights: :meth:`Strategy.state_dict`, :meth:`Strategy.load_weights`,
  :meth:`Strategy.gather_for_checkpoint`, :meth:`Strategy.load_optimizer_state`;
- numbers and files shared by processes: :meth:`Strategy.sum`, :meth:`Strategy.sum_dicts`,
  :meth:`Strategy.shard`, :meth:`Strategy.on_main`.

The base class is the one-process strategy and joins accelerate's process group when
launched with several; the data-parallel, FSDP and ZeRO-3 strategies override what differs
(how models, gradients and weights are handled). Collectives work for any world size.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
from torch import nn

from omrl.errors import ConfigError

T = TypeVar("T")


class Trainables(nn.ModuleDict):
    """Every trained module under one name each (``policy``, ``value_head``, ``critic``):
    checkpoints name optimizer states by parameter names in it, and ZeRO-3's engine wraps it.
    Its forward runs any function, so ``engine(fn, *args)`` is a forward DeepSpeed counts."""

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def check_optimizer_names(owner: nn.Module, own_groups: list[set[str]], state: dict[str, Any]) -> None:
    """Refuse a whole optimizer state (keyed by parameter name) whose groups or names differ from
    ``own_groups``, this run's parameter names per group: ValueError naming them."""
    saved = [set(group["params"]) for group in state.get("param_groups", [])]
    if saved != own_groups:
        own_names, saved_names = set().union(*own_groups), set().union(*saved)
        missing, unexpected = sorted(own_names - saved_names), sorted(saved_names - own_names)
        raise ValueError(
            f"the saved optimizer state does not fit this run: {len(saved)} parameter group(s) "
            f"against {len(own_groups)}, missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


class Strategy:
    """One process holding whole models (also the base of the multi-process strategies).

    ``sharded``: each process holds a shard of the weights, gradients and optimizer state;
    optimizer states are then saved whole and keyed by parameter name."""

    name = "single"
    sharded = False
    fused_optimizer = True  # torch's fused AdamW on plain tensors; sharded ones keep the default

    def __init__(self, model_dtype: str = "float32") -> None:
        self.model_dtype = model_dtype  # some strategies support only some weight dtypes
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        self.accelerator = None
        self.owner: Trainables | None = None
        if self.world_size > 1:  # launched by `accelerate launch`: join its process group
            from accelerate import Accelerator

            self.check_options()
            # nccl on GPUs, gloo on a machine without CUDA
            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self.rank = self.accelerator.process_index
            self._check_launch()

    def check_options(self) -> None:
        """Refuse settings this strategy does not implement (before the process group exists)."""

    def _check_launch(self) -> None:
        from accelerate.utils import DistributedType

        kind = self.accelerator.distributed_type
        # on CPUs accelerate reports MULTI_CPU for FSDP and DeepSpeed configs; the request is read from the environment
        supported = (
            DistributedType.MULTI_CPU,
            DistributedType.MULTI_GPU,
            DistributedType.FSDP,
            DistributedType.DEEPSPEED,
        )
        if kind not in supported:
            raise ConfigError(
                f"accelerate is set up for {kind.value}; omrl's recipes run data parallel, FSDP or DeepSpeed ZeRO-3 "
                f"(valid: {', '.join(m.value for m in supported)}, e.g. configs/accelerate/ddp.yaml, fsdp.yaml "
                "or zero3.yaml)"
            )

    @classmethod
    def requested(cls) -> bool:
        """True when the environment (``accelerate launch``'s settings) asks for this strategy."""
        return os.environ.get("WORLD_SIZE", "1") == "1"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None and self.accelerator.device.type != "cpu":
            return self.accelerator.device
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # -- models and optimizer ---------------------------------------------------------------------
    def prepare(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        """The model a recipe trains (or, ``frozen``, only runs forward)."""
        return model

    def prepare_optimizer(
        self, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer, max_grad_norm: float
    ) -> Trainables:
        """Register every module ``optimizer`` trains, by name."""
        self.owner = Trainables(modules)
        return self.owner

    # -- one step: forward, backward, update ------------------------------------------------------
    def micro_batches(
        self, items: Iterable[T], idle: Callable[[dict[str, torch.Tensor]], Any] | None = None, backward: bool = True
    ) -> Iterator[T]:
        """This process's micro-batches of a step. ``idle(batch)`` runs the same forward as a real
        micro-batch; strategies whose processes must run as many passes call it on a dummy row
        (then a zero loss goes back when ``backward``) once the real ones are done."""
        yield from items

    def forward(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: a micro-batch's forward through the trained modules."""
        return fn(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, already weighted by the step's global token (or row) count."""
        loss.backward()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients accumulated since the last update."""
        optimizer.zero_grad(set_to_none=True)

    def optimizer_step(
        self, params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer, max_norm: float
    ) -> float:
        """End the step: sum the gradients over processes, clip them to ``max_norm`` and update,
        unless their norm is not finite (then drop them). Returns the norm before clipping."""
        self.sum_gradients(params)
        grad_norm = self.clip_grad_norm(params, max_norm)
        if math.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def sum_gradients(self, params: Sequence[nn.Parameter]) -> None:
        """Sum the gradients over processes (nothing to do in one process)."""

    def clip_grad_norm(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        """Scale the gradients to a total 2-norm of at most ``max_norm``; returns the norm before."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    # -- whole weights and checkpoints ------------------------------------------------------------
    def state_dict(self, model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
        """The whole weights on every process, or (``all_ranks=False``, for a file the main process
        writes) on the main process at least. Every process must call."""
        return model.state_dict()

    def load_weights(
        self, model: nn.Module, weights: dict[str, torch.Tensor], ignore: Iterable[str] = ()
    ) -> tuple[list[str], list[str]]:
        """Load whole ``weights`` into ``model``; returns the (missing, unexpected) names, leaving
        out ``ignore`` (e.g. tied weights)."""
        result = model.load_state_dict(weights, strict=False)
        ignore = set(ignore)
        return [k for k in result.missing_keys if k not in ignore], list(result.unexpected_keys)

    def copy_whole_weights(self, model: nn.Module, replica: nn.Module) -> None:
        """Copy ``model``'s weights into its unsharded ``replica`` in place."""
        replica.load_state_dict(model.state_dict())

    def gather_for_checkpoint(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """What ``save_checkpoint`` writes instead of the model's and optimizer's own state dicts
        (``model_state``, ``optimizer_state``): nothing unless sharded. Every process must call."""
        return {}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load an optimizer state as :meth:`gather_for_checkpoint` (or the optimizer) saved it;
        ValueError when its parameters differ from this run's."""
        optimizer.load_state_dict(state)

    # -- numbers, data and files shared by the processes ------------------------------------------
    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share of ``items``: every world_size-th one, starting at its rank."""
        return list(items[self.rank :: self.world_size])

    def check_divisible(self, name: str, value: int) -> None:
        """Refuse a per-step count that cannot be split evenly across processes."""
        if value % self.world_size:
            raise ConfigError(
                f"{name}={value} does not split evenly across {self.world_size} processes; "
                f"use a multiple of {self.world_size}"
            )

    def sum(self, values: Iterable[float]) -> list[float]:
        """Element-wise sum of ``values`` over all processes."""
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

    def on_main(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """Run ``fn`` on the main process alone (a file every process would write alike); the
        others wait until it is done. Returns ``fn``'s result there, None elsewhere."""
        result = fn(*args, **kwargs) if self.is_main else None
        self.barrier()
        return result

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group, if any (idempotent). Called while an error propagates (a recipe's
        cleanup in ``finally``), it leaves at once: the other processes may be waiting in a collective
        this one will never join, and the launcher stops them when this one exits with the error."""
        failing = sys.exc_info()[0] is not None
        if self.accelerator is not None and torch.distributed.is_initialized() and not failing:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        self.accelerator = None
