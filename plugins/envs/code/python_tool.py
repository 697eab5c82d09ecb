"""The ``python`` tool: model-written code run in omrl's sandbox, its output the tool's result.

Each call runs in a fresh interpreter by default (nothing carries over, so a call's result depends
on its code alone); ``persistent=True`` keeps one live interpreter per episode, so variables and
imports carry from call to call, as in a notebook. Either way the interpreter is sandboxed
(`omrl.sandbox`: no network, no host files, an unprivileged uid, time, memory and output limits),
and a few are kept started (``warm``) so that no call waits for a sandbox to start.

Code that raises, times out or is killed by a limit is the model's doing: its traceback or the
limit is the result (``error``). A sandbox that cannot start is not: `call` raises
`omrl.envs.EnvError`, and the episode ends as ``env_error``.
"""

from __future__ import annotations

import threading
from typing import Any

from omrl.envs import EnvError
from omrl.errors import ConfigError, OmrlError
from omrl.sandbox.interpreter import Interpreter, InterpreterPool
from omrl.sandbox.limits import MIN_PROCESS_MB
from omrl.sandbox.run import check_host
from omrl_plugins.envs.tooling import ToolResult

PROCESSES = 4  # the most processes the model's code may run at once

SPEC = {
    "name": "python",
    "description": (
        "Run Python 3 code (standard library only, no network, no files kept) and see what it prints; "
        "the value of a last bare expression is printed too."
    ),
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
}

_pools: dict[tuple, tuple[InterpreterPool, int]] = {}  # (size, limits) -> (pool, tools using it)
_pools_lock = threading.Lock()


def acquire_pool(size: int, limits: dict[str, Any]) -> tuple[tuple, InterpreterPool]:
    """One pool per process for each size and limits, shared by every tool (every env instance of a
    rollout) that uses it, and its key; the last `release_pool` of that key closes it, so no idle
    sandbox outlives its envs."""
    key = (size, tuple(sorted(limits.items())))
    with _pools_lock:
        pool, users = _pools.get(key) or (InterpreterPool(size, **limits), 0)
        _pools[key] = (pool, users + 1)
        return key, pool


def release_pool(key: tuple) -> None:
    with _pools_lock:
        pool, users = _pools[key]
        if users > 1:
            _pools[key] = (pool, users - 1)
            return
        del _pools[key]
    pool.close()


class PythonTool:
    """Runs the ``code`` argument in a sandboxed interpreter; see the module docstring."""

    spec = SPEC

    def __init__(
        self,
        persistent: bool = False,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
        warm: int = 2,
    ):
        for name, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("max_output_chars", max_output_chars)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"the python tool's {name} must be a positive number, got {value!r}")
        if memory_mb < MIN_PROCESS_MB * PROCESSES:  # its processes share it: each needs MIN_PROCESS_MB to start
            raise ConfigError(
                f"the python tool's memory_mb={memory_mb!r} is invalid; valid: {MIN_PROCESS_MB * PROCESSES} or more "
                f"(its {PROCESSES} processes share it, {MIN_PROCESS_MB} MB each at least)"
            )
        if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
            raise ConfigError(
                f"the python tool's warm={warm!r} is invalid; valid: a whole number, 0 or more (interpreters kept started)"
            )
        if not isinstance(persistent, bool):
            raise ConfigError(f"the python tool's persistent={persistent!r} is invalid; valid: true or false")
        try:
            check_host()  # refuse now, before any model loads: model-written code never runs unsandboxed
        except OmrlError as exc:
            raise ConfigError(f"the python tool cannot run here: {exc}") from exc
        self.persistent, self.timeout_s, self.max_output_chars = persistent, timeout_s, max_output_chars
        limits = {"memory_mb": memory_mb, "max_processes": PROCESSES, "cpu_time_s": int(timeout_s * 20) + 5}
        self._pool_key, pool = acquire_pool(warm, limits)
        self.pool: InterpreterPool | None = pool
        self.live: Interpreter | None = None

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult("The python tool needs code to run: python[print(1 + 1)].", error=True)
        interpreter = self._interpreter()
        try:
            # each stream gets half the budget, so a long stdout never hides the traceback after it
            result = interpreter.run(
                code, timeout_s=self.timeout_s, max_output_chars=max(1, self.max_output_chars // 2)
            )
        except OmrlError as exc:  # the sandbox itself failed
            self._drop(interpreter)
            raise EnvError(f"the python sandbox failed: {exc}") from exc
        died = interpreter.dead  # the code ended or broke it
        if not self.persistent or died:
            self._drop(interpreter)
        text = (result.stdout + result.stderr) or "(no output)"
        if died and self.persistent:
            text += "[the interpreter's variables are gone; the next call starts a new one]\n"
        return ToolResult(text, error=result.exit_code != 0 or died)

    def _interpreter(self) -> Interpreter:
        if self.live is not None:
            return self.live
        if self.pool is None:
            raise EnvError("the python tool was closed")
        try:
            interpreter = self.pool.take()
        except OmrlError as exc:
            raise EnvError(f"the python sandbox could not start: {exc}") from exc
        if self.persistent:
            self.live = interpreter
        return interpreter

    def _drop(self, interpreter: Interpreter) -> None:
        if interpreter is self.live:
            self.live = None
        interpreter.close()

    def end_episode(self) -> None:
        if self.live is not None:
            self._drop(self.live)

    def close(self) -> None:
        self.end_episode()
        if self.pool is not None:
            release_pool(self._pool_key)
            self.pool = None
