"""A LoRA model's weights merged into its base weights, under the base model's names: what an engine that
knows no adapters loads (the in-process vLLM, :attr:`omrl.backends.base.Backend.merges_lora`).

The trained model is left as it is: each adapted layer's weight plus its adapter's delta
(``B @ A`` times its scaling, peft's own ``get_delta_weight``) is a new tensor, where merging in place
and back would leave the trained base weights changed by rounding."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from omrl.backends.lora_sync import lora_config_of

_PEFT_PREFIX = "base_model.model."


def merged_state(model: Any, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` (``model``'s, perhaps gathered) with each LoRA adapter merged into the weight it
    adapts and the adapters' own tensors dropped; a model without an adapter's is returned as it is."""
    model = getattr(model, "module", model)  # a DDP wrapper's model
    if lora_config_of(model) is None:
        return dict(state_dict)
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    adapted = {  # the layers the adapter changes, by their base weight's key
        f"{name}.base_layer.weight": module
        for name, module in model.named_modules()
        if hasattr(module, "get_delta_weight")
        and (adapter in getattr(module, "lora_A", {}) or adapter in getattr(module, "lora_embedding_A", {}))
    }
    merged = {}
    with torch.no_grad():
        for key, tensor in state_dict.items():
            if ".lora_" in key:
                continue
            if key in adapted:
                tensor = tensor + adapted[key].get_delta_weight(adapter).to(tensor.dtype)
            merged[_base_name(key)] = tensor
    return merged


def _base_name(key: str) -> str:
    """A peft state dict key as the base model names it (``base_model.model.x.q_proj.base_layer.weight``
    -> ``x.q_proj.weight``)."""
    key = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
    return key.replace(".base_layer.", ".")
