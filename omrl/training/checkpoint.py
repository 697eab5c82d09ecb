"""Atomic checkpoints and exact resume, shared by every recipe.

A checkpoint is a directory ``<output_dir>/checkpoints/step-00000012/``::

    model/          the model in Hugging Face format (safetensors); a peft adapter for LoRA runs
    optimizer.pt    optimizer state (FSDP, ZeRO-3: gathered whole, keyed by parameter name)
    scheduler.pt    scheduler state
    rng.pt          python, numpy, torch CPU and CUDA random states
    extra.pt        whatever the recipe passed as ``extra`` (a value head, ...), when given
    state.json      step, data position, the resolved config
    COMPLETE        written last

It is written into a hidden temporary directory, every file fsync'd, then
renamed into place: only a ``step-*`` directory holding ``COMPLETE`` counts, so a
crash mid-write (or a full disk: :class:`~omrl.errors.WriteFailed`, the partial
directory removed) never leaves a checkpoint that looks complete. Old checkpoints are renamed
away before they are deleted, for the same reason.

``COMPLETE`` lists every file's sha256 digest (the manifest); resuming checks them and
skips a damaged checkpoint. Those of an older omrl have no manifest: nothing can tell
a byte flipped in their weights, so resuming refuses them until the user vouches for
their files with ``omrl checkpoint trust CHECKPOINT`` (which writes
the manifest of the files as they are now).

Where a run resumes from, and what may change when it does, is :mod:`omrl.training.resume`.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omrl.atomic import atomic_write_text, readable_as_umask_allows
from omrl.errors import Interrupted, OmrlError, WriteFailed, short_repr, write_failure
from omrl.models.manifest import COMPLETE_MARKER, changed_files, directory_manifest, manifest, unreadable_weights
from omrl.parallel import Strategy
from omrl.training.checkpoint_marker import (
    CHECKPOINTS_DIR,
    complete_checkpoints,
    fsync_dir,
    fsync_tree,
    has_manifest,
    latest_checkpoint,
    marker_text,
    no_such_checkpoint,
    step_line,
)


class CheckpointError(OmrlError):
    """A checkpoint that is missing, incomplete, or does not fit the run resuming from it."""


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` gives back besides restoring the objects in place."""

    path: Path
    step: int
    data_state: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# -- saving -----------------------------------------------------------------------------------------


def save_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    model: nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    data_state: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    tokenizer: Any = None,
    keep: int = 2,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    processes: int = 1,
) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep`` (0 keeps all).

    ``data_state`` and ``config`` must be JSON-serialisable; ``extra`` may hold tensors and
    plain Python containers (it is loaded with ``torch.load(weights_only=True)``).
    ``model_state`` and ``optimizer_state`` are written instead of the model's and the
    optimizer's own state dicts when given (FSDP, ZeRO-3: the gathered, unsharded ones). ``processes``:
    how many the run trains in (a resume in another number is told what that changes).
    """
    root = Path(output_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(output_dir, step)
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".deleting-*")]:  # left by a killed run
        _delete(stale)
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    try:
        tmp.mkdir()
        model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=model_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        if optimizer_state is not None or optimizer is not None:
            torch.save(optimizer_state if optimizer_state is not None else optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        if extra is not None:
            torch.save(extra, tmp / "extra.pt")
        state = {"step": step, "data_state": data_state or {}, "config": config or {}, "processes": processes}
        (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))
        readable_as_umask_allows(tmp)
        fsync_tree(tmp)
        (tmp / COMPLETE_MARKER).write_text(marker_text(f"step {step}", directory_manifest(tmp)))
        fsync_tree(tmp)
        if final.exists():  # a checkpoint of the same step from a run that crashed after it
            _remove(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except Exception as exc:
        reason = write_failure(exc)
        if reason is None:
            raise
        kept = latest_checkpoint(output_dir)
        then = (
            f"the ones before it are kept (the newest: {kept.name}): free some space, then continue with --resume"
            if kept is not None
            else "no checkpoint came before it, so the steps done are lost: free some space, then start again "
            "in another output_dir (or delete this one)"
        )
        raise WriteFailed(
            f"cannot write checkpoint {final}: {reason} ({short_repr(str(exc))}); the partial checkpoint was "
            f"removed and {then}"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if keep > 0:
        for old in complete_checkpoints(output_dir)[:-keep]:
            _remove(old)
    return final


def save_from_every_process(
    strategy: Strategy,
    output_dir: str | os.PathLike,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    **kwargs: Any,
) -> Path:
    """:func:`save_checkpoint` in a recipe: every process calls; what a sharded ``strategy`` holds in
    shards is gathered, the main process writes and the others wait. Returns the checkpoint's path."""
    gathered = strategy.gather_for_checkpoint(model, optimizer)
    kwargs.setdefault("processes", strategy.world_size)
    strategy.on_main(save_checkpoint, output_dir, step, model, optimizer=optimizer, **kwargs, **gathered)
    return checkpoint_path(output_dir, step)


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> Path:
    """Where checkpoint ``step`` of the run in ``output_dir`` lives."""
    return Path(output_dir) / CHECKPOINTS_DIR / f"step-{step:08d}"


