"""A LoRA run's checkpoint as a whole model (``omrl checkpoint merge``).

A LoRA run's checkpoints hold its adapter alone (``step-N/model/adapter_model.safetensors``), which no
``--model`` loads: only the run's final model has the adapter merged in. Here the base model the run
trained (its checkpoint's config names it) is loaded, adapted as the run adapted it, given the
checkpoint's adapter weights, merged and written as a run's final model is: safetensors, the
checkpoint's tokenizer and chat template, a sha256 manifest and the step. ``omrl eval``, ``rollout``,
the vllm backend and ``train --model`` then take the folder as they take any model.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

from omrl.config.options import ModelConfig
from omrl.training.checkpoint import CheckpointError, load_model_weights
from omrl.training.checkpoint_marker import (
    COMPLETE_MARKER,
    complete_checkpoints,
    damage,
    has_manifest,
    newest_of,
    no_such_checkpoint,
)


def merge_checkpoint(path: str | Path, output_dir: str | Path | None = None) -> Path:
    """Write checkpoint ``path``'s model (a LoRA run's: base plus adapter, merged) into ``output_dir``
    (default: ``<run>-step-N`` beside the run's folder) and return that folder."""
    checkpoint = _checkpoint_of(Path(path))
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    step = int(state["step"])
    out = (
        Path(output_dir) if output_dir else checkpoint.parents[1].with_name(f"{checkpoint.parents[1].name}-step-{step}")
    )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} exists and is not an empty folder: give another --output-dir")
    cfg = _model_config(state.get("config", {}).get("model", {}), checkpoint)

    from transformers import AutoTokenizer

    from omrl.models import load_model
    from omrl.training.model_setup import made_trainable, save_final_model

    model, _ = load_model(cfg.name, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)
    model = made_trainable(model, cfg)
    load_model_weights(model, checkpoint / "model")
    # the run's tokenizer as it checkpointed it: its chat template may be the run's own, not the base's
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "model", trust_remote_code=cfg.trust_remote_code)
    out.mkdir(parents=True, exist_ok=True)
    save_final_model(model, tokenizer, out, merge_lora=True, step=step)
    return out


def _checkpoint_of(path: Path) -> Path:
    """The checkpoint folder ``path`` names (its own or its ``model/``), refused where it is no whole,
    undamaged checkpoint of a LoRA run that trained a causal language model."""
    if path.name == "model" and (path.parent / COMPLETE_MARKER).is_file():
        path = path.parent
    if not path.exists():
        raise CheckpointError(no_such_checkpoint(path))
    kept = complete_checkpoints(path)
    if kept:
        raise CheckpointError(f"{path} is a run's folder; give one of its checkpoints: {newest_of(kept)}")
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker); expected a folder like "
            "RUN/checkpoints/step-00000012"
        )
    adapter = path / "model" / "adapter_config.json"
    if not adapter.is_file():
        raise CheckpointError(
            f"{path} is a checkpoint of a run without LoRA: its model is whole already; give {path / 'model'} "
            "to --model as it is"
        )
    if not has_manifest(path):
        raise CheckpointError(
            f"{path} has no manifest of its files (an older omrl wrote it), so its weights cannot be checked: "
            f"vouch for them with omrl checkpoint trust {path}, then merge"
        )
    problem = damage(path)
    if problem:
        raise CheckpointError(f"{path} is damaged: {problem}; merge another of the run's checkpoints")
    task = json.loads(adapter.read_text(encoding="utf-8")).get("task_type")
    if task != "CAUSAL_LM":
        raise CheckpointError(
            f"{path}'s adapter is for a {task} model (a reward model's), not a policy: this merges a policy's "
            "checkpoints; a reward model run's final folder is the one --reward-model takes"
        )
    return path


def trained_env(checkpoint: Path) -> str:
    """The env the checkpoint's run trained on ("" where its config names none)."""
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    env = (state.get("config") or {}).get("env") or {}
    return env.get("name") or "" if isinstance(env, dict) else ""


def _model_config(saved: dict, checkpoint: Path) -> ModelConfig:
    """The checkpoint's model section as a ModelConfig (keys an older or newer omrl wrote are left out)."""
    known = {f.name for f in fields(ModelConfig)}
    cfg = ModelConfig(**{k: v for k, v in saved.items() if k in known})
    if not cfg.lora_rank:
        raise CheckpointError(f"{checkpoint}'s config has model.lora_rank=0 beside a LoRA adapter: it is damaged")
    return replace(cfg, gradient_checkpointing=False)  # a merge runs no backward pass
