"""Sharded data parallel (torch FSDP2) for the recipes, asked for with an accelerate config:

    accelerate launch --config_file configs/accelerate/fsdp.yaml -m omrl train --algo grpo --env webshop

Each process keeps 1/world_size of every weight, gradient and optimizer state.
A decoder layer's full weights exist only while that layer runs: each forward
all-gathers them and each backward reduce-scatters their gradients. Those
collectives need every process to run the same modules the same number of
times, so the recipes pad a process's shorter list of micro-batches with idle
passes (:mod:`omrl.parallel.lockstep`) instead of letting it wait at a barrier.

Gradients are *summed* across processes (not averaged), as in the data-parallel
path: losses are already weighted by global token counts, so the result does
not depend on the number of processes.

omrl shards the model itself rather than through ``accelerator.prepare``: accelerate
only accepts FSDP on CUDA, while ``fully_shard`` also runs on CPU processes (gloo),
which is how the tests check it. What accelerate's config decides is read from the
environment ``accelerate launch`` sets (``ACCELERATE_USE_FSDP``, ``FSDP_*``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
from torch import nn

from omrl.errors import ConfigError
from omrl.parallel.base import Strategy, check_optimizer_names
from omrl.parallel.data_parallel import all_reduce_gradients
from omrl.parallel.lockstep import lockstep

T = TypeVar("T")

try:  # imported once: is_sharded runs for every parameter at every optimizer step
    from torch.distributed.tensor import DTensor
except ImportError:  # torch < 2.5: no FSDP2, so nothing is sharded
    DTensor = None


def requested() -> bool:
    """True when ``accelerate launch`` was given an FSDP config."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


# accelerate FSDP settings omrl does not implement -> (the value it refuses, what to use instead)
UNSUPPORTED = {
    "FSDP_OFFLOAD_PARAMS": ("true", "false"),
    "FSDP_CPU_RAM_EFFICIENT_LOADING": ("true", "false (every process loads the model itself)"),
    "FSDP_ACTIVATION_CHECKPOINTING": ("true", "false, and model.gradient_checkpointing=true in omrl's config"),
    "FSDP_STATE_DICT_TYPE": ("SHARDED_STATE_DICT", "FULL_STATE_DICT (checkpoints hold whole weights)"),
}


def check_options() -> None:
    """Refuse FSDP settings the recipes do not implement, naming the valid ones."""
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise ConfigError(
            f"FSDP needs torch >= 2.8 (fully_shard with sum reductions); this is torch "
            f"{torch.__version__}. Use configs/accelerate/ddp.yaml or a newer torch"
        )
    version = os.environ.get("FSDP_VERSION", "2")
    if version != "2":
        raise ConfigError(
            f"fsdp_version {version} is not supported; valid: 2 (torch's fully_shard), "
            "e.g. configs/accelerate/fsdp.yaml"
        )
    for key, (refused, valid) in UNSUPPORTED.items():
        if os.environ.get(key, "").lower() == refused.lower():
            raise ConfigError(f"{key.lower()}: {refused} is not supported under omrl's FSDP; valid: {valid}")


def is_sharded(tensor: torch.Tensor) -> bool:
    """True for an FSDP-sharded tensor (a DTensor)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def shard(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place: one FSDP unit per decoder layer (the classes the model names
    in ``_no_split_modules``, or accelerate's ``fsdp_transformer_layer_cls_to_wrap``) and one
    for the rest (embeddings, final norm, LM head)."""
    from torch.distributed.fsdp import fully_shard

    if getattr(model, "peft_config", None):
        raise ConfigError(
            "LoRA (model.lora_rank > 0) cannot be combined with FSDP: use lora_rank=0, "
            "or the data-parallel config configs/accelerate/ddp.yaml"
        )
    named = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
    layer_classes = {c.strip() for c in named.split(",") if c.strip()} or set(
        getattr(model, "_no_split_modules", None) or []
    )
    # innermost first: a unit nested in another must be sharded before its parent
    layers = [m for m in reversed(list(model.modules())) if type(m).__name__ in layer_classes]
    if not layers:
        raise ConfigError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    for unit in [*layers, model]:
        fully_shard(unit, reshard_after_forward=reshard if unit is not model else None)
        # sum, not mean (set per unit: these setters do not recurse); "force sum" keeps to plain
        # SUM reductions, which gloo (CPU) also has
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
        # reduce-scatter weights that got no gradient too (e.g. experts an idle pass skipped), so every
        # process sends the same sizes
        unit.set_reduce_scatter_unused_params(True)
    return model