def trust_model(path: str | os.PathLike, manifest_name: str) -> list[str]:
    """Accept model directory ``path``'s files as they are now (its chat template edited on purpose, say):
    rewrite its manifest ``manifest_name`` with their digests and return the files that had changed (none:
    left as it is). A file the manifest lists that is gone is refused: that is no edit."""
    path = Path(path)
    lines = [line for line in (path / manifest_name).read_text().splitlines() if line]
    names = [line.split(" ", 2)[-1] for line in lines]
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}, which its manifest lists: restore it, or retrain")
    changed = changed_files(path, lines)
    _check_readable(path, changed)
    if changed:
        atomic_write_text(path / manifest_name, manifest(path, names))
    return changed


def trust_checkpoint(path: str | os.PathLike) -> bool:
    """Write the manifest of complete checkpoint ``path``'s files as they are now into its COMPLETE
    marker, so a run resumes from it; False when it has one already (left as it is).

    For checkpoints of an older omrl, whose files nothing can check: the user, who knows where they
    have been, vouches for them; from then on any change to them is found."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(no_such_checkpoint(path))
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker); expected a "
            f"directory like <output_dir>/{CHECKPOINTS_DIR}/step-00000012"
        )
    first = step_line(path)
    if not first:
        raise CheckpointError(
            f"{path}'s {COMPLETE_MARKER} marker is empty or cut: no omrl finished writing it, so it cannot be "
            "vouched for; resume from the checkpoint before it"
        )
    if has_manifest(path):
        return False
    _check_readable(path, ["its files"])
    tmp = path / f".{COMPLETE_MARKER}.tmp-{os.getpid()}"
    tmp.write_text(marker_text(first, directory_manifest(path)))
    fsync_tree(path)
    os.replace(tmp, path / COMPLETE_MARKER)
    fsync_dir(path)
    return True


def _check_readable(path: Path, vouched: list[str]) -> None:
    """Refuse to vouch for ``vouched`` files of ``path`` when a weights file there cannot be read whole: a cut
    file vouched for would be loaded as whole, and fail (or worse) later."""
    problem = unreadable_weights(path) if vouched else None
    if problem:
        raise CheckpointError(f"cannot vouch for {path}: {problem}, a damaged or cut file; restore it, or retrain")


def _remove(path: Path) -> None:
    """Rename away first: a crash while deleting must not leave a complete-looking checkpoint."""
    trash = path.with_name(f".deleting-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    fsync_dir(path.parent)
    _delete(trash)


def _delete(path: Path) -> None:
    """A folder and what it holds, or a file (one left where a checkpoint goes): best effort."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _rng_state() -> dict[str, Any]:
    version, mt_state, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [version, list(mt_state), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- finding and loading ----------------------------------------------------------------------------


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
    strategy: Strategy | None = None,
) -> Checkpoint:
    """Restore the model, optimizer, scheduler and random states from ``path`` in place.

    ``strategy``: the :class:`~omrl.parallel.Strategy` the model runs under (one process when
    not given); a sharded one loads the checkpoint's whole weights and optimizer state into
    this process's shards.
    """
    path = Path(path)
    strategy = strategy or Strategy()
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    load_model_weights(model, path / "model", strategy)
    if optimizer is not None:
        state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        _check_optimizer_layout(path, state, sharded=strategy.sharded)
        try:
            strategy.load_optimizer_state(optimizer, state)
        except ValueError as err:
            raise CheckpointError(f"{path}: {err}") from err
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
        # the rate at this step under this run's schedule shape (its length), not the saved one's: a run extended
        # (more epochs or steps) would take its first new update at the old schedule's last rate (0 at a
        # cosine's end); the peak rate (base_lrs) is the saved run's, as the config check keeps it
        scheduler.last_epoch -= 1
        with warnings.catch_warnings():  # torch warns of a step before the optimizer's where none was applied yet
            warnings.simplefilter("ignore")
            scheduler.step()
    if restore_rng:
        _set_rng_state(torch.load(path / "rng.pt", map_location="cpu", weights_only=True))
    state = json.loads((path / "state.json").read_text())
    saved_in = state.get("processes")  # None: an older omrl's checkpoint
    if saved_in is not None and saved_in != strategy.world_size and strategy.is_main:
        warnings.warn(
            f"resuming in {strategy.world_size} process(es) a run that {saved_in} checkpointed: an RL run samples "
            "each process's tasks with a seed of its own, so from here it plays other episodes than it would have "
            f"(an SFT run's updates are the same); to continue it as it was, launch {saved_in} processes",
            stacklevel=2,
        )
    extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True) if (path / "extra.pt").exists() else {}
    return Checkpoint(path, int(state["step"]), state["data_state"], state["config"], extra)


