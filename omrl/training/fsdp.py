"""Sharded data parallel (torch FSDP2) for the recipes, asked for with an accelerate config:

    accelerate launch --config_file configs/accelerate/fsdp.yaml -m omrl train --algo grpo --env webshop

Each process keeps 1/world_size of every weight, gradient and optimizer state.
A decoder layer's full weights exist only while that layer runs: each forward
all-gathers them and each backward reduce-scatters their gradients. Those
collectives need every process to run the same modules the same number of
times, so the recipes pad a process's shorter list of micro-batches with idle
passes (:func:`idle_pass`) instead of letting it wait at a barrier.

Gradients are *summed* across processes (not averaged), as in the data-parallel
path: losses are already weighted by global token counts, so the result does
not depend on the number of processes.

omrl shards the model itself rather than through ``accelerator.prepare``: accelerate
only accepts FSDP on CUDA, while ``fully_shard`` also runs on CPU processes (gloo),
which is how the tests check it. What accelerate's config decides is read from the
environment ``accelerate launch`` sets (``ACCELERATE_USE_FSDP``, ``FSDP_*``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from omrl.errors import ConfigError


def requested() -> bool:
    """True when ``accelerate launch`` was given an FSDP config."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_options() -> None:
    """Refuse FSDP settings the recipes do not implement, naming the valid ones."""
    version = os.environ.get("FSDP_VERSION", "2")
    if version != "2":
        raise ConfigError(f"fsdp_version {version} is not supported; valid: 2 (torch's fully_shard), "
                          "e.g. configs/accelerate/fsdp.yaml")
    if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
        raise ConfigError("fsdp_offload_params: true is not supported; valid: false")


def is_sharded(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def shard(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place: one FSDP unit per decoder layer (the classes the model names
    in ``_no_split_modules``) and one for the rest (embeddings, final norm, LM head)."""
    from torch.distributed.fsdp import fully_shard

    if getattr(model, "peft_config", None):
        raise ConfigError("LoRA (model.lora_rank > 0) cannot be combined with FSDP: use lora_rank=0, "
                          "or the data-parallel config configs/accelerate/ddp.yaml")
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ConfigError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    for unit in [*layers, model]:
        fully_shard(unit, reshard_after_forward=reshard if unit is not model else None)
        # sum, not mean (set per unit: these setters do not recurse); "force sum" keeps to plain
        # SUM reductions, which gloo (CPU) also has
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def idle_pass(model: nn.Module, device: torch.device | str, forwards: int = 1, backward: bool = True) -> None:
    """Take part in a micro-batch's collectives without data: ``forwards`` forward passes of one
    2-token row, then (if ``backward``) a backward of a zero loss, which adds nothing to any gradient."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    with torch.set_grad_enabled(backward):
        loss = sum(model(input_ids=ids, use_cache=False).logits.float().sum() for _ in range(forwards))
    if backward:
        (loss * 0.0).backward()


def full_state_dict(model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
    """The unsharded weights (every process must call): on every process, or (``all_ranks=False``)
    on the main process alone, in CPU memory, as a checkpoint needs them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks))


def load_full_state_dict(model: nn.Module, weights: dict[str, torch.Tensor]) -> Any:
    """Load unsharded ``weights`` (read by every process) into this process's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    return set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))


def full_optimizer_state(owner: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The unsharded optimizer state keyed by parameter name, on the main process (every process
    must call). ``owner`` holds every parameter the optimizer updates."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(owner, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(owner: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a :func:`full_optimizer_state` (read by every process) into this process's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(owner, optimizer, state, options=StateDictOptions(full_state_dict=True))
