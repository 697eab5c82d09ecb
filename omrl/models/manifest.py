"""Manifests: one ``sha256 <digest> <path>`` line per file of a directory, so a file damaged after it
was written (a flipped byte in the weights) is found before it is used. A checkpoint keeps its
manifest in its ``COMPLETE`` marker (:mod:`omrl.training.checkpoint`); a final model keeps one
beside its weights (:mod:`omrl.models.loading`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

from omrl.errors import short_repr

COMPLETE_MARKER = "COMPLETE"  # a checkpoint's last file: its step, then its manifest


def manifest(directory: Path, names: Iterable[str]) -> str:
    """One ``sha256 <digest> <name>`` line per file ``names`` (relative to ``directory``): what
    :func:`manifest_damage` checks."""
    return "".join(f"sha256 {digest(directory / name)} {name}\n" for name in names)


def directory_manifest(directory: Path) -> str:
    """The manifest of every file under ``directory`` but a COMPLETE marker."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    return manifest(directory, [file.relative_to(directory).as_posix() for file in files])


def manifest_damage(directory: Path, lines: Iterable[str]) -> str | None:
    """The first file of the manifest ``lines`` that is missing under ``directory`` or changed since the
    manifest was written, said in words, or None when every one is as it was."""
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] != "sha256":
            return f"its manifest line {short_repr(line)} is not 'sha256 <digest> <path>' (damaged manifest?)"
        _, expected, name = parts
        if not (directory / name).is_file():
            return f"{name} is missing"
        if digest(directory / name) != expected:
            return f"{name} changed since it was written (damaged file?)"
    return None


def changed_files(directory: Path, lines: Iterable[str]) -> list[str]:
    """The files of manifest ``lines`` whose content differs from the digest written for them."""
    out = []
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) == 3 and (directory / parts[2]).is_file() and digest(directory / parts[2]) != parts[1]:
            out.append(parts[2])
    return out


def digest(file: Path) -> str:
    """The sha256 of ``file``'s bytes, in hex."""
    with open(file, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def unreadable_weights(directory: Path) -> str | None:
    """The first weights file under ``directory`` that cannot be read whole (a ``.safetensors`` whose
    header does not cover the file, a ``.pt`` torch cannot load), said with why; None when all read.
    What ``omrl checkpoint trust`` checks before it vouches for files nothing else can check."""
    for file in sorted(directory.rglob("*")):
        try:
            if file.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(file), "pt"):
                    pass
            elif file.suffix == ".pt":
                import torch

                torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - each library's own error for a cut or garbled file
            return f"{file.relative_to(directory).as_posix()} cannot be read ({str(exc).splitlines()[0][:200]})"
    return None
