"""A live Python interpreter in a sandbox of its own, and a pool of warm ones.

`Interpreter` starts `omrl.sandbox.driver` inside the same sandbox as `run_sandboxed` (the same
namespaces, chroot, unprivileged uid and limits; see `omrl.sandbox.run`), then runs code in it call
after call, its variables kept between calls::

    >>> with Interpreter() as python:                # doctest: +SKIP
    ...     python.run("x = 6").stdout, python.run("x * 7").stdout
    ('', '42\\n')

Starting a sandbox costs about 0.1 s; running a small cell in a started one, about a millisecond.
`InterpreterPool` keeps a few started in the background, so a caller that wants a fresh
interpreter for each call waits for none of that.

Whose fault a failure is decides how it is reported. A sandbox that cannot be set up, or an
interpreter that dies before it runs any code, raises `OmrlError` (the host's problem). Code that
raises, runs past its time or kills its interpreter (memory, CPU time, file size) is the code's:
`run` returns a `SandboxResult` saying so, and an interpreter that had to be killed is ``dead``
(its variables are gone; take another).
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import select
import selectors
import subprocess
import threading
import time
from pathlib import Path

from omrl.errors import OmrlError
from omrl.sandbox.limits import build_spec, sandbox_python
from omrl.sandbox.process import LineReader, kill_group, launch
from omrl.sandbox.run import SandboxResult, check_host, result_of

# read once: every interpreter of this process runs the driver this module was written for
_DRIVER_SOURCE = Path(__file__).with_name("driver.py").read_text(encoding="utf-8")
_GRACE_S = 2.0  # past a call's own time limit, how long the driver gets to report before it is killed
_START_TIMEOUT_S = 20.0


class Interpreter:
    """One sandboxed Python interpreter; not thread-safe (one caller at a time)."""

    def __init__(
        self,
        *,
        memory_mb: int = 256,
        max_processes: int = 4,
        max_file_mb: int = 8,
        disk_mb: int = 32,
        lifetime_s: float = 3600.0,
        cpu_time_s: int = 120,
    ):
        """Start the sandbox and wait until the interpreter is ready.

        :param memory_mb: address space of the whole run (see `run_sandboxed`); the interpreter is
            one of ``max_processes`` processes, so it gets ``memory_mb / max_processes``.
        :param lifetime_s: the sandbox is killed this long after it started, used or not.
        :param cpu_time_s: CPU seconds the interpreter may use over its whole life.
        :raises OmrlError: when the sandbox cannot be set up.
        """
        unshare = check_host()
        argv = [sandbox_python(), "-E", "-s", "/scratch/main.py"]
        spec = build_spec(
            argv,
            _DRIVER_SOURCE,
            timeout_s=lifetime_s,
            cpu_time_s=cpu_time_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            disk_mb=disk_mb,
        )
        self.started, self.lifetime_s = time.monotonic(), lifetime_s
        self.proc, self._status, self.cgroup = launch(unshare, spec)
        self._lines = LineReader(self.proc.stdout.fileno())
        self.dead, self._report = False, None
        self.calls = 0
        reply = self._read_reply(time.monotonic() + _START_TIMEOUT_S, limit=4096)
        if not isinstance(reply, dict) or not reply.get("ready"):
            why = self._failure(reply)
            self.close()
            raise OmrlError(f"the Python sandbox did not start: {why}")

    def run(self, code: str, *, timeout_s: float = 5.0, max_output_chars: int = 16_384) -> SandboxResult:
        """Run ``code``; its stdout (plus a last expression's value), stderr and how it ended.

        ``exit_code`` is 0 when the code ran through, 1 when it raised or timed out. An interpreter
        the code ended or broke is ``dead`` afterwards (its variables are gone), and the result says
        why in ``killed_reason``: ``timeout`` (it would not stop), ``cpu_time``, ``file_size``,
        ``memory``, ``signal SIGSEGV``..., ``exited`` (the code ended the interpreter) or ``protocol``
        (the code wrote to the interpreter's own reply channel, or forked a second REPL). Each stream
        keeps at most ``max_output_chars`` characters, stdout its start and stderr its end; a cut
        stream ends (stdout) or starts (stderr) with a note saying how long it was.

        :raises OmrlError: when the sandbox itself failed (the host's problem, not the code's).
        """
        if self.dead:
            raise OmrlError("this sandboxed interpreter was killed; start another")
        if timeout_s <= 0 or max_output_chars <= 0:
            raise OmrlError(f"timeout_s and max_output_chars must be positive, got {timeout_s}, {max_output_chars}")
        self.calls += 1
        deadline = time.monotonic() + timeout_s + _GRACE_S
        nonce = secrets.token_hex(16)  # unknown to the code until this request reaches the driver
        request = {
            "id": self.calls,
            "nonce": nonce,
            "code": code,
            "timeout_s": timeout_s,
            "max_chars": max_output_chars,
        }
        written = self._write((json.dumps(request) + "\n").encode(), deadline)
        if written == "eof":
            return self._exited()
        if not written:  # the driver does not read: something the code left running holds it
            return self._stop("timeout")
        reply = self._reply_to(self.calls, deadline, limit=_reply_limit(max_output_chars))
        if reply is None:
            return self._stop("timeout")
        if reply == "eof":
            return self._exited()
        if not _well_formed(reply, self.calls, nonce):
            return self._stop("protocol")
        return _result(reply, max_output_chars)

    def _reply_to(self, call: int, deadline: float, limit: int) -> dict | str | None:
        """The next reply that is not the driver's late answer to an earlier call (the code forged
        that call's reply, so the real one comes after it); see `_read_reply` for the rest."""
        while True:
            reply = self._read_reply(deadline, limit)
            late = isinstance(reply, dict) and isinstance(reply.get("id"), int) and reply["id"] < call
            if not late:
                return reply

    def _write(self, data: bytes, deadline: float) -> bool | str:
        """Send a request without ever blocking past ``deadline``: True when sent, False at the
        deadline, "eof" when the driver closed its end."""
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    return False
                try:
                    view = view[os.write(fd, view[: select.PIPE_BUF]) :]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError):
                    return "eof"
        return True

    def _read_reply(self, deadline: float, limit: int) -> dict | str | None:
        """The driver's next line as JSON (anything else: "bad"); "eof" when it closed its end;
        None at the deadline; "bad" past ``limit`` bytes without a line end."""
        line = self._lines.line(deadline, limit)
        if isinstance(line, str):
            return {"late": None, "eof": "eof"}.get(line, "bad")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):  # whatever the code wrote there: never the host's error
            return "bad"

    def _stop(self, reason: str) -> SandboxResult:
        """Kill the sandbox because of what the code did; say so in the result."""
        self._end()
        why = {
            "timeout": "the code ran past its time and would not stop",
            "protocol": "the code wrote to the interpreter's own reply channel (or forked a second interpreter)",
        }[reason]
        return SandboxResult(
            "", f"[omrl sandbox: {why}; the interpreter was stopped]\n", -9, reason == "timeout", reason
        )

    def _exited(self) -> SandboxResult:
        """The driver closed its end: read how it ended (the code ended it, or a limit killed it);
        OmrlError when the sandbox itself failed or reached its lifetime."""
        try:
            self.proc.wait(timeout=_GRACE_S)  # the helper reports once the driver has exited
        except subprocess.TimeoutExpired:
            return self._stop("protocol")  # it closed its reply channel and runs on
        oom_killed = bool(self.cgroup and self.cgroup.oom_kills())
        status = self._end()
        if not status or "error" in status or status.get("backstop"):
            raise OmrlError(f"the Python sandbox failed while running code: {self._failure(status)}")
        result = result_of(status, b"", b"", False, False, oom_killed)
        reason = result.killed_reason or "exited"
        return SandboxResult(
            "", f"[omrl sandbox: the interpreter ended: {reason}]\n", result.exit_code or -1, False, reason
        )

    def _failure(self, reply: object) -> str:
        """Why the sandbox did not come up or failed: the helper's report, or what it wrote to stderr."""
        status = self._end()
        if isinstance(status, dict) and "error" in status:
            return status["error"]
        if isinstance(status, dict) and status.get("backstop"):
            return f"it reached its lifetime of {self.lifetime_s:g} s"
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        return err.strip() or (f"it exited with status {status.get('exit_code')}" if status else f"no answer ({reply})")

    def _end(self) -> dict | None:
        """Kill the sandbox (if alive), reap it and read the helper's report (None if none)."""
        if self.dead:
            return self._report
        self.dead = True
        if self.proc.poll() is None:
            kill_group(self.proc)
        self.proc.wait()
        if self.cgroup:
            self.cgroup.remove()
        raw = self._status.read()
        self._status.close()
        try:
            self._report = json.loads(raw) if raw else None
        except ValueError:
            self._report = None
        return self._report

    def age(self) -> float:
        """Seconds since the sandbox started."""
        return time.monotonic() - self.started

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def close(self) -> None:
        """Kill the sandbox and free its pipes."""
        self._end()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    def __enter__(self) -> Interpreter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reply_limit(max_output_chars: int) -> int:
    """The longest reply line a call may get: two streams of ``max_output_chars`` characters each, at 12 bytes
    a character at worst (JSON's ``ensure_ascii`` writes an emoji as two ``\\uXXXX`` escapes), and the rest."""
    return 2 * 12 * max_output_chars + 4096


