"""``mcp``: the tools of any MCP server beside a file of tasks, one server session per env instance.

Install with ``pip install 'omrl[mcp]'``. The env is ``ToolEnv(DatasetEnv(...), tools, max_calls)``
(:mod:`omrl_plugins.envs.tooling`): the ``dataset`` env holds the questions and scores the final
answer, and each tool the server lists is a tool the model may call (``name[{"arg": ...}]``, or
``name[text]`` for a tool with one string argument) at most ``max_calls`` times an episode. A
call's result (its text parts; other parts named, ``[image: image/png]``) is the next observation.

Options (config block ``plugins.mcp``):

- ``command``: a stdio server, as an argv list or a shell-like string (split as a shell would,
  ``'mcp-server-sqlite --db-path my.db'``); or ``url``: a streamable-HTTP server
  (``http://127.0.0.1:8000/mcp``). Exactly one of them. ``env``: extra environment variables for a
  stdio server (it gets the SDK's safe few, ``HOME``, ``PATH``, ``USER``..., plus these). Their values,
  and the secrets in ``command`` or ``url`` (``--api-key X``, ``https://me:X@host``), are redacted in
  every file omrl writes and every error it raises (:mod:`omrl.config.redaction`).
- ``timeout_s`` (30): seconds a tool call may take; ``start_timeout_s`` (60): seconds the server
  may take to start and list its tools.
- ``max_result_chars`` (4000): a longer result is cut, and says so; ``max_calls`` (8): tool calls
  an episode; ``allowed_tools``: offer only these of the server's tools (default: all).
- The ``dataset`` env's task options, passed to it: ``path`` (required), ``test_path`` or
  ``test_fraction``, ``prompt_key``, ``answer_key``, ``match``, ``instruction``, ``max_attempts``,
  ``seed``, ``rel_tol``, ``abs_tol``.

Each instance starts its server (connects, for a url) when it is built and keeps the session for
every episode; a reset pings it first and starts a new one when it is gone. ``close`` stops it. A
server that cannot start the first time in a process is a ConfigError when the env is built, which
the rollout does before any model loads; later, it is the episode's ``env_error``.

Failures are split by whose they are. A result the server marks ``isError``, or a call whose
arguments the server refuses (JSON-RPC "invalid params"), is the agent's: its text is the
observation, ``info["tool_error"]`` is set and the episode goes on. A server that cannot start,
dies, does not answer within ``timeout_s``, or answers with any other error raises
:class:`omrl.envs.EnvError` naming the server, the call and why (with the end of its stderr): the
rollout ends that episode as ``env_error``, never trains on it, and the next reset starts again.
"""

from __future__ import annotations

import inspect
import os
import shlex
import shutil
import threading
from typing import Any, Callable, Sequence

from omrl.config.redaction import redact_text
from omrl.envs import Env, EnvError, EpisodeFinishedError, Observation, StepResult
from omrl.errors import ConfigError, short_repr
from omrl_plugins.envs.dataset import DatasetEnv
from omrl_plugins.envs.engines.common import require
from omrl_plugins.envs.mcp.client import INVALID_PARAMS, Connection, ErrorAnswer, ServerLost, ServerSpec, ToolOutcome
from omrl_plugins.envs.tooling import ToolEnv, ToolResult, truncate

NAME = "mcp"
_STARTED: set[ServerSpec] = set()  # the servers an instance of this process has started


class McpClient:
    """An env instance's link to its server: one connection at a time, a new one after a failure."""

    def __init__(self, spec: ServerSpec, start_timeout: float, call_timeout: float):
        self.spec, self.start_timeout, self.call_timeout = spec, start_timeout, call_timeout
        self._lock = threading.Lock()  # the env's thread calls; close may come from another
        self._connection: Connection | None = None
        self._lost = "it was never started"

    def connect(self) -> list[dict[str, Any]]:
        """Have a live connection (the one held if it answers a ping, else a new one): the server's tools
        as ``{name, description, parameters}``. ServerLost when the server does not start."""
        with self._lock:
            connection = self._connection
            if connection is not None and connection.alive:
                try:
                    connection.ping(self.call_timeout)
                    return connection.tools
                except ErrorAnswer:  # it answered: alive, if without ping
                    return connection.tools
                except ServerLost:
                    pass
            self._drop()
            connection = Connection(self.spec, self.start_timeout)
            try:
                tools = connection.wait_started()
            except ServerLost as exc:
                self._lost = str(exc)
                raise
            self._connection = connection
            return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Tool ``name``'s outcome; ErrorAnswer for an error answer; ServerLost when the connection
        failed (it is dropped: the next connect opens another)."""
        with self._lock:
            if self._connection is None:
                raise ServerLost(f"{self.spec}: not connected ({self._lost}); the next reset starts it again")
            try:
                return self._connection.call_tool(name, arguments, self.call_timeout)
            except ServerLost as exc:
                self._lost = str(exc)
                self._drop()
                raise

    def close(self) -> None:
        connection = self._connection
        if connection is not None:  # at once, not under the lock: a call in flight holds it until this ends it
            connection.close()
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class McpTool:
    """One tool of the server, as a :class:`~omrl_plugins.envs.tooling.Tool`."""

    def __init__(self, client: McpClient, spec: dict[str, Any], max_chars: int):
        self.client, self.spec, self.max_chars = client, spec, max_chars

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        name = self.spec["name"]
        try:
            outcome = self.client.call_tool(name, arguments)
        except ErrorAnswer as answer:
            if answer.code == INVALID_PARAMS:
                return ToolResult(f"The server refused the call: {answer.message}", error=True)
            answered = self.client.spec.hide(str(answer))
            raise EnvError(f"{self.client.spec}: tools/call {name} failed: the server answered {answered}") from answer
        return ToolResult(truncate(outcome.text or "(no output)", self.max_chars, "result"), error=outcome.is_error)

    def end_episode(self) -> None:
        """A server's state is its own: nothing to drop per episode."""

    def close(self) -> None:
        """The env closes the client the tools share."""


