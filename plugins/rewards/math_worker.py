"""math-verify run in worker processes with a deadline, so that no answer can hang its caller.

math-verify bounds its parsing and comparing with a signal alarm, which works on the main thread
only (a tool env scores its answers on worker threads) and cannot stop a computation inside C. So
`equivalent` sends the two texts to a worker process, from any thread, and waits at most
``timeout_s``. A worker that passes it is killed (another starts at the next call) and the answer
counts as not equal: an answer that cannot be checked in time is the answer's fault.

Workers are kept between calls (starting one imports sympy: about a second), at most `MAX_WORKERS`
at once; a caller waits for a free one. A worker bounds itself too, for when no one is left to kill
it: its CPU time (a job may use its deadline plus `_CPU_MARGIN_S`, then SIGXCPU ends it) and its
address space (`_MEMORY_BYTES`); it exits when its caller closes its stdin.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
import time

from omrl.errors import OmrlError
from omrl.sandbox.process import LineReader

MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
_START_TIMEOUT_S = 120.0  # importing sympy on a busy machine
_CPU_MARGIN_S = 5
_MEMORY_BYTES = 2 * 2**30  # a worker idles at about 0.4 GB of address space, 0.1 GB resident
_BOOT = "from omrl_plugins.rewards.math_worker import serve; serve()"


def equivalent(predicted: str, truth: str, timeout_s: float) -> bool:
    """math-verify's verdict on two texts (see `omrl_plugins.rewards.answers.math_equivalent`),
    False when it takes more than ``timeout_s``; safe on any thread. A worker found dead before it
    read the job (killed while idle) never judged the answer: a fresh one does.

    :raises OmrlError: when a worker cannot start (math-verify is missing, say), or a fresh one too is
        dead before it reads the job.
    """
    with _slots:
        try:
            return _judged(_take(), predicted, truth, timeout_s)
        except BrokenPipeError:  # killed while idle: the answer was never judged
            pass
        try:
            return _judged(_Worker(), predicted, truth, timeout_s)
        except BrokenPipeError:
            raise OmrlError("a fresh math-verify worker died before it read its job; see stderr above") from None


def _judged(worker: "_Worker", predicted: str, truth: str, timeout_s: float) -> bool:
    """``worker``'s verdict, the worker kept for the next call unless it failed (then it is closed)."""
    try:
        equal = worker.compare(predicted, truth, timeout_s)
    except BaseException:
        worker.close()
        raise
    if equal is None:  # past its deadline, or dead on the job: it is not used again
        worker.close()
        return False
    with _lock:
        _idle.append(worker)
    return equal


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self):
        # its stderr is this process's: math-verify's warnings, or why it could not start
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lines = LineReader(self.proc.stdout.fileno())
        if self._line(time.monotonic() + _START_TIMEOUT_S) != {"ready": True}:
            status = self.proc.poll()
            self.close()
            how = f"exited with status {status}" if status is not None else f"was not ready in {_START_TIMEOUT_S:g} s"
            raise OmrlError(f"the math-verify worker ({sys.executable}) {how}; its error, if any, is on stderr above")

    def compare(self, predicted: str, truth: str, timeout_s: float) -> bool | None:
        """The worker's verdict; None when it took longer than ``timeout_s`` or died on the job.

        :raises BrokenPipeError: when the worker was gone before the job reached it.
        """
        job = json.dumps({"predicted": predicted, "truth": truth, "timeout_s": timeout_s}) + "\n"
        self.proc.stdin.write(job.encode())
        self.proc.stdin.flush()
        reply = self._line(time.monotonic() + timeout_s)
        return reply.get("equal") if isinstance(reply, dict) else None

    def _line(self, deadline: float) -> object:
        """The worker's next line as JSON; None at the deadline or when it closed its end.

        :raises OmrlError: on a line that is not JSON: the replies have a stdout of their own (see
            `serve`), so such a line is the worker broken, never the answer's fault.
        """
        line = self.lines.line(deadline)
        if isinstance(line, str):
            return None
        try:
            return json.loads(line)
        except ValueError:
            self.close()
            raise OmrlError(f"the math-verify worker replied {line[:200]!r}, which is not JSON") from None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):  # a job left in the buffer of a pipe no one reads
            self.proc.stdin.close()
        self.proc.stdout.close()


_idle: list[_Worker] = []
_lock = threading.Lock()
_slots = threading.BoundedSemaphore(MAX_WORKERS)


def _take() -> _Worker:
    with _lock:
        if _idle:
            return _idle.pop()
    return _Worker()


@atexit.register
def close_workers() -> None:
    """Stop the idle workers (a busy one is killed by its caller's deadline, or by its CPU limit)."""
    with _lock:
        while _idle:
            _idle.pop().close()


# --- in the worker process -----------------------------------------------------------------------


def serve() -> None:
    """The worker's loop: a job a line on stdin, ``{"equal": bool}`` a line back."""
    from omrl_plugins.rewards.answers import compare_math, require_math_verify

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a library's print must not land in the replies
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_BYTES, _MEMORY_BYTES))
    module = require_math_verify("the math-verify worker")
    _reply(replies, {"ready": True})
    for line in sys.stdin:
        job = json.loads(line)
        _limit_cpu(job["timeout_s"])
        try:
            equal = compare_math(module, job["predicted"], job["truth"], max(1, int(job["timeout_s"])))
        except Exception:  # MemoryError, RecursionError... on the answer's account
            equal = False
        _reply(replies, {"equal": equal})


def _limit_cpu(timeout_s: float) -> None:
    """Let this job use its deadline's worth of CPU time and a margin, then SIGXCPU ends the worker."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    resource.setrlimit(resource.RLIMIT_CPU, (int(used + timeout_s) + _CPU_MARGIN_S, resource.RLIM_INFINITY))


def _reply(replies, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()
