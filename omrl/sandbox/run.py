"""Run code that a model wrote, cut off from the network, the host's files and other runs.

Every env or tool that executes model-written code or commands does it through `run_sandboxed`:

    >>> result = run_sandboxed("print(6 * 7)", timeout_s=5)   # doctest: +SKIP
    >>> result.stdout, result.exit_code                        # doctest: +SKIP
    ('42\\n', 0)

What is isolated, and how (Linux, run as root; needs only util-linux's ``unshare`` and the
standard library):

- **Network**: ``unshare --net`` gives the run a network namespace of its own, holding only a
  loopback interface that is down. No connection leaves it, not even to a server on the host's
  127.0.0.1, and DNS fails (there is no resolver to reach, and no ``/etc/resolv.conf``).
- **Files**: in a private mount namespace a helper (`omrl.sandbox.child`, still root, PID 1 of a new PID
  namespace) builds a new root on a small tmpfs and chroots into it. It holds only the system's
  ``/usr`` (with ``/bin``, ``/lib``... or their symlinks), the install of the Python that runs omrl,
  ``/etc/ld.so.cache`` and ``/etc/alternatives``, a made-up ``/etc/passwd``, ``/dev/null``,
  ``/dev/zero``, ``/dev/random``, ``/dev/urandom``, a fresh ``/proc`` that shows only the run's own
  processes, and the scratch dir. All of it is read-only, nosuid and nodev except the scratch dir
  and the devices. The repository, ``/root``, ``/home``, ``/etc/shadow``, the host's ``/tmp``: none
  of it exists in there.
- **Scratch dir**: a fresh tmpfs (``disk_mb`` at most, owned by the run's uid), mounted at
  ``/scratch`` and ``/tmp``; it is cwd and HOME, and it is gone when the run ends.
- **User**: the program runs as a random unprivileged uid/gid, a new one every run, with no
  supplementary groups, no capabilities and ``no_new_privs`` (setuid binaries gain nothing; the
  mounts are nosuid anyway). So it cannot chroot out, remount, raise its limits or signal another
  run; the kernel also refuses a chrooted process a new user namespace, the usual way back to
  capabilities.
- **Limits** (rlimits, set before the program starts): memory (``memory_mb``, for the run as a
  whole, and a memory cgroup: see below), CPU seconds (``cpu_time_s``, SIGXCPU), processes and threads
  (``max_processes``: RLIMIT_NPROC counts the uid's processes, which root's would not be, and each
  run has its own uid), file size (``max_file_mb``, SIGXFSZ or EFBIG), open files, no core files.
- **Memory, in total**: rlimits are per process, and a run may have ``max_processes`` of them, so
  each gets an equal share: its address space (RLIMIT_AS) is ``memory_mb / max_processes``. As
  RLIMIT_NPROC caps the run's processes and threads together at ``max_processes``, and threads
  share their process's address space, the address space of all the run's processes together
  never passes ``memory_mb`` (at the defaults 512 MB: 8 processes of 64 MB). A program that needs
  one big process asks for fewer processes (``max_processes=1`` gives it all of ``memory_mb``).
  This holds on any Linux. A share below :data:`MIN_PROCESS_MB` is refused, since Python alone
  needs about 17 MB of address space.
- **Memory in files**: an in-memory file (``memfd_create``, System V shared memory) is in no
  address space, so the rlimits above miss it. Where the host lets omrl make a memory cgroup
  (cgroup v1's memory controller, or v2 with it enabled for this process's cgroup's children;
  `omrl.sandbox.cgroup`), the program runs in one of its own, limited to ``memory_mb + disk_mb``
  (its processes, its scratch files and any in-memory file together, swap included), and the
  kernel kills a process of the run that would pass it (``killed_reason`` ``memory``). Where it
  cannot, no such file can be made: ``memfd_create`` fails (a seccomp filter,
  `omrl.sandbox.seccomp`) and the run's IPC namespace allows no System V shared memory or message
  queue. ``/dev/shm`` does not exist in there, and the scratch tmpfs has its own size.
- **Wall time**: at ``timeout_s`` the whole process group is killed. The helper is the PID
  namespace's init, and when it dies the kernel kills everything else in the namespace, so a
  program cannot outlive its run by forking or by leaving the process group. The helper also kills
  the program itself a little after the deadline, and at once when the process that started the
  run dies, however it dies (SIGKILL included): it watches the pipe of its report, whose reading
  end only that process holds (and a child it forked without exec).
- **Environment**: only ``PATH`` and ``HOME``; also its own IPC and UTS (hostname) namespaces.
- **Output**: stdout and stderr are kept up to ``max_output_bytes`` each; past that they are read
  and dropped, the text ends with a note saying so and ``truncated`` is set.

It fails closed: not Linux, not root, no ``unshare``, or any set-up step failing (a namespace the
kernel will not create, a mount it refuses, a kernel older than 5.3, which has no pidfd) raises `OmrlError` naming what is missing. Before it
mounts anything the helper checks that its network, mount, PID, IPC and UTS namespaces are all new
ones. The code is never run unsandboxed.

What is not isolated:

- The kernel is shared. This contains buggy, greedy or curious code; it is not a VM and a kernel
  exploit gets out.
- Memory is bounded as address space, which is more than the memory really used (a thread's
  stack and malloc arena are reserved whole), so the bound is strict rather than exact. Socket
  and pipe buffers are counted by neither bound (a process's open files, 256, bound them: about
  50 MB a process). No CPU cgroup is used, so the CPU is not shared out fairly, only limited in
  time (``cpu_time_s`` per process).
- The scratch tmpfs is in RAM: ``disk_mb`` of it counts against the host's memory.
- Software under ``/usr`` is readable, and ``/proc`` shows the host's CPU, memory, uptime and kernel
  version. Python comes with its standard library and whatever its base install holds (pip, say);
  a venv's packages are not there.
- The run's uid is random, not reserved: a host file owned by that same number would still be out
  of reach (no host files are visible), but two runs could in theory draw the same uid and share
  their process limit.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from omrl.errors import OmrlError
from omrl.sandbox.cgroup import MemoryCgroup

LANGUAGES = ("python", "shell")

# Used by both sides: omrl.sandbox.child imports them from here (this module never imports it,
# so there is no import cycle).
_SCRATCH = "/scratch"
_PATH = "/usr/local/bin:/usr/bin:/bin"

_UNSHARE_FLAGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--propagation", "private")
_NAMESPACES = ("net", "mnt", "pid", "ipc", "uts")  # what _UNSHARE_FLAGS must have made new
_UID_BASE, _UID_SPAN = 200_000_000, 800_000_000  # far above any uid a distribution hands out
_KILL_GRACE_S = 5.0  # after killing the group, wait this long at most for the pipes to close
_CUT_NOTE = b"\n[omrl sandbox: output truncated after %d bytes]\n"
MIN_PROCESS_MB = 32  # the least address space a process of a run gets: Python starts in about 17 MB


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended."""

    stdout: str
    """What the program wrote to stdout (decoded as UTF-8, bad bytes replaced), cut at the cap."""
    stderr: str
    """The same for stderr."""
    exit_code: int
    """The exit status; minus the signal's number when a signal ended it (-9 after a timeout)."""
    timed_out: bool
    """True when the wall-time limit was reached and the run was killed."""
    killed_reason: str | None
    """Why the run was stopped: ``timeout``, ``cpu_time``, ``file_size``, ``signal SIGSEGV``...;
    None when the program exited by itself."""
    truncated: bool = False
    """True when stdout or stderr was longer than the cap; the text ends with a note saying so."""