def _check_optimizer_layout(path: Path, state: dict[str, Any], sharded: bool) -> None:
    """Sharded runs (FSDP, ZeRO-3) save optimizer states by parameter name, data parallel by
    position: refuse the other kind."""
    params = [p for group in state.get("param_groups", []) for p in group.get("params", [])]
    by_name = bool(params) and isinstance(params[0], str)
    if params and by_name != sharded:
        written, now = ("a sharded", "a data-parallel") if by_name else ("a data-parallel", "a sharded")
        raise CheckpointError(
            f"{path} was written by {written} run (FSDP or ZeRO-3 vs one process or DDP), but "
            f"this is {now} run; resume with the accelerate config the run started with"
        )


def load_model_weights(model: nn.Module, model_dir: Path, strategy: Strategy | None = None) -> None:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir} holds no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as exc:  # safetensors' own error type: a damaged header or a cut file
            raise CheckpointError(f"cannot read {file}: {exc} (a damaged or cut file)") from exc
    if (model_dir / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, weights)
        unexpected = list(result.unexpected_keys)
        missing = [k for k in result.missing_keys if "lora_" in k]
    else:
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        missing, unexpected = (strategy or Strategy()).load_weights(model, weights, ignore=tied)
    if missing or unexpected:
        raise CheckpointError(f"{model_dir} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def interrupted(output_dir: str | os.PathLike, command: str) -> Interrupted:
    """The Ctrl-C a recipe re-raises: which checkpoint was kept and how to continue from it."""
    kept = latest_checkpoint(output_dir)
    if kept is None:
        return Interrupted(
            f"interrupted before the first checkpoint of {output_dir}: nothing to resume (logging.save_steps=N "
            "checkpoints every N steps; by default only the end is)"
        )
    return Interrupted(
        f"interrupted; the newest complete checkpoint is {kept}. Continue with: {resume_command(command, output_dir)}"
    )


def resume_command(command: str, output_dir: str | os.PathLike) -> str:
    """The command line that continues run ``output_dir`` of ``omrl command``: under ``accelerate launch``
    with as many processes where this one runs in several (a resume in one would play other episodes)."""
    resume = f"omrl {command} --resume --output-dir {shlex.quote(str(output_dir))}"
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if processes < 2:
        return resume
    # a line to paste, then what omrl cannot know (accelerate keeps no trace of the config file it was given)
    return f"accelerate launch --num_processes {processes} -m {resume} (with --config_file as this run was launched)"
