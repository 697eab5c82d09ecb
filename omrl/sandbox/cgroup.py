"""A memory cgroup for each sandboxed run: the bound on all the memory the run holds, files in memory included.

Rlimits bound each process's address space, and memory that is in no address space escapes them:
an in-memory file (``memfd_create``) written with ``write``, a System V shared memory segment filled
through a mapping that is then dropped, a message queue. A memory cgroup counts every page charged
to the run's processes, those included, and the kernel kills a process of the run (the OOM killer,
inside the cgroup only) when the run would pass its limit.

`MemoryCgroup.create` makes one below this process's own memory cgroup (so every limit above it
still holds), on cgroup v1's memory controller or on cgroup v2 where the memory controller is
enabled for this cgroup's children. Where the host lets it create none (no such hierarchy, or it is
not writable: a container with a read-only /sys/fs/cgroup, or cgroup v2 without the memory
controller delegated), it returns None, and the helper makes in-memory files impossible instead
(`omrl.sandbox.seccomp`, and no System V IPC).
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from pathlib import Path

_PREFIX = "omrl-sandbox-"  # then the pid of the process that made it, and a random part
_REMOVE_TRIES_S = 2.0  # after a run, how long its processes get to leave the cgroup before it is removed


class MemoryCgroup:
    """One run's memory cgroup; `procs` is the file a process writes ``0`` to to join it."""

    def __init__(self, path: Path, version: int):
        self.path, self.version = path, version
        self.procs = str(path / "cgroup.procs")

    @classmethod
    def create(cls, limit_bytes: int) -> MemoryCgroup | None:
        """A new cgroup whose processes hold at most ``limit_bytes`` of memory, swap included (None
        where this host lets this process create none, or refuses its limit)."""
        found = _parent()
        if found is None:
            return None
        parent, version = found
        _remove_stale(parent)
        path = parent / f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except OSError:
            return None
        cgroup = cls(path, version)
        try:
            cgroup._limit(limit_bytes)
        except OSError:
            cgroup.remove()
            return None
        return cgroup

    def _limit(self, limit_bytes: int) -> None:
        if self.version == 1:
            settings = {"memory.limit_in_bytes": limit_bytes, "memory.memsw.limit_in_bytes": limit_bytes}
        else:
            settings = {"memory.max": limit_bytes, "memory.swap.max": 0}
        for name, value in settings.items():  # memsw and swap.max exist only where swap is accounted
            if name in ("memory.limit_in_bytes", "memory.max") or (self.path / name).exists():
                (self.path / name).write_text(str(value))

    def oom_kills(self) -> int:
        """How many of the run's processes the kernel killed for passing the limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return 0
        return sum(int(line.split()[1]) for line in lines if line.startswith("oom_kill "))

    def remove(self) -> None:
        """Remove the cgroup once its processes are gone (they may take a moment to leave it)."""
        deadline = time.monotonic() + _REMOVE_TRIES_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return  # left behind empty; the next `create` in this parent removes it
                time.sleep(0.01)


def _parent() -> tuple[Path, int] | None:
    """This process's own memory cgroup, as a directory it may create children in, and the cgroup
    version; None when there is none."""
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in memberships:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        version = 1 if "memory" in controllers.split(",") else 2 if controllers == "" else 0
        for mount_root, mount_point in _cgroup_mounts(mounts, version) if version else ():
            if path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
                continue
            directory = Path(mount_point) / os.path.relpath(path, mount_root)
            if _usable(directory, version):
                return directory, version
    return None


def _cgroup_mounts(mounts: list[str], version: int) -> list[tuple[str, str]]:
    """(root inside the hierarchy, mount point) of each mount of the memory hierarchy of ``version``."""
    found = []
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        fstype, _, options = (rest.split() + ["", "", ""])[:3]
        if len(fields.split()) < 5:
            continue
        _, _, _, root, mount_point = fields.split()[:5]
        if (version == 1 and fstype == "cgroup" and "memory" in options.split(",")) or (
            version == 2 and fstype == "cgroup2"
        ):
            found.append((root, mount_point))
    return found


def _usable(directory: Path, version: int) -> bool:
    """Whether a child of ``directory`` would get the memory controller, and this process may make one."""
    if not os.access(directory, os.W_OK):
        return False
    if version == 1:
        return (directory / "memory.limit_in_bytes").exists()
    try:
        return "memory" in (directory / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _remove_stale(parent: Path) -> None:
    """Remove the cgroups that runs of dead processes left (a caller killed before it could); rmdir
    refuses any that still holds a process."""
    for child in parent.glob(f"{_PREFIX}*"):
        owner = child.name[len(_PREFIX) :].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                child.rmdir()
            except OSError:
                pass