class McpEnv(Env):
    """The tools of an MCP server (a stdio command or a streamable-HTTP url) for questions from a file."""

    io_bound = True
    package = "mcp"
    extra = "mcp"

    def __init__(
        self,
        command: str | Sequence[str] | Callable[[], str | Sequence[str]] | None = None,
        url: str | None = None,
        env: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        max_result_chars: int = 4000,
        max_calls: int = 8,
        allowed_tools: Sequence[str] | None = None,
        **task_options: Any,
    ):
        require("mcp.client.session", NAME, "mcp")  # a missing extra says so at once
        for option, value, low, kinds in (
            ("timeout_s", timeout_s, 1e-3, (int, float)),
            ("start_timeout_s", start_timeout_s, 1e-3, (int, float)),
            ("max_result_chars", max_result_chars, 1, int),
            ("max_calls", max_calls, 1, int),
        ):
            if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
                raise ConfigError(f"plugins.{NAME}.{option} must be a number >= {low:g}, got {short_repr(value)}")
        if allowed_tools is not None and (
            not isinstance(allowed_tools, (list, tuple)) or not all(isinstance(name, str) for name in allowed_tools)
        ):
            raise ConfigError(
                f"plugins.{NAME}.allowed_tools must be a list of tool names, got {short_repr(allowed_tools)}"
            )
        spec = server_spec(command, url, env)
        path = task_options.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"the {NAME} env needs plugins.{NAME}.path=FILE: the questions and their answers, as the "
                "dataset env reads them (a .jsonl file with a question and an answer a line, or .parquet)"
            )
        try:
            self.dataset = DatasetEnv(**task_options)  # create_env checked the names against the signature
        except ConfigError as exc:
            raise ConfigError(f"{NAME} env, its tasks (read by the dataset env): {exc}") from exc
        self.client = McpClient(spec, float(start_timeout_s), float(timeout_s))
        self.max_calls, self.max_result_chars = max_calls, max_result_chars
        self.allowed_tools = list(allowed_tools) if allowed_tools is not None else None
        self.splits = self.dataset.splits  # type: ignore[misc]
        self.max_turns = self.dataset.max_turns + max_calls  # type: ignore[misc]
        self._tool_env: ToolEnv | None = None
        self._start()

    def _start(self) -> None:
        """Start the server (connect, for a url) as the instance is built, keeping the session for its
        episodes. A server this process never started that cannot start now, or that lacks a tool
        ``allowed_tools`` names, is ConfigError naming it and how to fix it: the rollout builds its
        first instance with the session, so the run stops before a model loads. Once the server has
        started in this process, a failure here is the server's, not the setup's: the next reset tries
        again, and its episode ends as ``env_error`` if it fails too."""
        try:
            specs = self.client.connect()
        except ServerLost as exc:
            if self.client.spec in _STARTED:
                return
            raise ConfigError(f"{str(exc).rstrip('.')}. {self.start_help()}") from None
        _STARTED.add(self.client.spec)
        try:
            self._tool_env = self._build(specs)
        except BaseException:
            self.client.close()
            raise

    def start_help(self) -> str:
        """How to make a server that cannot start start: said by the error of an env built on one."""
        if self.client.spec.url:
            return f"Is an MCP server listening at plugins.{NAME}.url (streamable HTTP)? Start it first."
        return (
            f"Check plugins.{NAME}.command: run it yourself, and it should start and wait for MCP messages "
            "on its stdin (a Python server needs the mcp SDK in the Python that runs it)."
        )

    # -- what the env is (the tools are known once the server listed them) -----------------------
    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self._with_tools().tools

    @property
    def action_help(self) -> str:  # type: ignore[override]
        return self._with_tools().action_help

    def _with_tools(self) -> ToolEnv:
        """The ToolEnv of the server's tools, built when the first connection lists them (kept after:
        a restarted server is the same server)."""
        if self._tool_env is None:
            self._tool_env = self._build(self.client.connect())
        return self._tool_env

    def _build(self, specs: list[dict[str, Any]]) -> ToolEnv:
        names = [spec["name"] for spec in specs]
        if self.allowed_tools is not None:
            unknown = sorted(set(self.allowed_tools) - set(names))
            if unknown:
                raise ConfigError(
                    f"plugins.{NAME}.allowed_tools names {unknown}, which the {self.client.spec} does not offer; "
                    f"its tools: {', '.join(names) or '(none)'}"
                )
            if not self.allowed_tools and names:
                raise ConfigError(
                    f"plugins.{NAME}.allowed_tools is empty, so the model would have no tool of the "
                    f"{self.client.spec}; name some of its tools ({', '.join(names)}), or leave it unset for all"
                )
            specs = [spec for spec in specs if spec["name"] in self.allowed_tools]
        if not specs:
            raise ConfigError(f"the {self.client.spec} offers no tools")
        tools = [McpTool(self.client, spec, self.max_result_chars) for spec in specs]
        try:
            return ToolEnv(self.dataset, tools, self.max_calls)
        except ValueError as exc:  # a tool named like the env's own actions (answer)
            raise ConfigError(f"the {self.client.spec}: {exc}; leave it out with plugins.{NAME}.allowed_tools") from exc

    # -- episodes ----------------------------------------------------------------------------------
    def task_ids(self, split: str) -> Sequence[int]:
        return self.dataset.task_ids(split)

    def reset(self, task_id: int) -> Observation:
        self.dataset.item(task_id)  # an unknown task fails before any server starts
        specs = self.client.connect()  # a live session: the one held, or a new one
        if self._tool_env is None:
            self._tool_env = self._build(specs)
        return self._tool_env.reset(task_id)

    def step(self, action: str) -> StepResult:
        if self._tool_env is None:
            raise EpisodeFinishedError(f"{NAME}: no episode in progress; call reset(task_id) to start one")
        return self._tool_env.step(action)

    def expert_action(self) -> str | None:
        return self._tool_env.expert_action() if self._tool_env is not None else None

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._with_tools().action_from_tool_call(name, arguments)

    def end_episode(self) -> None:
        if self._tool_env is not None:
            self._tool_env.end_episode()

    def close(self) -> None:
        try:
            if self._tool_env is not None:
                self._tool_env.close()
        finally:
            self.client.close()