def run_sandboxed(
    command: str | Sequence[str],
    *,
    language: str = "python",
    stdin: str | bytes | None = None,
    timeout_s: float = 10.0,
    cpu_time_s: int | None = None,
    memory_mb: int = 512,
    max_processes: int = 8,
    max_file_mb: int = 16,
    disk_mb: int = 64,
    max_output_bytes: int = 64 * 1024,
) -> SandboxResult:
    """Run model-written code isolated from the host (see the module docstring for what that means).

    :param command: Python source or a shell script (a string, read as ``language`` says), or an
        argv list run as is (looked up on the sandbox's PATH; ``language`` is then not used).
    :param language: ``python`` (`sandbox_python`: the Python that runs omrl, without the venv's
        packages; the source is ``/scratch/main.py``) or ``shell`` (``/bin/sh -c``).
    :param stdin: fed to the program's stdin, which is then closed.
    :param timeout_s: wall-clock limit; the whole run is killed when it is reached.
    :param cpu_time_s: CPU-seconds limit per process; default: ``timeout_s`` rounded up.
    :param memory_mb: address space of the whole run, all its processes together; each process
        gets ``memory_mb / max_processes`` of it (at least :data:`MIN_PROCESS_MB`). With its
        scratch files and in-memory files, the run holds at most ``memory_mb + disk_mb``.
    :param max_processes: processes and threads the run may have at once.
    :param max_file_mb: the largest file it may write.
    :param disk_mb: size of its scratch dir, all files together.
    :param max_output_bytes: how much of stdout, and of stderr, is kept.
    :returns: a `SandboxResult`.
    :raises OmrlError: on bad arguments, or when the isolation cannot be set up.
    """
    argv, code = _program(command, language)
    spec = build_spec(
        argv,
        code,
        timeout_s=timeout_s,
        cpu_time_s=cpu_time_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        max_file_mb=max_file_mb,
        disk_mb=disk_mb,
    )
    if max_output_bytes <= 0:
        raise OmrlError(f"run_sandboxed: max_output_bytes must be positive, got {max_output_bytes}")
    unshare = check_host()
    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    return _run(unshare, spec, data, max_output_bytes)


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
        "host_namespaces": _namespaces(),
        "timeout_s": timeout_s,
        "cpu_time_s": int(cpu_time_s or math.ceil(timeout_s)),
        "memory_mb": memory_mb,
        "process_memory_bytes": _process_share(memory_mb, max_processes),
        "max_processes": max_processes,
        "max_file_mb": max_file_mb,
        "disk_mb": disk_mb,
    }


