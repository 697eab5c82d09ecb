"""``generation.weight_sync``'s values, and the check of how they go with the backend and LoRA: torch-free,
so that a config is checked before anything loads (:mod:`omrl.backends.weight_sync` moves the weights)."""

from __future__ import annotations

from typing import Any

from omrl.errors import ConfigError

WEIGHT_SYNCS = ("none", "files", "nccl", "lora")


def sync_kind(generation: Any) -> str:
    """``generation.weight_sync``, checked (a config from before the option has none)."""
    kind = getattr(generation, "weight_sync", "none")
    if kind not in WEIGHT_SYNCS:
        raise ConfigError(f"unknown generation.weight_sync {kind!r}; valid: {', '.join(WEIGHT_SYNCS)}")
    return kind


def check_weight_sync(generation: Any, trains: bool, lora_rank: int = 0) -> None:
    """Refuse a weight_sync the backend cannot use, and a training run whose server gets no weights."""
    kind = sync_kind(generation)
    if kind != "none" and generation.backend != "openai":
        raise ConfigError(
            f"generation.weight_sync={kind} sends weights to a server (generation.backend=openai); the "
            f"{generation.backend} backend gets them in process: leave generation.weight_sync=none"
        )
    if trains and generation.backend == "openai" and kind == "none":
        wanted = (
            f"generation.weight_sync=lora (model.lora_rank={lora_rank}: only the adapter is sent)"
            if lora_rank
            else "generation.weight_sync=files (any vLLM server that can read generation.weight_dir) or nccl (GPU to GPU)"
        )
        raise ConfigError(
            f"training with generation.backend=openai needs the trained weights on the server: set {wanted}; "
            "without it every step would sample from the first weights"
        )
    if kind in ("files", "nccl") and lora_rank:
        raise ConfigError(
            f"generation.weight_sync={kind} sends the model's full weights; model.lora_rank={lora_rank} trains "
            "adapters: set generation.weight_sync=lora (the adapter alone, to a server started with "
            "--enable-lora), or model.lora_rank=0"
        )
    if kind == "lora" and trains and not lora_rank:
        raise ConfigError(
            "generation.weight_sync=lora sends LoRA adapters and model.lora_rank=0 trains all weights: set "
            "model.lora_rank > 0, or generation.weight_sync=files or nccl"
        )
    keep = getattr(generation, "lora_keep", 1)
    if kind == "lora" and (not isinstance(keep, int) or keep < 0):
        raise ConfigError(f"generation.lora_keep must be an integer >= 0 (older adapter versions kept), got {keep!r}")