def _well_formed(reply: object, call: int, nonce: str) -> bool:
    """Whether a reply is the driver's answer to call number ``call`` (with its nonce), every field of its type."""
    if not isinstance(reply, dict) or reply.get("id") != call or reply.get("nonce") != nonce:
        return False
    return (
        all(isinstance(reply.get(key), str) for key in ("stdout", "stderr"))
        and all(isinstance(reply.get(key), bool) for key in ("error", "timed_out", "stdout_cut", "stderr_cut"))
        and all(type(reply.get(key)) is int for key in ("stdout_bytes", "stderr_bytes"))
    )


def _result(reply: dict, max_chars: int) -> SandboxResult:
    """A well-formed reply as a SandboxResult, a cut stream saying how long it was."""
    out, err = reply["stdout"], reply["stderr"]
    note = "[omrl sandbox: {} was {:,} bytes; only its {} {:,} characters are shown]\n"
    if reply["stdout_cut"]:
        out += "\n" + note.format("stdout", reply["stdout_bytes"], "first", max_chars)
    if reply["stderr_cut"]:
        err = note.format("stderr", reply["stderr_bytes"], "last", max_chars) + err
    timed_out = reply["timed_out"]
    truncated = reply["stdout_cut"] or reply["stderr_cut"]
    return SandboxResult(out, err, 1 if reply["error"] else 0, timed_out, "timeout" if timed_out else None, truncated)


