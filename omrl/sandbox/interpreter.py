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
import selectors
import threading
import time
from pathlib import Path

from omrl.errors import OmrlError
from omrl.sandbox.run import SandboxResult, build_spec, check_host, kill_group, launch, result_of, sandbox_python

_DRIVER = Path(__file__).with_name("driver.py")
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
            _DRIVER.read_text(encoding="utf-8"),
            timeout_s=lifetime_s,
            cpu_time_s=cpu_time_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            disk_mb=disk_mb,
        )
        self.proc, self._status = launch(unshare, spec)
        self._buffer = b""
        self.dead = False
        self.calls = 0
        reply = self._read_reply(time.monotonic() + _START_TIMEOUT_S)
        if not isinstance(reply, dict) or not reply.get("ready"):
            why = self._failure(reply)
            self.close()
            raise OmrlError(f"the Python sandbox did not start: {why}")

    def run(self, code: str, *, timeout_s: float = 5.0, max_output_bytes: int = 16_384) -> SandboxResult:
        """Run ``code``; its stdout (plus a last expression's value), stderr and how it ended.

        ``exit_code`` is 0 when the code ran through, 1 when it raised or timed out; a killed
        interpreter gives minus the signal's number and ``killed_reason`` (``timeout``,
        ``cpu_time``, ``file_size``, ``signal SIGKILL``...), and is then ``dead``.
        """
        if self.dead:
            raise OmrlError("this sandboxed interpreter was killed; start another")
        if timeout_s <= 0 or max_output_bytes <= 0:
            raise OmrlError(f"timeout_s and max_output_bytes must be positive, got {timeout_s}, {max_output_bytes}")
        self.calls += 1
        request = {"code": code, "timeout_s": timeout_s, "max_bytes": max_output_bytes}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._killed(timed_out=False)
        reply = self._read_reply(time.monotonic() + timeout_s + _GRACE_S)
        if reply is None:
            return self._killed(timed_out=True)
        if reply == "eof":
            return self._killed(timed_out=False)
        out, err = reply["stdout"], reply["stderr"]
        if reply["truncated"]:  # the driver kept stdout's head and stderr's tail
            err += f"\n[omrl sandbox: output cut to {max_output_bytes} bytes per stream]\n"
        return SandboxResult(
            out,
            err,
            1 if reply["error"] else 0,
            bool(reply["timed_out"]),
            "timeout" if reply["timed_out"] else None,
            bool(reply["truncated"]),
        )

    def _read_reply(self, deadline: float) -> dict | str | None:
        """The driver's next line as JSON; "eof" when it closed its end; None at the deadline."""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return "eof"
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return "eof"  # not the driver speaking: treat it as a dead interpreter

    def _killed(self, timed_out: bool) -> SandboxResult:
        """Kill the sandbox and say how the call ended: at the time limit, or how the interpreter died."""
        status = self._end()
        if timed_out:
            return SandboxResult("", "", -9, True, "timeout")
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        if not status or "error" in status:
            raise OmrlError(f"the Python sandbox failed while running code: {self._failure(status, err)}")
        return result_of(status, b"", b"", False, False)

    def _failure(self, reply: object, err: str = "") -> str:
        """Why the sandbox did not come up: the helper's report, or what it wrote to stderr."""
        status = self._end()
        if isinstance(status, dict) and "error" in status:
            return status["error"]
        if not err and self.proc.stderr:
            err = self.proc.stderr.read().decode(errors="replace")
        return err.strip() or (f"it exited with status {status.get('exit_code')}" if status else f"no answer ({reply})")

    def _end(self) -> dict | None:
        """Kill the sandbox (if alive), reap it and read the helper's report (None if none)."""
        if self.dead:
            return getattr(self, "_report", None)
        self.dead = True
        if self.proc.poll() is None:
            kill_group(self.proc)
        self.proc.wait()
        raw = self._status.read()
        self._status.close()
        self._report = json.loads(raw) if raw else None
        return self._report

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
        self.start_error: OmrlError | None = None
        self._thread = threading.Thread(target=self._fill, name="omrl-sandbox-pool", daemon=True)
        if size:
            self._thread.start()
            self._wanted.set()

    def take(self) -> Interpreter:
        """A started interpreter, used by no one (start one now if none is ready)."""
        with self._lock:
            while self._ready:
                interpreter = self._ready.popleft()
                if interpreter.alive():
                    self._wanted.set()
                    return interpreter
                interpreter.close()
        self._wanted.set()
        return Interpreter(**self.limits)

    def _fill(self) -> None:
        while not self._closed:
            self._wanted.wait()
            self._wanted.clear()
            while not self._closed and len(self._ready) < self.size:
                try:
                    interpreter = Interpreter(**self.limits)
                except OmrlError as exc:
                    self.start_error = exc  # `take` starts its own and raises the reason then
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
