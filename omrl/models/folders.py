"""A path given as a model that holds none, named for what it is: a file, a LoRA adapter, one of a run's
checkpoints (its model is a folder inside), a run stopped before it saved its model, or another folder."""

from __future__ import annotations

from pathlib import Path

from omrl.errors import OmrlError
from omrl.models.builtin import BUILTIN_MODELS


def check_model_folder(path: Path) -> None:
    """Raise OmrlError where ``path`` (which exists) is no Hugging Face model folder (no config.json),
    saying what it is and what to give instead."""
    if path.is_file():
        raise OmrlError(f"model {path} is a file; give a model's folder (its config.json beside its weights)")
    if (path / "config.json").exists():
        return
    if (path / "adapter_config.json").exists():
        raise OmrlError(
            f"{path} is a LoRA adapter (a checkpoint's), not a model: give the run's folder, which holds "
            "the final model with the adapter merged in, or start from this checkpoint with --resume"
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
