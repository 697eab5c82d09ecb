"""Weights as files a generation server reads: each run's own folder (named after its host and process,
so a later run removes the folders of killed ones), versions written whole or not at all, tensors
safetensors accepts. Shared by the ``files`` (:mod:`.weight_sync`) and ``lora`` (:mod:`.lora_sync`)
weight syncs."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import torch

from omrl.atomic import readable_as_umask_allows, umask

FOLDER_PREFIX = "omrl-server-weights-"
_OWNED = re.compile(re.escape(FOLDER_PREFIX) + r"(?P<host>.+)-(?P<pid>\d+)-(?P<start>\d+)-[^-]+")


def run_folder(weight_dir: str) -> Path:
    """A folder of this run's own under ``weight_dir`` (empty: the temp folder), removed on close: runs (or
    a resumed run) sharing weight_dir never meet. Absolute, since the server resolves the path in its
    own working directory; as readable as the umask allows (mkdtemp's 0700 would shut out a server
    under another user). The folders of killed runs on this host are removed first."""
    parent = Path(weight_dir).resolve() if weight_dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_folders(parent)
    root = Path(tempfile.mkdtemp(prefix=_folder_prefix(os.getpid()), dir=parent))
    root.chmod(0o777 & ~umask())
    return root


def write_version(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """``root/name``, its files made by ``write(folder)`` in a partial folder that is renamed into place
    whole (the server never sees a half-written file), each as readable as the umask allows
    (safetensors writes 0600 whatever the umask)."""
    folder, partial = root / name, root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    write(partial)
    readable_as_umask_allows(partial)
    partial.rename(folder)
    return folder


def _folder_prefix(pid: int) -> str:
    """The start of a run's folder name: its host, its process and when that process started (a pid is
    reused; the pair is not)."""
    return f"{FOLDER_PREFIX}{socket.gethostname()}-{pid}-{_start_time(pid)}-"


def remove_stale_folders(parent: Path) -> None:
    """Remove the weight folders in ``parent`` that runs on this host left behind when killed (their
    process is gone, or is another one under a reused pid); another host's, or an older omrl's, stay."""
    for folder in parent.glob(f"{FOLDER_PREFIX}*"):
        owner = _OWNED.fullmatch(folder.name)
        if owner is None or owner["host"] != socket.gethostname() or not folder.is_dir():
            continue
        pid = int(owner["pid"])
        if not _alive(pid) or _start_time(pid) != int(owner["start"]):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _start_time(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors that share no memory (safetensors refuses tied weights as one tensor twice)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu")
        key = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone(memory_format=torch.contiguous_format) if key in seen else tensor.contiguous()
        seen.add(key)
    return out
