"""A path given as a model that holds none, named for what it is: a file, a LoRA adapter, one of a run's
checkpoints (its model is a folder inside), a run stopped before it saved its model, or another folder;
and whether a model folder is a reward model, read from its config.json alone (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omrl.errors import OmrlError
from omrl.models.builtin import BUILTIN_MODELS

#: the entry of a reward model's config.json that `omrl rm train` writes, and the kinds it may name
REWARD_MODEL_KEY = "omrl_reward_model"
REWARD_MODEL_KINDS = ("orm", "prm")


def check_model_folder(path: Path) -> None:
    """Raise OmrlError where ``path`` (which exists) is no Hugging Face model folder (no config.json),
    saying what it is and what to give instead."""
    if path.is_file():
        raise OmrlError(f"model {path} is a file; give a model's folder (its config.json beside its weights)")
    if (path / "config.json").exists():
        return
    if (path / "adapter_config.json").exists():
        raise OmrlError(
            f"{path} is a LoRA adapter (a checkpoint's), not a model: merge it into one with omrl checkpoint "
            f"merge {path.parent}, give the run's folder (its final model, the adapter merged in), or go on "
            "training from this checkpoint with --resume"
        )
    if (path / "model" / "adapter_config.json").exists():
        raise OmrlError(
            f"{path} is a checkpoint of a LoRA run: its model/ holds the adapter alone, not a model; merge it "
            f"into one with omrl checkpoint merge {path}, give the run's folder (its final model, the adapter "
            "merged in), or go on training from this checkpoint with --resume --output-dir RUN"
        )
    if (path / "model" / "config.json").exists():
        raise OmrlError(
            f"{path} is a run's checkpoint; its model is {path / 'model'}: give that, or go on training the run "
            "from it with --resume --output-dir RUN"
        )
    if (path / "checkpoints").is_dir() or (path / "config.yaml").exists():
        raise OmrlError(
            f"{path} is a run that stopped before it saved its model: resume it (--resume --output-dir {path}), "
            f"or give one of its checkpoints' models ({path}/checkpoints/step-N/model)"
        )
    raise OmrlError(
        f"model directory {path} has no config.json; expected a Hugging Face model "
        f"directory, or a built-in name: {', '.join(BUILTIN_MODELS)}"
    )


def reward_model_problem(path: Path) -> str | None:
    """Why the folder ``path`` holds no omrl reward model (a policy's folder has a config.json too), or None."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"its config.json cannot be read ({exc})"
    problem = reward_entry_problem(config.get(REWARD_MODEL_KEY) if isinstance(config, dict) else None)
    return f"it {problem}" if problem else None


def reward_entry_problem(meta: Any) -> str | None:
    """Why ``meta``, a model config's :data:`REWARD_MODEL_KEY` entry, makes no reward model, or None."""
    if not isinstance(meta, dict) or meta.get("kind") not in REWARD_MODEL_KINDS:
        return (
            f"is not an omrl reward model (its config.json has no {REWARD_MODEL_KEY!r} with a kind of "
            f"{', '.join(REWARD_MODEL_KINDS)}); train one with `omrl rm train`"
        )
    return None
