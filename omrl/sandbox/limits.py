"""What one sandboxed run is: its program, its limits and the spec the helper inside the namespaces
reads (:func:`build_spec`). Imported by that helper (:mod:`omrl.sandbox.child`) too, so it needs
nothing but the standard library and :mod:`omrl.errors`."""

from __future__ import annotations

import math
import os
import secrets
import sys
from collections.abc import Sequence

from omrl.errors import OmrlError

LANGUAGES = ("python", "shell")
SCRATCH = "/scratch"  # the run's scratch dir: its cwd and HOME
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # the PATH of the helper and of the program
NAMESPACES = ("net", "mnt", "pid", "ipc", "uts")  # what omrl.sandbox.process.UNSHARE_FLAGS must have made new
_UID_BASE, _UID_SPAN = 200_000_000, 800_000_000  # far above any uid a distribution hands out
MIN_PROCESS_MB = 32  # the least address space a process of a run gets: Python starts in about 17 MB


def build_spec(
    argv: list[str],
    code: str | None,
    *,
    timeout_s: float,
    cpu_time_s: int | None,
    memory_mb: int,
    max_processes: int,
    max_file_mb: int,
    disk_mb: int,
) -> dict:
    """The helper's spec for one run (see `run_sandboxed` for the limits); OmrlError on a bad limit."""
    for name, value in [
        ("timeout_s", timeout_s),
        ("memory_mb", memory_mb),
        ("max_processes", max_processes),
        ("max_file_mb", max_file_mb),
        ("disk_mb", disk_mb),
    ]:
        if value <= 0:
            raise OmrlError(f"run_sandboxed: {name} must be positive, got {value}")
    return {
        "argv": argv,
        "code": code,
        "uid": _UID_BASE + secrets.randbelow(_UID_SPAN),
        "ro_paths": _read_only_paths(),
        "host_namespaces": host_namespaces(),
        "timeout_s": timeout_s,
        "cpu_time_s": int(cpu_time_s or math.ceil(timeout_s)),
        "memory_mb": memory_mb,
        "process_memory_bytes": _process_share(memory_mb, max_processes),
        "max_processes": max_processes,
        "max_file_mb": max_file_mb,
        "disk_mb": disk_mb,
    }


def program(command: str | Sequence[str], language: str) -> tuple[list[str], str | None]:
    """The argv to run inside the sandbox for ``command`` (see `run_sandboxed`), and the Python source to
    write to the scratch dir."""
    if not isinstance(command, str):
        argv = [str(a) for a in command]
        if not argv:
            raise OmrlError("run_sandboxed: the argv list is empty")
        return argv, None
    if language == "python":
        return [sandbox_python(), "-E", "-s", f"{SCRATCH}/main.py"], command
    if language == "shell":
        return ["/bin/sh", "-c", command], None
    raise OmrlError(f"run_sandboxed: unknown language {language!r}; valid: {', '.join(LANGUAGES)}")


def _process_share(memory_mb: int, max_processes: int) -> int:
    """Each process's address space in bytes: an equal share of ``memory_mb``, so that the run's
    ``max_processes`` processes together stay within it; OmrlError when a share is too small to
    run anything."""
    share = memory_mb * 1024 * 1024 // max_processes
    if share < MIN_PROCESS_MB * 1024 * 1024:
        raise OmrlError(
            f"run_sandboxed: memory_mb={memory_mb} shared by max_processes={max_processes} leaves "
            f"{share / 2**20:.1f} MB a process, under the {MIN_PROCESS_MB} MB a process needs; valid: "
            f"memory_mb >= {MIN_PROCESS_MB * max_processes} for {max_processes} processes, or fewer "
            "processes"
        )
    return share


def sandbox_python() -> str:
    """The Python inside the sandbox, for argv commands: the interpreter omrl runs on, outside any venv.

    Its install (``sys.base_prefix``) is what gets bound into the sandbox, read-only.
    """
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        path = os.path.join(os.path.realpath(sys.base_prefix), "bin", name)
        if os.path.exists(path):
            return path
    raise OmrlError(f"the sandbox found no Python interpreter in {sys.base_prefix}/bin")


def _read_only_paths() -> list[str]:
    """Host directories the sandbox sees, read-only: the system's software and this Python's install."""
    paths = ["/usr"]
    prefix = os.path.realpath(sys.base_prefix)
    if os.path.commonpath([prefix, "/usr"]) != "/usr":
        paths.append(prefix)
    return paths


def host_namespaces() -> dict[str, str]:
    """This process's namespaces (``net:[4026531840]``...), which the helper's must all differ from."""
    return {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}
