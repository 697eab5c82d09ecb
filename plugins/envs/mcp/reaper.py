"""The process a stdio MCP server runs under on Linux: it ties the server's life, and the life of
everything the server starts, to omrl's.

:mod:`.client` runs it as ``python -I -S reaper.py OMRL_PID -- SERVER ARGS...`` (it imports only the
standard library, so it starts in milliseconds). It

- asks the kernel for SIGTERM when omrl dies (``PR_SET_PDEATHSIG``): a SIGKILLed omrl takes it along, and
  it takes the server along, even one blocked in a call that reads no end-of-input;
- becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``): what the server starts and leaves behind, a
  grandchild in a session of its own (``setsid``) too, is reparented to it rather than to init, so it
  stays findable below it;
- starts the server on its stdin, stdout and stderr, set to die with the reaper, and lets go of its
  own copies of stdin and stdout (the server's end of output is the end of the pipe);
- once the server exits, or it is told to stop (omrl's close sends SIGTERM to the process group; omrl's
  death sends it the parent-death signal), ends every process still below it: SIGTERM, then SIGKILL
  after :data:`GRACE` seconds.

It exits with the server's status (128 + the signal for a server a signal ended).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE = 1.0  # seconds the processes left behind get between SIGTERM and SIGKILL
STOPPED = 128 + signal.SIGTERM  # the status when told to stop before the server exited


class _Stop(Exception):
    """A signal told the reaper to stop."""


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: reaper.py OMRL_PID -- SERVER [ARGS...]\n")
        return 2
    omrl, server_argv = int(argv[1]), argv[3:]
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != omrl:  # omrl died before the request took effect
        return STOPPED
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        os.setsid()  # its own process group (already so when the SDK started it in a new session)
    except OSError:
        pass
    server = _start(server_argv)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, _stop)
    _let_go_of_stdio()
    try:
        return _wait_for(server)
    except _Stop:
        return STOPPED
    finally:
        _end_descendants()


def _start(argv: list[str]) -> int:
    """Fork and exec the server, which gets SIGKILL should the reaper die first."""
    reaper = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != reaper:
            os._exit(STOPPED)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"cannot start {argv[0]}: {exc}\n".encode())
    os._exit(127)


def _stop(number: int, frame: object) -> None:
    raise _Stop


def _let_go_of_stdio() -> None:
    """Point this process's stdin and stdout at /dev/null: only the server holds the pipes to omrl."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _wait_for(server: int) -> int:
    """The server's exit status, reaping the orphans reparented here meanwhile."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == server:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _end_descendants() -> None:
    """SIGTERM every process below this one, SIGKILL what is left after the grace period; reap them all."""
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)  # a second stop (the SDK's SIGKILL escalation aside) changes nothing
    _signal_all(signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while _reap() and time.monotonic() < deadline:
        time.sleep(0.02)
    for _ in range(100):  # a process that forks while it is killed gets another round
        if not _signal_all(signal.SIGKILL):
            break
        time.sleep(0.01)
        _reap()


def _signal_all(number: int) -> int:
    """Send ``number`` to every live process below this one; how many there were."""
    found = _descendants()
    for pid in found:
        try:
            os.kill(pid, number)
        except OSError:  # gone meanwhile
            pass
    return len(found)


def _reap() -> int:
    """Reap the children that exited; how many live processes remain below this one."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return len(_descendants())


def _descendants() -> list[int]:
    """The live (not zombie) processes below this one, read from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, below = [], [os.getpid()]
    while below:
        kids = children.get(below.pop(), [])
        found += kids
        below += kids
    return found


def _prctl(option: int, value: int) -> None:
    """Set a process attribute; a kernel or sandbox that refuses it is said on stderr, and the server runs
    on without that tie (a reaper that cannot start would lose the server, not only the tie)."""
    try:
        refused = ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0
        problem = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # no libc prctl
        refused, problem = True, str(exc)
    if refused:
        os.write(2, f"omrl's MCP reaper: prctl({option}, {value}) refused ({problem})\n".encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
