"""Sessions with MCP servers: one per env instance, each served by a task on one background event loop.

The mcp SDK is asyncio (anyio) code whose context managers (``stdio_client``, the streamable-HTTP
client, ``ClientSession``) must be entered and left in one task. So a :class:`Connection` is one
long-lived task on the process's session loop (a daemon thread that every instance shares): it opens
the transport and the session, lists the server's tools, then answers the requests the env's
thread queues, one at a time, each under its deadline. Leaving the task closes the session; for a
stdio server the SDK then closes its stdin, and after 2 s sends SIGTERM, then SIGKILL, to its process
group, so no server outlives its connection (should the task not end, :meth:`Connection.close` ends that
group itself when it gives up waiting). On Linux the server runs under :mod:`.reaper`, which
also ends what the server started (a ``setsid`` grandchild too) and dies with omrl, even a SIGKILLed one.

A connection that failed (the server could not start, died, or did not answer in time) is closed, and
the request raises :class:`ServerLost` (an :class:`omrl.envs.EnvError`) naming the server, the request
and why, with the end of the server's stderr; the env opens a new connection at its next reset. An
error answer from a live server (a JSON-RPC error) is :class:`ErrorAnswer`, and the session goes on.

Only this module and :mod:`.sdk`, which reads mcp 1.x (from 1.20) and 2.x alike, touch the SDK.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from omrl.config.redaction import hide, is_secret_key, redact_argv, redact_text
from omrl.envs import EnvError
from omrl_plugins.envs.background_loop import ProcessLoop
from omrl_plugins.envs.mcp.sdk import (
    CONNECTION_CLOSED,
    SERVER,
    ToolOutcome,
    call_tool,
    describe_failure,
    http_client,
    list_tools,
    mcp_error,
    quiet_stdout_noise,
)

SLACK = 5.0  # seconds the env's thread waits past a deadline that the loop enforces itself
STOP_WAIT = 10.0  # a stdio server's shutdown takes at most ~6.5 s (the SDK's stdin close, SIGTERM, SIGKILL)
KILL_GRACE = 2.0  # seconds close()'s backstop gives a server's process group between SIGTERM and SIGKILL
STDERR_TAIL = 800  # characters of a server's stderr quoted in an error
INVALID_PARAMS = -32602  # JSON-RPC: the request's arguments are wrong
REAPER = Path(__file__).with_name("reaper.py")
MIN_HIDDEN = 12  # characters of an environment value hidden in errors even when its name says nothing


class ServerLost(EnvError):
    """The connection failed (the server could not start, died, or did not answer in time) and is closed."""


class ErrorAnswer(Exception):
    """The server answered a request with a JSON-RPC error; the connection lives on."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code, self.message = code, message


@dataclass(frozen=True)
class ServerSpec:
    """Where the server is: a stdio command (its argv, extra environment variables) or a streamable-HTTP url."""

    argv: tuple[str, ...] = ()
    url: str = ""
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        # quoted by every error, so by each episode's env_error: a secret in the command (--api-key X) is not
        if self.url:
            return f"MCP server {redact_text(self.url)}"
        return f"MCP server `{shlex.join(redact_argv(self.argv))}`"

    def hide(self, text: str) -> str:
        """``text`` (the server's stderr, an error) without the secrets this spec holds: its command's, and
        the values of its environment that name a secret or are long enough to be one."""
        found: list[str] = []
        redact_argv(self.argv, found)
        redact_text(self.url, found)
        found += [value for name, value in self.env if is_secret_key(name) or len(value) >= MIN_HIDDEN]
        return hide(text, found)