class InterpreterPool:
    """Keeps ``size`` started interpreters ready; `take` hands one out (starting one at once when
    none is ready) and a background thread starts its replacement. Thread-safe."""

    def __init__(self, size: int = 2, **limits):
        if size < 0:
            raise OmrlError(f"an interpreter pool's size must be 0 or more, got {size}")
        self.size, self.limits = size, limits
        self._ready: collections.deque[Interpreter] = collections.deque()
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._fill, name="omrl-sandbox-pool", daemon=True)
        if size:
            self._thread.start()
            self._wanted.set()

    def take(self) -> Interpreter:
        """A started interpreter, used by no one (start one now if none is ready)."""
        stale, found = [], None
        with self._lock:
            while self._ready and found is None:
                interpreter = self._ready.popleft()
                # one that waited half its lifetime is dropped: it must not die of old age mid-call
                if interpreter.alive() and interpreter.age() < interpreter.lifetime_s / 2:
                    found = interpreter
                else:
                    stale.append(interpreter)
        self._wanted.set()
        for interpreter in stale:  # killed outside the lock: other callers need not wait for it
            interpreter.close()
        return found or Interpreter(**self.limits)

    def _fill(self) -> None:
        while not self._closed:
            self._wanted.wait()
            self._wanted.clear()
            while not self._closed and len(self._ready) < self.size:
                try:
                    interpreter = Interpreter(**self.limits)
                except OmrlError:  # `take` starts its own, and raises the reason then
                    break
                with self._lock:
                    if self._closed:
                        interpreter.close()
                        return
                    self._ready.append(interpreter)

    def close(self) -> None:
        """Stop refilling and kill the ready interpreters."""
        self._closed = True
        self._wanted.set()
        with self._lock:
            while self._ready:
                self._ready.popleft().close()
