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
  This holds on any Linux. A share below :data:`~omrl.sandbox.limits.MIN_PROCESS_MB` is refused, since Python alone
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
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from omrl.errors import OmrlError
from omrl.sandbox.limits import LANGUAGES, build_spec, program, sandbox_python
from omrl.sandbox.process import kill_group, launch, pump, wait_until

__all__ = ["LANGUAGES", "SandboxResult", "check_host", "result_of", "run_sandboxed", "sandbox_python"]


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
        gets ``memory_mb / max_processes`` of it (at least :data:`~omrl.sandbox.limits.MIN_PROCESS_MB`). With its
        scratch files and in-memory files, the run holds at most ``memory_mb + disk_mb``.
    :param max_processes: processes and threads the run may have at once.
    :param max_file_mb: the largest file it may write.
    :param disk_mb: size of its scratch dir, all files together.
    :param max_output_bytes: how much of stdout, and of stderr, is kept.
    :returns: a `SandboxResult`.
    :raises OmrlError: on bad arguments, or when the isolation cannot be set up.
    """
    argv, code = program(command, language)
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


def _run(unshare: str, spec: dict, stdin: bytes, cap: int) -> SandboxResult:
    """Start the helper, pump the program's I/O, read how it ended."""
    proc, status_file, cgroup = launch(unshare, spec)
    with proc, status_file:
        try:
            deadline = time.monotonic() + spec["timeout_s"]
            out, err, truncated, timed_out = pump(proc, stdin, deadline, cap)
            if not timed_out:  # both pipes are closed, but a program can close them and go on running
                timed_out = wait_until(proc, deadline)
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
