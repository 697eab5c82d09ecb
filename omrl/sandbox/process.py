"""The sandbox's processes: starting the helper in new namespaces (:func:`launch`), feeding and reading
a run's pipes until it ends or its time is up (:func:`pump`), reading a long-lived child's replies a line at a
time (:class:`LineReader`), and killing it whole (:func:`kill_group`)."""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from omrl.errors import OmrlError
from omrl.sandbox.cgroup import MemoryCgroup
from omrl.sandbox.limits import SANDBOX_PATH

UNSHARE_FLAGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--propagation", "private")
KILL_GRACE_S = 5.0  # after killing the group, wait this long at most for the pipes to close
CUT_NOTE = b"\n[omrl sandbox: output truncated after %d bytes]\n"


def launch(unshare: str, spec: dict) -> tuple[subprocess.Popen, BinaryIO, MemoryCgroup | None]:
    """Start the helper in new namespaces and send it the spec. Returns the process (its stdin,
    stdout and stderr are the program's), the read end of the pipe of the helper's report (the
    helper kills the run when no one holds it any more) and the run's memory cgroup, which the
    caller removes once the process has exited (None where the host lets omrl create none)."""
    cgroup = MemoryCgroup.create((spec["memory_mb"] + spec["disk_mb"]) * 2**20)
    spec = {**spec, "cgroup_procs": cgroup.procs if cgroup else None}
    spec_r, spec_w = os.pipe()
    status_r, status_w = os.pipe()
    package_parent = str(Path(__file__).resolve().parents[2])
    bootstrap = (
        f"import sys; sys.path.insert(0, {package_parent!r}); "
        f"from omrl.sandbox.child import main; main({spec_r}, {status_w})"
    )
    try:
        proc = subprocess.Popen(
            [unshare, *UNSHARE_FLAGS, "--", sys.executable, "-I", "-S", "-c", bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(spec_r, status_w),
            start_new_session=True,
            cwd="/",
            env={"PATH": SANDBOX_PATH},
        )
    except OSError as e:
        os.close(spec_w)
        os.close(status_r)
        if cgroup:
            cgroup.remove()
        raise OmrlError(f"the sandbox could not start {unshare}: {e}") from e
    finally:
        os.close(spec_r)
        os.close(status_w)
    send_spec(spec_w, spec)
    return proc, os.fdopen(status_r, "rb"), cgroup


def send_spec(fd: int, spec: dict) -> None:
    """Write the spec to the helper; if ``unshare`` already failed, `result_of` reports its message."""
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(spec).encode())
    except BrokenPipeError:
        pass


def pump(proc: subprocess.Popen, stdin: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read stdout and stderr until both close, killing the run at ``deadline`` (monotonic).

    Past ``cap`` bytes a stream is still read (so the program never blocks on a full pipe) but dropped.
    Returns (stdout, stderr, truncated, timed_out).
    """
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cut = set()
    timed_out = False
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        if pending:
            selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                kill_group(proc)
                timed_out, deadline, left = True, deadline + KILL_GRACE_S, KILL_GRACE_S
            elif left <= 0:
                break  # killed and still open: something outside the namespace holds the pipe
            for key, _ in selector.select(timeout=left):
                if key.fd not in kept:
                    pending = _write_some(proc, selector, pending)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                room = cap - len(kept[key.fd])
                kept[key.fd] += chunk[:room]
                if len(chunk) > room:
                    cut.add(key.fd)
    if not proc.stdin.closed:
        proc.stdin.close()
    out, err = (bytes(kept[fd]) + (CUT_NOTE % cap if fd in cut else b"") for fd in kept)
    return out, err, bool(cut), timed_out


def _write_some(proc: subprocess.Popen, selector: selectors.BaseSelector, pending: memoryview) -> memoryview:
    """Write what a writable pipe takes without blocking (PIPE_BUF); close stdin when all is written,
    or when the program closed its end."""
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[: select.PIPE_BUF]) :]
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        selector.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


class LineReader:
    """A child's output pipe read one line at a time, each waited for until a deadline; what a read brings
    past a line's end is kept for the next line."""

    def __init__(self, fd: int):
        self.fd, self._kept = fd, b""

    def line(self, deadline: float, limit: int = 0) -> bytes | str:
        """The next line, without its newline; else why there is none: "late" at ``deadline``, "eof" when the
        child closed its end, "long" past ``limit`` bytes without a line end (0: no limit)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while (end := self._kept.find(b"\n")) < 0:
                if limit and len(self._kept) > limit:
                    return "long"
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    return "late"
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return "eof"
                self._kept += chunk
        line, self._kept = self._kept[:end], self._kept[end + 1 :]
        return line


def wait_until(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for the run to end; kill it at ``deadline``. Returns whether it had to be killed."""
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
        return False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``unshare`` and the helper; the helper's death takes the whole PID namespace with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