@dataclass
class _Request:
    """One request for the session task: what it is (for messages), how to run it, its deadline."""

    what: str
    run: Callable[[Any], Awaitable[Any]]
    timeout: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def fail(self, problem: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(problem)


# -- the event loop ----------------------------------------------------------------------------
_sessions = ProcessLoop("omrl-mcp-sessions")
_open: weakref.WeakSet[Connection] = weakref.WeakSet()


def session_loop() -> asyncio.AbstractEventLoop:
    """The process's MCP session loop, started on first use (and again in a forked child)."""
    return _sessions.get()


@atexit.register
def _close_all() -> None:
    """Stop the servers of connections nobody closed, before the loop's daemon thread dies with the process:
    all are told at once, then waited for together (a hung server costs seconds once, not once each)."""
    connections = list(_open)
    for connection in connections:
        connection.stop()
    for connection in connections:
        connection.close()


# -- one session -------------------------------------------------------------------------------
class Connection:
    """One MCP session (and, over stdio, one server process), held by a task on the session loop."""

    def __init__(self, spec: ServerSpec, start_timeout: float):
        self.spec, self.start_timeout = spec, start_timeout
        self.tools: list[dict[str, Any]] = []
        self._pid = os.getpid()  # a forked child has the object but not the loop thread that serves it
        self._loop = session_loop()
        self._queue: asyncio.Queue[_Request | None] = asyncio.Queue()
        # the server's stderr, quoted when it fails (read through a handle of our own: the server's
        # shares this one's file offset)
        self._stderr = (
            tempfile.NamedTemporaryFile("w", prefix="omrl-mcp-", suffix=".log", delete=False) if spec.argv else None
        )
        self._started: concurrent.futures.Future = concurrent.futures.Future()
        self._ended = threading.Event()  # set when the task is over and the server stopped
        self._lost = ""  # why the task ended, once it did
        self._current: _Request | None = None  # the request in flight (read and written on the loop only)
        self._task = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        _open.add(self)

    @property
    def alive(self) -> bool:
        return not self._ended.is_set()

    def wait_started(self) -> list[dict[str, Any]]:
        """The server's tools once it started and answered; ServerLost (and closed) when it did not."""
        try:
            self.tools = self._started.result(self.start_timeout + SLACK)
            return self.tools
        except concurrent.futures.TimeoutError:
            self.close()
            raise ServerLost(f"{self.spec}: did not start within {self.start_timeout:g} s (start_timeout_s)") from None
        except ServerLost:
            self.close()
            raise

    def ping(self, timeout: float) -> None:
        """Check that the server answers; ServerLost when it is gone (ErrorAnswer: alive, without ping)."""
        self._request("ping", lambda session: session.send_ping(), timeout)

    def call_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> ToolOutcome:
        """Tool ``name``'s outcome; ErrorAnswer for an error answer, ServerLost when the connection failed."""
        return self._request(f"tools/call {name}", lambda session: call_tool(session, name, arguments), timeout)

    def _request(self, what: str, run: Callable[[Any], Awaitable[Any]], timeout: float) -> Any:
        """``await run(session)`` in the session task: its result, ErrorAnswer, or ServerLost."""
        request = _Request(what, run, timeout)
        self._loop.call_soon_threadsafe(self._enqueue, request)
        try:
            return request.future.result(timeout + SLACK)
        except concurrent.futures.TimeoutError:  # the loop itself is stuck: the task's own deadline did not fire
            self.close()
            raise ServerLost(f"{self.spec}: {what}: no answer within {timeout:g} s (timeout_s)") from None

    def stop(self) -> None:
        """Start ending the session without waiting: at once when a request is in flight (it fails),
        else once the requests queued before are answered."""
        if os.getpid() == self._pid and self.alive:
            self._loop.call_soon_threadsafe(self._stop_now)

    def close(self) -> None:
        """End the session (a stdio server stops) and wait for it; a stuck task is cancelled."""
        if os.getpid() != self._pid:
            return
        if self.alive:
            self.stop()
            if not self._ended.wait(STOP_WAIT):
                self._task.cancel()
                if not self._ended.wait(STOP_WAIT):  # the SDK never stopped the server: do it here
                    self._kill_server()
        _open.discard(self)
        if self._stderr is not None and not self.alive and not self._stderr.closed:
            self._stderr.close()
            with contextlib.suppress(OSError):
                os.unlink(self._stderr.name)

    def _kill_server(self) -> None:
        """close()'s backstop, when the session task did not end (so the SDK did not stop the server): end
        the process group of the reaper the server runs under (Linux): SIGTERM, on which the reaper ends
        everything below it, then SIGKILL to what is left after :data:`KILL_GRACE` seconds."""
        reaper = self._reaper_pid()
        if reaper is None:
            return
        for number in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):  # gone meanwhile
                os.killpg(reaper, number)
            deadline = time.monotonic() + KILL_GRACE
            while _running(reaper) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _running(reaper):
                return

    def _reaper_pid(self) -> int | None:
        """The pid of this connection's reaper, the child of this process whose stderr is this connection's
        log, when it is alive and leads its own process group (it does: it calls ``setsid``); else None."""
        if self._stderr is None or self._stderr.closed or not sys.platform.startswith("linux"):
            return None
        log = os.fstat(self._stderr.fileno())
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or not _running(pid := int(entry)):
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
                err = os.stat(f"/proc/{pid}/fd/2")
                leads = os.getpgid(pid) == pid
            except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
                continue
            if parent == os.getpid() and (err.st_dev, err.st_ino) == (log.st_dev, log.st_ino) and leads:
                return pid
        return None

    # -- on the session loop ---------------------------------------------------------------------
    def _stop_now(self) -> None:
        if self._current is None:  # no request in flight (or the session is closing already: a no-op then)
            self._queue.put_nowait(None)
        else:  # the stop would wait behind a request that may never be answered
            self._lost = self._lost or "the connection was closed"
            self._task.cancel()

    def _enqueue(self, request: _Request) -> None:
        if self.alive:
            self._queue.put_nowait(request)
        else:
            request.fail(ServerLost(f"{self.spec}: {request.what} failed: {self._lost}"))

    async def _serve(self) -> None:
        import anyio

        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await self._open_session(stack)
                try:
                    with anyio.fail_after(self.start_timeout):
                        await session.initialize()
                        tools = await list_tools(session)
                except TimeoutError:
                    raise TimeoutError(f"no answer within {self.start_timeout:g} s (start_timeout_s)") from None
                self._started.set_result(tools)
                while (current := await self._queue.get()) is not None:
                    self._current = current
                    answered = await self._answer(session, current)
                    self._current = None  # before any await: a stop must not cancel the SDK's shutdown below
                    if not answered:
                        break  # the connection is lost: leave the session, stopping the server
        except BaseException as exc:  # noqa: BLE001 - the transport's task group failing, a cancel: all end here
            self._lost = self._lost or self.spec.hide(f"{describe_failure(exc)}{self._stderr_tail()}")
            if not self._started.done():
                self._started.set_exception(ServerLost(f"{self.spec}: could not start: {self._lost}"))
            if self._current is not None:
                what = self._current.what
                self._current.fail(ServerLost(f"{self.spec}: {what} failed: the connection is gone: {self._lost}"))
        finally:
            self._lost = self._lost or "the connection was closed"
            if not self._started.done():
                self._started.set_exception(ServerLost(f"{self.spec}: could not start: {self._lost}"))
            while not self._queue.empty():
                if (waiting := self._queue.get_nowait()) is not None:
                    waiting.fail(ServerLost(f"{self.spec}: {waiting.what} failed: {self._lost}"))
            self._ended.set()

    async def _open_session(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        SERVER.set(self.spec)  # names the server in the SDK's log lines from this task (see quiet_stdout_noise)
        if self.spec.url:
            streams = await stack.enter_async_context(http_client()(self.spec.url))
        else:
            quiet_stdout_noise()
            argv = supervised(self.spec.argv)
            server = StdioServerParameters(command=argv[0], args=list(argv[1:]), env=dict(self.spec.env) or None)
            streams = await stack.enter_async_context(stdio_client(server, errlog=self._stderr))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))

    async def _answer(self, session: Any, request: _Request) -> bool:
        """Run one request under its deadline; False when the connection is lost with it."""
        import anyio

        try:
            with anyio.fail_after(request.timeout):
                result = await request.run(session)
        except TimeoutError:
            self._lost = f"no answer to {request.what} within {request.timeout:g} s (timeout_s)"
            request.fail(ServerLost(f"{self.spec}: {self._lost}; the connection is closed"))
            return False
        except mcp_error() as exc:
            code, message = exc.error.code, exc.error.message
            if code == CONNECTION_CLOSED:
                self._lost = f"the connection closed: the server exited or closed its output{self._stderr_tail()}"
                request.fail(ServerLost(f"{self.spec}: {request.what} failed: {self._lost}"))
                return False
            request.fail(ErrorAnswer(code, message))
        except Exception as exc:  # noqa: BLE001 - a closed stream (mcp 1), a malformed answer: not to be trusted
            self._lost = self.spec.hide(f"{describe_failure(exc)}{self._stderr_tail()}")
            request.fail(ServerLost(f"{self.spec}: {request.what} failed: {self._lost}; the connection is closed"))
            return False
        else:
            request.future.set_result(result)
        return True

    def _stderr_tail(self) -> str:
        """``; its stderr ends: ...`` with the last lines the server wrote, or "" when it wrote none."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            with open(self._stderr.name, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - 4 * STDERR_TAIL))
                text = log.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""
        if not text:
            return ""
        tail = text[-STDERR_TAIL:]
        return self.spec.hide(f"; its stderr ends: {'...' if len(tail) < len(text) else ''}{tail}")


def _running(pid: int) -> bool:
    """Whether process ``pid`` is alive (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def supervised(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` run under :mod:`.reaper` (Linux), which ties the server's life to this process's: the
    parent-death signal it asks for follows the thread that starts it, the session loop's, which lives as
    long as the process."""
    if not sys.platform.startswith("linux"):
        return argv
    return (sys.executable, "-I", "-S", str(REAPER), str(os.getpid()), "--", *argv)
