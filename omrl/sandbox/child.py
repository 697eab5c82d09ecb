"""The sandbox's helper: the code that runs inside the new namespaces, as their PID 1 and still root.

`omrl.sandbox.run_sandboxed` starts it through ``unshare`` as
``python -I -S -c "from omrl.sandbox.child import main; main(spec_fd, status_fd)"``. It reads the
run's spec (JSON) from ``spec_fd``, checks that its namespaces are all new ones, builds the new root
(read-only binds of the system's software, devices, /proc, a made-up /etc, the scratch tmpfs) and
chroots into it, forks the program with its limits (its own memory cgroup, or where there is none
no in-memory files), an unprivileged uid and ``no_new_privs``, waits for it with a backstop timer
and an eye on its caller (the program dies with it), and writes how it ended (or why set-up
failed) as JSON to ``status_fd``. The caller's side, and what the sandbox does and does not
isolate, are described in `omrl.sandbox`.

It uses only the standard library and omrl's own modules, since it runs on the base Python with
``-I -S`` (no venv, no site-packages).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import select
import signal
import time

from omrl.sandbox.limits import SANDBOX_PATH, SCRATCH
from omrl.sandbox.seccomp import deny_memfd

# Where the helper builds the new root, inside its private mount namespace: the host's /tmp is untouched.
_NEW_ROOT = "/tmp"
_BACKSTOP_S = 2.0  # the helper's own timer fires this long after the caller's deadline
_EXEC_FAILED = 127  # what a shell returns for a command it cannot run

# From <sys/mount.h> and <linux/prctl.h>; the same numbers on every Linux architecture.
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38


# --- in the sandbox: the helper, PID 1 of the new namespaces, still root ---------------------------


def main(spec_fd: int, status_fd: int) -> None:
    """Build the new root, start the program in it, wait, and report how it ended on ``status_fd``."""
    os.set_inheritable(status_fd, False)  # the program must not be able to forge the report
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.load(f)
    try:
        _check_namespaces(spec["host_namespaces"])
        # opened while the host's /sys is in reach; the program joins the cgroup before it drops root
        cgroup_fd = os.open(spec["cgroup_procs"], os.O_WRONLY) if spec["cgroup_procs"] else None
        if cgroup_fd is None:
            _close_ipc()
        _build_root(spec)
        os.chroot(_NEW_ROOT)
        os.chdir("/")
        pid = _start_program(spec, cgroup_fd)
        report = _wait(pid, spec["timeout_s"] + _BACKSTOP_S, status_fd)
    except Exception as e:  # anything here means the sandbox is not as promised: the caller raises
        report = {"error": f"{type(e).__name__}: {e}"}
    if report is None:  # the caller is gone: no one to tell
        return
    with os.fdopen(status_fd, "w") as f:
        f.write(json.dumps(report))


def _check_namespaces(host: dict[str, str]) -> None:
    """Refuse to go on (and above all to mount anything) unless every namespace is a new one."""
    shared = [name for name, ns in host.items() if os.readlink(f"/proc/self/ns/{name}") == ns]
    if shared:
        raise RuntimeError(f"the helper shares the caller's {', '.join(shared)} namespace(s)")
    if os.getpid() != 1:
        raise RuntimeError(f"the helper is pid {os.getpid()}, not the init of a new PID namespace")


def _build_root(spec: dict) -> None:
    """Mount the sandbox's root at _NEW_ROOT: system software read-only, devices, /proc, a scratch tmpfs."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted below may reach the host's namespace
    _mount("omrl-sandbox", _NEW_ROOT, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{name}"):  # merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(f"/{name}"), f"{_NEW_ROOT}/{name}")
        elif os.path.isdir(f"/{name}"):
            _bind(f"/{name}", _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    for path in [*spec["ro_paths"], "/etc/ld.so.cache", "/etc/alternatives"]:
        if os.path.exists(path):
            _bind(path, _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    _write_etc(spec["uid"])
    for device in ("null", "zero", "random", "urandom"):
        _bind(f"/dev/{device}", _MS_NOSUID | _MS_NOEXEC)
    os.mkdir(f"{_NEW_ROOT}/proc")
    _mount("proc", f"{_NEW_ROOT}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=2")
    _make_scratch(spec)
    _mount(None, _NEW_ROOT, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _bind(path: str, flags: int) -> None:
    """Show host ``path`` at the same place in the new root, with ``flags`` (which need a remount)."""
    target = _NEW_ROOT + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").close()
    _mount(path, target, None, _MS_BIND)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags)


def _write_etc(uid: int) -> None:
    """A passwd and group naming the run's user, so tools that look it up work."""
    os.makedirs(f"{_NEW_ROOT}/etc", exist_ok=True)
    with open(f"{_NEW_ROOT}/etc/passwd", "w") as f:
        f.write(f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::{SCRATCH}:/bin/sh\n")
    with open(f"{_NEW_ROOT}/etc/group", "w") as f:
        f.write(f"root:x:0:\nsandbox:x:{uid}:\n")


def _make_scratch(spec: dict) -> None:
    """A fresh tmpfs of ``disk_mb`` owned by the run's user, at /scratch and /tmp; the Python source in it."""
    scratch, uid = _NEW_ROOT + SCRATCH, spec["uid"]
    os.mkdir(scratch)
    _mount(
        "omrl-scratch",
        scratch,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={spec['disk_mb']}m,nr_inodes=16384,mode=0700,uid={uid},gid={uid}",
    )
    os.mkdir(f"{_NEW_ROOT}/tmp")
    _mount(scratch, f"{_NEW_ROOT}/tmp", None, _MS_BIND)
    if spec["code"] is not None:
        with open(f"{scratch}/main.py", "w", encoding="utf-8") as f:
            f.write(spec["code"])
        os.chown(f"{scratch}/main.py", uid, uid)


def _close_ipc() -> None:
    """No System V shared memory or message queues in this IPC namespace (the run's own): where no
    memory cgroup counts them, they would hold memory outside every process's address space."""
    for name in ("kernel/shmmni", "kernel/msgmni"):
        with open(f"/proc/sys/{name}", "w") as f:
            f.write("0")


def _start_program(spec: dict, cgroup_fd: int | None) -> int:
    """Fork the program: its memory cgroup, limits, then the unprivileged user, then exec. Returns its pid.

    A child that cannot drop its privileges reports on a close-on-exec pipe and never runs the code.
    Only the program joins the cgroup, not this helper: the kernel's OOM killer, which picks its
    victim inside the cgroup, can then end the program but never the helper that reports on it.
    """
    errors_r, errors_w = os.pipe()  # non-inheritable: a successful exec closes it
    pid = os.fork()
    if pid == 0:
        try:
            os.close(errors_r)
            if cgroup_fd is not None:
                os.write(cgroup_fd, b"0")  # "0": the process that writes; its fd is close-on-exec
            _become_sandboxed(spec)
        except BaseException as e:
            os.write(errors_w, f"setup:{type(e).__name__}: {e}".encode())
            os._exit(_EXEC_FAILED)
        try:
            os.execvpe(spec["argv"][0], spec["argv"], {"PATH": SANDBOX_PATH, "HOME": SCRATCH})
        except BaseException as e:
            os.write(errors_w, f"exec:cannot run {spec['argv'][0]!r}: {getattr(e, 'strerror', e)}".encode())
        os._exit(_EXEC_FAILED)
    os.close(errors_w)
    with os.fdopen(errors_r, "rb") as f:
        message = f.read().decode(errors="replace")
    if message.startswith("setup:"):
        os.waitpid(pid, 0)
        raise RuntimeError(f"could not drop into the sandbox: {message[len('setup:') :]}")
    if message:  # the program itself cannot run: report it as a shell would
        os.write(2, f"omrl sandbox: {message[len('exec:') :]}\n".encode())
    return pid


def _become_sandboxed(spec: dict) -> None:
    """In the forked child: set the limits, become the unprivileged user, enter the scratch dir."""
    import resource

    mb = 1024 * 1024
    limits = {  # the address space is this process's share of the run's: see omrl.sandbox, "Memory, in total"
        resource.RLIMIT_AS: spec["process_memory_bytes"],
        resource.RLIMIT_NPROC: spec["max_processes"],
        resource.RLIMIT_FSIZE: spec["max_file_mb"] * mb,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_CORE: 0,
    }
    for limit, value in limits.items():
        resource.setrlimit(limit, (value, value))
    cpu = spec["cpu_time_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL a second later
    uid = spec["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to non-root: the kernel clears every capability
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError(f"still uid {os.geteuid()} after switching to {uid}")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if spec["cgroup_procs"] is None:  # no cgroup counts in-memory files: none can be made
        deny_memfd()
    os.chdir(SCRATCH)
    os.umask(0o077)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; programs expect the default
        signal.signal(signum, signal.SIG_DFL)


def _wait(pid: int, backstop_s: float, status_fd: int) -> dict | None:
    """Wait for the program; kill it if it outlives the caller's deadline, or the caller itself.

    The caller is gone when no process holds the read end of ``status_fd`` any more (the pipe of
    this report): that happens however it died, SIGKILL included, in whichever thread it started
    the run. The program is then killed at once, and None returned: there is no one to report to.
    """
    pidfd = os.pidfd_open(pid)  # Linux 5.3+: readable once the program has exited
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(status_fd, 0)  # a pipe's write end polls POLLERR once its read end is closed
    deadline = time.monotonic() + backstop_s
    fired = caller_gone = False
    while True:
        left = deadline - time.monotonic()
        events = dict(poller.poll(math.ceil(left * 1000))) if left > 0 else {}
        if status_fd in events:
            caller_gone = True
            break
        if pidfd in events:
            break
        if left <= 0:
            fired = True
            break
    if fired or caller_gone:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    if caller_gone:
        return None
    return {"exit_code": os.waitstatus_to_exitcode(status), "backstop": fired}


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2) (Python 3.11 has no os.mount); raises OSError naming the mount."""

    def arg(s):
        return None if s is None else os.fsencode(s)

    if _libc().mount(arg(source), arg(target), arg(fstype), flags, arg(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or '(remount)'} on {target}: {os.strerror(errno)}")


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")