def full_state_dict(model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
    """The unsharded weights (every process must call): on every process, or (``all_ranks=False``)
    on the main process alone, in CPU memory, as a checkpoint needs them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks))


def copy_whole_weights(model: nn.Module, replica: nn.Module) -> None:
    """Copy the sharded ``model``'s weights into the unsharded ``replica`` in place, one tensor at a
    time (every process must call), so no second whole copy is ever built."""
    targets = replica.state_dict()
    with torch.no_grad():
        for name, value in model.state_dict().items():
            targets[name].copy_(value.full_tensor() if is_sharded(value) else value)


def load_full_state_dict(
    model: nn.Module, weights: dict[str, torch.Tensor], ignore: set[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """Load unsharded ``weights`` (read by every process) into this process's shards; returns the
    (missing, unexpected) names, leaving out ``ignore`` (e.g. tied weights)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # set_model_state_dict fills in missing names from the model itself: compare the names first
    own = set(model.state_dict())
    missing = sorted(own - set(weights) - set(ignore))
    unexpected = sorted(set(weights) - own)
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    return missing, unexpected


def full_optimizer_state(owner: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The unsharded optimizer state keyed by parameter name, on the main process (every process
    must call). ``owner`` holds every parameter the optimizer updates."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    untouched = not optimizer.state
    state = get_optimizer_state_dict(owner, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if untouched:  # torch filled in the state with a step at lr 0, which AdamW would count: drop it
        optimizer.state.clear()
        if "state" in state:
            state["state"] = {}
    return state


def load_full_optimizer_state(owner: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a :func:`full_optimizer_state` (read by every process) into this process's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(owner, optimizer, state, options=StateDictOptions(full_state_dict=True))
    if not state.get("state"):  # saved before any update: drop the state torch filled in to load it
        optimizer.state.clear()


def clip_grad_norm(params: Sequence[nn.Parameter], max_norm: float) -> float:
    """Scale the gradients to a total 2-norm of at most ``max_norm``; returns the norm before.
    The norm spans the sharded gradients of every process and the replicated rest."""
    grads = [p.grad for p in params if p.grad is not None]
    sharded = [g for g in grads if is_sharded(g)]
    replicated = [g for g in grads if not is_sharded(g)]
    norms = [torch.nn.utils.get_total_norm(sharded).full_tensor()] if sharded else []
    norms += [torch.nn.utils.get_total_norm(replicated)] if replicated else []
    total = float(torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms]))) if norms else 0.0
    if math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + 1e-6)  # the factor torch's clip_grad_norm_ uses
        for g in grads:
            g.mul_(scale)
    return total


class FSDP(Strategy):
    """Models passed to :meth:`prepare` sharded per decoder layer; what sits beside them (a value
    head) is replicated and its gradients all-reduced as in data parallel."""

    name = "fsdp"
    sharded = True
    fused_optimizer = False

    @classmethod
    def requested(cls) -> bool:
        return requested()

    def check_options(self) -> None:
        check_options()

    def prepare(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        return shard(model)

    def micro_batches(
        self, items: Iterable[T], idle: Callable[[dict[str, torch.Tensor]], Any] | None = None, backward: bool = True
    ) -> Iterator[T]:
        return lockstep(items, idle, backward, self.device, self.backward)

    def sum_gradients(self, params: Sequence[nn.Parameter]) -> None:
        """The replicated parameters' gradients (FSDP summed the sharded ones in backward)."""
        all_reduce_gradients([p for p in params if not is_sharded(p)])

    def clip_grad_norm(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        return clip_grad_norm(params, max_norm)

    def state_dict(self, model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
        if _has_shards(model):
            return full_state_dict(model, all_ranks=all_ranks)
        return model.state_dict()

    def load_weights(
        self, model: nn.Module, weights: dict[str, torch.Tensor], ignore: Iterable[str] = ()
    ) -> tuple[list[str], list[str]]:
        if _has_shards(model):
            return load_full_state_dict(model, weights, ignore=set(ignore))
        return super().load_weights(model, weights, ignore)

    def copy_whole_weights(self, model: nn.Module, replica: nn.Module) -> None:
        copy_whole_weights(model, replica)

    def gather_for_checkpoint(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        gathered: dict[str, Any] = {"model_state": full_state_dict(model, all_ranks=False)}
        if optimizer is not None:
            gathered["optimizer_state"] = full_optimizer_state(self.owner, optimizer)
        return gathered

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        name_of = {id(p): name for name, p in self.owner.named_parameters()}
        check_optimizer_names(
            self.owner, [{name_of[id(p)] for p in group["params"]} for group in optimizer.param_groups], state
        )
        load_full_optimizer_state(self.owner, optimizer, state)


def _has_shards(model: nn.Module) -> bool:
    """Models passed to :meth:`FSDP.prepare` are sharded; a value head beside them is not."""
    return any(is_sharded(p) for p in model.parameters())
