"""A model name that names none (no folder, no built-in, no hub id), and a path given as a model that
holds none, named for what it is: a file, a LoRA adapter, one of a run's checkpoints (its model is a
folder inside), a run stopped before it saved its model, or another folder; and whether a model folder is
a reward model, read from its config.json alone (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omrl.errors import OmrlError
from omrl.models.builtin import BUILTIN_MODELS
from omrl.models.manifest import COMPLETE_MARKER

#: the entry of a reward model's config.json that `omrl rm train` writes, and the kinds it may name
REWARD_MODEL_KEY = "omrl_reward_model"
REWARD_MODEL_KINDS = ("orm", "prm")


def check_model_name(name_or_path: str, what: str = "model") -> None:
    """Raise OmrlError where ``name_or_path`` (the ``what``, e.g. ``algorithm.teacher``) names no model: a
    built-in name, a model folder or an ``org/name`` hub id would be. Reads no weights, so a command says so
    before it prints its settings."""
    if name_or_path in BUILTIN_MODELS:
        return
    path = Path(name_or_path).expanduser()
    if path.exists():
        check_model_folder(path)
        return
    looks_like_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    # runs/tiny-sft where runs/ is here: a run folder mistyped or never written, not an org's hub model
    in_a_local_folder = "/" in name_or_path and path.parent.is_dir() and str(path.parent) not in ("", ".")
    if in_a_local_folder and not looks_like_path:
        raise OmrlError(
            f"{what} {name_or_path!r} not found: {path.parent}/ is a folder here and holds no {path.name} "
            f"(its folders: {', '.join(sorted(p.name for p in path.parent.iterdir() if p.is_dir())[:8]) or 'none'}); "
            "for the hub model of that id, run from another folder"
        )
    if looks_like_path or "/" not in name_or_path:
        raise OmrlError(
            f"{what} {name_or_path!r} not found: no such directory, and not a built-in "
            f"name ({', '.join(BUILTIN_MODELS)}) or an 'org/name' hub id"
        )


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
    if any((path / "checkpoints").glob(f"step-*/{COMPLETE_MARKER}")):
        raise OmrlError(
            f"{path} is a run that stopped before it saved its model: resume it (--resume --output-dir {path}), "
            f"or give one of its checkpoints' models ({path}/checkpoints/step-N/model)"
        )
    if (path / "checkpoints").is_dir() or (path / "config.yaml").exists():
        raise OmrlError(
            f"{path} is a run that stopped before its first checkpoint: it holds no model, and --resume has "
            "nothing to go on from; train it again"
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
