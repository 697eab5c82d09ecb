"""A checkpoint's ``COMPLETE`` marker: written last, it says the checkpoint is whole and lists every
file's sha256 digest (the manifest), so a resume finds a file damaged since (:func:`damage`). Its first
line is ``step N files K``; an older omrl wrote ``step N`` and no manifest, and such checkpoints are
resumed only once the user vouches for their files
(:func:`omrl.training.checkpoint.trust_checkpoint`). Which of a run's checkpoints are complete, and
whether its final model is older than the newest (:func:`final_model_behind`), are read here, without
torch: a command's checks before it loads a model use them."""

from __future__ import annotations

import os
import re
from pathlib import Path

from omrl.models.manifest import COMPLETE_MARKER, manifest_damage

CHECKPOINTS_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")
#: beside a run's final model: the step it was saved at (see :func:`final_model_behind`)
MODEL_STEP = "omrl_model.step"


def marker_text(first_line: str, manifest_text: str) -> str:
    """A COMPLETE marker: ``step N files K``, then the manifest's K lines. The count tells a marker cut
    after its first line from an older omrl's, which was ``step N`` alone."""
    count = sum(1 for line in manifest_text.splitlines() if line)
    return f"{first_line.split(' files ')[0]} files {count}\n{manifest_text}"


def _manifest_lines(path: Path) -> list[str]:
    """The manifest in checkpoint ``path``'s COMPLETE marker (after its ``step N`` line)."""
    return [line for line in (path / COMPLETE_MARKER).read_text().splitlines()[1:] if line]


def _listed_count(path: Path) -> int | None:
    """How many files checkpoint ``path``'s marker says its manifest lists (None: an older omrl's marker)."""
    _, _, count = step_line(path).partition(" files ")
    return int(count) if count.strip().isdigit() else None


def has_manifest(path: Path) -> bool:
    """Whether complete checkpoint ``path`` lists its files' digests (an older omrl's do not). A marker
    that says it lists files has a manifest, even where it was cut before them (then :func:`damage`)."""
    return bool(_manifest_lines(path)) or bool(_listed_count(path))


def damage(path: Path) -> str | None:
    """What is wrong with complete checkpoint ``path`` (a file missing or changed since it was
    written), or None. One without a manifest (an older omrl's) cannot be checked and passes here:
    :func:`~omrl.training.resume.resume_checkpoint` refuses it (see :func:`has_manifest`). A COMPLETE
    marker without its ``step N`` line (emptied, cut) is damage: every omrl writes that line; so is a
    file the manifest does not list, since it lists every file: the marker was cut after a line."""
    if not step_line(path):
        return f"its {COMPLETE_MARKER} marker is empty or cut (no 'step N' line)"
    lines = _manifest_lines(path)
    listed = {line.split(" ", 2)[-1] for line in lines}
    files = (p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    unlisted = sorted(set(files) - listed) if lines else []
    if unlisted:
        return f"its {COMPLETE_MARKER} marker is cut: its manifest does not list {unlisted[0]}"
    count = _listed_count(path)
    if count is not None and count != len(lines):
        return f"its {COMPLETE_MARKER} marker is cut: it lists {len(lines)} of its {count} files"
    return manifest_damage(path, lines)


def step_line(path: Path) -> str:
    """The ``step N`` line that opens checkpoint ``path``'s COMPLETE marker ("" when it has none)."""
    lines = (path / COMPLETE_MARKER).read_text(errors="replace").splitlines()
    return lines[0] if lines and lines[0].startswith("step ") else ""


def fsync_tree(directory: Path) -> None:
    """Every file and folder under ``directory`` to disk: what a rename then publishes is whole."""
    for dirpath, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(directory: Path) -> None:
    """A folder's entries to disk (a rename in it survives a crash)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step a checkpoint directory (``step-N``) holds, or None for any other name."""
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [
        (step, p)
        for p in root.iterdir()
        if (step := checkpoint_step(p)) is not None and (p / COMPLETE_MARKER).is_file()
    ]
    return [p for _, p in sorted(found)]


def newest_of(kept: list[Path]) -> str:
    """The newest three of a run's checkpoints, for a message that asks for one of them."""
    return ", ".join(str(p) for p in kept[-3:])


def no_such_checkpoint(path: Path) -> str:
    """``no such folder PATH``, naming the run's checkpoints where ``PATH`` is a step of a run that kept others."""
    kept = complete_checkpoints(path.parent.parent) if path.parent.name == CHECKPOINTS_DIR else []
    return f"no such folder {path}" + (f"; the run's checkpoints: {newest_of(kept)}" if kept else "")


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def final_model_step(run_dir: str | os.PathLike) -> int | None:
    """The step run folder ``run_dir``'s final model was saved at; None: it has none, an older omrl's
    (which records no step), or a damaged record (the model's manifest names the damage when it loads)."""
    try:
        return int((Path(run_dir).expanduser() / MODEL_STEP).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def finished_note(run_dir: str | os.PathLike, step: int) -> str:
    """What a resume of a run that did all its steps (``step`` the last) says: the final model is written
    again at its end, which a save cut short (Ctrl-C, a full disk) left undone."""
    note = "; it did them all"
    if final_model_step(run_dir) != step:
        note += ", but its final model was not saved after the last: it is saved now"
    return f"{note}: raise steps (or num_train_epochs) to train more"


def final_model_behind(run_dir: str | os.PathLike) -> str | None:
    """Why run folder ``run_dir``'s final model is not its newest (its run trained past the step the model
    was saved at: resumed, it stopped before it saved its model again), or None. An older omrl's final
    model records no step, and nothing is known of it."""
    run_dir = Path(run_dir).expanduser()
    saved = final_model_step(run_dir)
    if saved is None:
        return None
    newest = latest_checkpoint(run_dir)
    step = checkpoint_step(newest) if newest is not None else None
    if step is None or step <= saved:
        return None
    return (
        f"{run_dir} holds the model its run saved at step {saved}, but the run trained on to step {step} (its "
        f"newest checkpoint, {newest}) and stopped before it saved its model again: this plays the step-{saved} "
        "model; to play the newest, finish the run: the command that started it, with --resume"
    )