# --- in the caller's process ---------------------------------------------------------------------


def _program(command: str | Sequence[str], language: str) -> tuple[list[str], str | None]:
    """The argv to run inside the sandbox, and the Python source to write to the scratch dir."""
    if not isinstance(command, str):
        argv = [str(a) for a in command]
        if not argv:
            raise OmrlError("run_sandboxed: the argv list is empty")
        return argv, None
    if language == "python":
        return [sandbox_python(), "-E", "-s", f"{_SCRATCH}/main.py"], command
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


def _namespaces() -> dict[str, str]:
    """This process's namespaces (``net:[4026531840]``...), which the helper's must all differ from."""
    return {name: os.readlink(f"/proc/self/ns/{name}") for name in _NAMESPACES}


def check_host() -> str:
    """The path of ``unshare``, once sure this host can build the sandbox; else an OmrlError saying why."""
    if not sys.platform.startswith("linux"):
        raise OmrlError(f"the sandbox needs Linux namespaces; this is {sys.platform}, so model-written code cannot run")
    if os.geteuid() != 0:
        raise OmrlError(
            f"the sandbox needs root to create namespaces and switch to an unprivileged uid; "
            f"running as uid {os.geteuid()}, so model-written code cannot run"
        )
    unshare = shutil.which("unshare", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin"]))
    if unshare is None:
        raise OmrlError(
            "the sandbox needs util-linux's `unshare` (apt-get install util-linux); "
            "it is not on PATH, so model-written code cannot run"
        )
    return unshare


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
            [unshare, *_UNSHARE_FLAGS, "--", sys.executable, "-I", "-S", "-c", bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(spec_r, status_w),
            start_new_session=True,
            cwd="/",
            env={"PATH": _PATH},
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
    _send_spec(spec_w, spec)
    return proc, os.fdopen(status_r, "rb"), cgroup


def _run(unshare: str, spec: dict, stdin: bytes, cap: int) -> SandboxResult:
    """Start the helper, pump the program's I/O, read how it ended."""
    proc, status_file, cgroup = launch(unshare, spec)
    with proc, status_file:
        try:
            deadline = time.monotonic() + spec["timeout_s"]
            out, err, truncated, timed_out = _pump(proc, stdin, deadline, cap)
            if not timed_out:  # both pipes are closed, but a program can close them and go on running
                timed_out = _wait_until(proc, deadline)
        finally:
            if proc.poll() is None:  # only after an exception above: never leave a run behind
                kill_group(proc)
            proc.wait()
            oom_killed = bool(cgroup and cgroup.oom_kills())
            if cgroup:
                cgroup.remove()
        raw_status = status_file.read()
    status = json.loads(raw_status) if raw_status else None
    return result_of(status, out, err, truncated, timed_out, oom_killed)


def _send_spec(fd: int, spec: dict) -> None:
    """Write the spec to the helper; if ``unshare`` already failed, `result_of` reports its message."""
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(spec).encode())
    except BrokenPipeError:
        pass


def _pump(proc: subprocess.Popen, stdin: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
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
                timed_out, deadline, left = True, deadline + _KILL_GRACE_S, _KILL_GRACE_S
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
    out, err = (bytes(kept[fd]) + (_CUT_NOTE % cap if fd in cut else b"") for fd in kept)
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


def _wait_until(proc: subprocess.Popen, deadline: float) -> bool:
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


def result_of(
    status: dict | None, out: bytes, err: bytes, truncated: bool, timed_out: bool, oom_killed: bool = False
) -> SandboxResult:
    """Turn the helper's report (None if it never wrote one) into a SandboxResult, or an OmrlError
    if the sandbox was never set up. ``oom_killed``: the kernel killed a process of the run for
    passing its memory cgroup's limit."""
    if status and "error" in status:
        raise OmrlError(f"the sandbox could not be set up, so the code was not run: {status['error']}")
    if status is None and not timed_out:
        why = err.decode(errors="replace").strip() or "no message"
        raise OmrlError(
            f"the sandbox could not be set up (is this a container that forbids namespaces?), "
            f"so the code was not run: {why}"
        )
    if timed_out or status["backstop"]:
        exit_code, reason, timed_out = -signal.SIGKILL, "timeout", True
    else:
        exit_code, reason = status["exit_code"], _signal_reason(status["exit_code"])
        if oom_killed and exit_code == -signal.SIGKILL:
            reason = "memory"
    return SandboxResult(_text(out), _text(err), exit_code, timed_out, reason, truncated)


def _signal_reason(exit_code: int) -> str | None:
    """Name why a signal ended the program (an exit code of minus its number); None for a plain exit."""
    if exit_code >= 0:
        return None
    number = -exit_code
    if number == signal.SIGXCPU:
        return "cpu_time"
    if number == signal.SIGXFSZ:
        return "file_size"
    try:
        return f"signal {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