def _signature_with_task_options() -> inspect.Signature:
    """McpEnv's options as `create_env` checks them: its own, then the dataset env's task options
    (``**task_options`` goes to DatasetEnv whole), so neither list is written twice."""
    own = [p for p in inspect.signature(McpEnv.__init__).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    tasks = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(DatasetEnv).parameters.values()]
    return inspect.Signature([p.replace(kind=p.KEYWORD_ONLY) for p in own[1:]] + tasks)


McpEnv.__signature__ = _signature_with_task_options()  # type: ignore[attr-defined]


def server_spec(command: Any, url: Any, env: Any) -> ServerSpec:
    """The server the options name: exactly one of ``command`` (a stdio server) and ``url``."""
    if (command is None) == (url is None):
        both = "both name a server; set one of them" if command is not None else "are unset; set one of them"
        raise ConfigError(
            f"plugins.{NAME}.command and plugins.{NAME}.url {both}: command='server --its args' (a stdio "
            "server) or url=http://host:port/mcp (a streamable-HTTP server)"
        )
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"plugins.{NAME}.url must be an http:// or https:// URL, got {short_repr(url)}")
        if env is not None:
            raise ConfigError(
                f"plugins.{NAME}.env sets a stdio server's environment; a url names a server already running"
            )
        return ServerSpec(url=url)
    variables = _environment(env)
    argv = _argv(command() if callable(command) else command)
    search_path = dict(variables).get("PATH", os.environ.get("PATH", ""))
    if shutil.which(argv[0], path=search_path) is None:
        raise ConfigError(
            f"plugins.{NAME}.command: {argv[0]!r} is not an executable file nor a program on PATH; "
            "give the server's path or install it"
        )
    return ServerSpec(argv=argv, env=variables)


def _argv(command: Any) -> tuple[str, ...]:
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:  # an unclosed quote
            raise ConfigError(
                f"plugins.{NAME}.command {redact_text(command)!r} does not split into words: {exc}"
            ) from exc
    elif isinstance(command, (list, tuple)) and all(isinstance(word, str) for word in command):
        argv = list(command)
    else:
        raise ConfigError(
            f"plugins.{NAME}.command must be a command line or a list of its words, got {short_repr(command)}"
        )
    if not argv or not argv[0]:
        raise ConfigError(f"plugins.{NAME}.command is empty; give the server's command line")
    return tuple(argv)


def _environment(env: Any) -> tuple[tuple[str, str], ...]:
    if env is None:
        return ()
    if not isinstance(env, dict) or not all(isinstance(key, str) and key for key in env):
        raise ConfigError(f"plugins.{NAME}.env must map variable names to values, got {short_repr(env)}")
    bad = [key for key, value in env.items() if not isinstance(value, (str, int, float)) or isinstance(value, bool)]
    if bad:
        raise ConfigError(f"plugins.{NAME}.env values must be text or numbers; {bad} are not")
    return tuple((key, str(value)) for key, value in env.items())
