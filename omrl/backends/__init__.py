"""Generation backends: ``hf`` (transformers), ``vllm`` (offline engine), ``openai`` (HTTP endpoint).

:mod:`.base` is the interface every backend implements; ``hf`` keeps KV states between calls
(:mod:`.kv_cache`, reused by :mod:`.hf_reuse`'s engine) and can batch turns as they come
(:mod:`.hf_stream`, its batch in :mod:`.kv_ragged`; the turn-by-turn batch is :mod:`.kv_slots`); ``openai`` receives trained weights through
:mod:`.weight_sync` (whole weights; over NCCL :mod:`.nccl_sync`) or :mod:`.lora_sync` (LoRA adapters
alone), both driving the server through :mod:`.server_control` and writing files as :mod:`.weight_files` does;
:mod:`.sync_settings` checks ``generation.weight_sync`` without torch; ``vllm`` loads a LoRA model's weights
merged (:mod:`.merged_weights`).

    backend = make_backend("hf", tokenizer, cfg.generation, model=model)
    gens = backend.generate([prompt_ids, ...], SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))

Backends are chosen by name from a fixed table (not a plugin registry): each
one is tied to how omrl loads weights and samples.
"""

from __future__ import annotations

from typing import Any

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.errors import OmrlError, UnknownNameError

BACKENDS = {
    "hf": "transformers, batched, KV states reused across turns; CPU or GPU",
    "vllm": "vLLM offline engine kept across steps (pip install 'omrl[vllm]')",
    "openai": "an OpenAI-compatible endpoint at generation.base_url (trains with generation.weight_sync)",
}


def make_backend(
    name: str,
    tokenizer: Any,
    generation: Any,
    *,
    model: Any = None,
    model_name: str = "",
    dtype: str = "float32",
    seed: int = 0,
    bf16: bool = False,
) -> Backend:
    """Build the backend ``name`` from a GenerationConfig.

    ``model`` is an already loaded transformers model (hf; loaded from
    ``model_name`` when None); ``model_name`` is the built-in name, directory or
    hub id the vllm engine loads, or the model name sent to an openai endpoint. ``bf16``: generate in
    bfloat16 (the hf backend under autocast, the vllm engine in bfloat16 weights).
    """
    batching = str(getattr(generation, "batching", "turns"))
    if batching != "turns" and name != "hf":
        raise OmrlError(
            f"generation.batching={batching} needs the hf backend, which admits turns between its own decode "
            f"steps; the {name} backend is handed a rollout's turns together: set generation.batching=turns"
        )
    if name == "hf":
        from omrl.backends.hf import HFBackend

        if model is None:
            import torch

            from omrl.models import load_model

            model, _ = load_model(model_name, dtype=dtype, device="cuda" if torch.cuda.is_available() else None)
        # read defensively: a config from before these options has neither
        return HFBackend(
            model,
            tokenizer,
            batch_size=generation.batch_size,
            kv_reuse=bool(getattr(generation, "kv_reuse", True)),
            kv_cache_mb=int(getattr(generation, "kv_cache_mb", 1024)),
            batching=batching,
            bf16=bf16,
        )
    if name == "vllm":
        from omrl.backends.vllm import VLLMBackend
        from omrl.models import resolve_model_path

        return VLLMBackend(
            resolve_model_path(model_name),
            tokenizer,
            batch_size=generation.batch_size,
            dtype="bfloat16" if bf16 and dtype == "float32" else dtype,
            max_model_len=generation.max_context,
            gpu_memory_utilization=generation.gpu_memory_utilization,
            seed=seed,
        )
    if name == "openai":
        from omrl.backends.openai import OpenAIBackend
        from omrl.backends.weight_sync import make_weight_sync

        return OpenAIBackend.from_env(
            generation.base_url,
            model_name,
            tokenizer,
            api_key_env=generation.api_key_env,
            batch_size=generation.batch_size,
            timeout=float(getattr(generation, "request_timeout_s", 120.0)),
            retries=int(getattr(generation, "request_retries", 3)),
            weight_sync=make_weight_sync(generation, model_name),
        )
    raise UnknownNameError(f"unknown generation backend {name!r}; valid: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "Generation", "SamplingParams", "make_backend"]
