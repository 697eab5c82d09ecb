"""Agent programs and reward functions, run with a time limit each.

An agent is either a Python callable named ``module:function`` (``agent.callable``) or any command
(``agent.command``). A callable is called on a thread of its own as ``fn(task, base_url=...,
api_key=..., model=...)``, each keyword only where its signature takes it; an ``async def`` runs in an
event loop of its own. A command runs in a process group of its own with ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``OMRL_MODEL``, ``OMRL_TASK`` (the task as JSON), ``OMRL_TASK_FILE`` (the same in a
file) and ``OMRL_RESULT_FILE`` (where it may write its answer) in its environment; a non-zero exit is
a failure, with the end of its stderr.

A reward function named ``module:function`` is called as ``fn(task=..., result=..., transcript=...)``, each
by name and only where its signature takes it (:func:`check_reward` refuses another parameter): ``result`` is the agent's return value (a command's result file,
else None) and ``transcript`` the chat's messages. It returns a number, or a mapping of named numbers
that are summed.

A failure of any of these (it raises, exits non-zero, outlives its limit) is an :class:`AgentFailure`,
never a score: the episode is then ``env_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omrl.env_results import finite_number
from omrl.errors import ConfigError
from omrl.plugins import import_from_here

STDERR_TAIL = 2000


#: how an episode's error names its agent program or reward function (an AgentFailure's message), not the env
AGENT_REASON = re.compile(r"the (agent|reward function)\b")
#: what such episodes failed in, as messages name it
IN_THE_AGENT = "the agent (its program or its reward function)"


#: what an agent's error says when it is its framework refusing a reply cut at its length: the errors the
#: frameworks raise for that (the Agents SDK, openai's ``.parse()``, pydantic-ai), or words that name the cut
NAMES_A_CUT = re.compile(
    r"ModelBehaviorError|LengthFinishReasonError|IncompleteToolCall|OutputTokenLimitExceeded|UnexpectedModelBehavior"
    r"|length|incomplete|max_(output_)?tokens|truncat",
    re.IGNORECASE,
)


class AgentFailure(Exception):
    """The agent or its reward function failed: the world's failure, not the model's. ``ended_itself``:
    the agent program ended with an error of its own (it raised, or its command exited non-zero), not
    an OS or network error, a timeout or a kill; a framework does so on a malformed tool call, which is
    the model's failure (see :func:`omrl.gateway.play.play_agents`)."""

    def __init__(self, message: str, ended_itself: bool = False):
        super().__init__(message)
        self.ended_itself = ended_itself

    @property
    def names_a_cut(self) -> bool:
        """Whether the error (its type and text, or the last line of a command's stderr: a traceback's error,
        not its source lines) says it is about a reply cut at its length (:data:`NAMES_A_CUT`), not some other
        failure of the agent after such a reply."""
        lines = str(self).strip().splitlines() or [""]
        return self.ended_itself and any(NAMES_A_CUT.search(line) for line in (lines[0], lines[-1]))


def _from_the_world(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised by, an OS or network error (an HTTP client's connection error
    wraps the socket's ``OSError``)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` (a dotted path after the colon too), or a ConfigError naming what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{what} {spec!r} must be module:function, e.g. mypkg.agent:run")
    if module_name.endswith(".py"):  # a file's path where its module's name goes
        file = Path(module_name).resolve()
        if file.is_relative_to(Path.cwd()):
            named = ".".join(file.relative_to(Path.cwd()).with_suffix("").parts)
            raise ConfigError(f"{what} {spec!r} names a file; name its module: {named}:{attribute}")
        raise ConfigError(
            f"{what} {spec!r} names a file; name its module, {file.stem}:{attribute}, with its folder "
            f"{file.parent} on PYTHONPATH"
        )
    import_from_here()
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {spec!r}: cannot import {module_name!r} ({exc})") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{what} {spec!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{what} {spec!r} is a {type(target).__name__}, not a function")
    return target


def check_command(command: str) -> list[str]:
    """``command`` split as a shell would, or a ConfigError."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"agent.command {command!r} cannot be split into words: {exc}") from exc
    if not words:
        raise ConfigError("agent.command is empty; give the command that runs your agent, e.g. 'python my_agent.py'")
    if shutil.which(words[0]) is None:  # each episode would fail alike, as the env's failure
        raise ConfigError(
            f"agent.command {command!r}: {words[0]!r} is no program found here (not on PATH, or not executable)"
        )
    return words


#: why an agent's episode ended when the run stopped under it (Ctrl-C, SIGTERM): never trained, the run is over
STOPPED = "the run stopped while the agent played"


def _wait(
    join: Callable[[float], Any], running: Callable[[], bool], seconds: float, stop: threading.Event | None
) -> None:
    """Wait up to ``seconds`` for what ``running`` says is running, in short slices when ``stop`` may end
    the wait first: a Ctrl-C then ends the run at once, not once the slowest agent's limit has passed."""
    if stop is None:
        join(seconds)
        return
    deadline = time.monotonic() + seconds
    while running() and not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        join(min(left, 0.2))


def within(seconds: float, what: str, fn: Callable[[], Any], stop: threading.Event | None = None) -> Any:
    """``fn()`` on a thread of its own, or AgentFailure when it raises, outlives ``seconds`` or ``stop`` is set.

    A Python thread cannot be killed: one past its limit is left running (daemon), its episode's key
    already refused, so nothing it does reaches a row. Use ``agent.command`` for a hard stop."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            value = fn()
            box["value"] = asyncio.run(value) if inspect.iscoroutine(value) else value
        except BaseException as exc:  # noqa: BLE001 - reported as the agent's failure
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"omrl-{what.split()[0]}", daemon=True)
    thread.start()
    _wait(thread.join, thread.is_alive, seconds, stop)
    if thread.is_alive():
        raise AgentFailure(
            STOPPED if stop is not None and stop.is_set() else f"{what} did not finish within {seconds:g} s"
        )
    if "error" in box:
        exc = box["error"]
        message = f"{what} raised {type(exc).__name__}: {str(exc)[:500]}"
        raise AgentFailure(message, ended_itself=not _from_the_world(exc)) from exc
    return box.get("value")


@dataclass(frozen=True)
class Launch:
    """One episode's agent run: its task, where and as whom it calls the model, how long it may take, and
    the event that ends it early (the run stopped)."""

    task: dict[str, Any]
    base_url: str
    api_key: str
    model: str
    seconds: float
    stop: threading.Event | None = None


def call_agent(fn: Callable[..., Any], launch: Launch) -> Any:
    """Run an agent callable on ``launch.task`` (see the module docstring); its return value."""
    offered = {"base_url": launch.base_url, "api_key": launch.api_key, "model": launch.model}
    accepted = _keywords(fn, offered)
    return within(launch.seconds, "the agent", lambda: fn(dict(launch.task), **accepted), launch.stop)


def _keywords(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return offered
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return offered
    return {key: value for key, value in offered.items() if key in parameters}


def run_command(words: list[str], launch: Launch) -> Any:
    """Run an agent command on ``launch.task`` (see the module docstring); the JSON (or text) of its result
    file, or None."""
    task, seconds, stop = launch.task, launch.seconds, launch.stop
    with tempfile.TemporaryDirectory(prefix="omrl-agent-") as folder:
        task_file, result_file = Path(folder, "task.json"), Path(folder, "result")
        task_file.write_text(json.dumps(task, ensure_ascii=False))
        env = {
            **os.environ,
            "OPENAI_BASE_URL": launch.base_url,
            "OPENAI_API_KEY": launch.api_key,
            "OMRL_MODEL": launch.model,
            "OMRL_TASK": json.dumps(task, ensure_ascii=False),
            "OMRL_TASK_FILE": str(task_file),
            "OMRL_RESULT_FILE": str(result_file),
        }
        with open(Path(folder, "stderr"), "w+b") as stderr:
            try:
                process = subprocess.Popen(
                    words,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    start_new_session=True,
                )
            except OSError as exc:
                raise AgentFailure(f"the agent command {shlex.join(words)!r} could not start: {exc}") from exc
            try:
                _wait(lambda slice_s: _poll(process, slice_s), lambda: process.poll() is None, seconds, stop)
                if process.poll() is None:
                    _kill_group(process)
                    if stop is not None and stop.is_set():
                        raise AgentFailure(STOPPED)
                    raise AgentFailure(f"the agent command did not finish within {seconds:g} s (killed)")
                code = process.returncode
            finally:
                _kill_group(process)  # whatever it left behind in its group
            if code != 0:
                stderr.seek(0)
                tail = stderr.read().decode("utf-8", "replace")[-STDERR_TAIL:]
                how = f"was killed by signal {-code} ({_signal_name(-code)})" if code < 0 else f"exited with {code}"
                said = f": {tail.strip()}" if tail.strip() else " (nothing on its stderr)"
                raise AgentFailure(f"the agent command {how}{said}", ended_itself=True)
        if not result_file.exists():
            return None
        text = result_file.read_text(encoding="utf-8", errors="replace")
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if isinstance(value, (dict, str)) else text  # 42 in the file is the answer "42", as written


def _poll(process: subprocess.Popen, seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=seconds)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): nothing more to do from here
        pass


REWARD_ARGUMENTS = ("task", "result", "transcript")
#: what an agent callable is given by name, each only where it takes it (the task comes first, by position)
AGENT_ARGUMENTS = ("base_url", "api_key", "model")


def check_agent(fn: Callable[..., Any], spec: str) -> Callable[..., Any]:
    """``fn``, or a ConfigError where its parameters do not take the call every episode makes: the task by
    position, then any of :data:`AGENT_ARGUMENTS` by name (a ``def run(base_url, api_key)`` would get the task
    as its ``base_url``, and every episode would fail alike, after the model loads)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin: called as it is
        return fn
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    first = positional[0] if positional else None
    valid = f"an agent is called as {spec.rpartition(':')[2]}(task, base_url=..., api_key=..., model=...), " + (
        "the task first and each of the others only where it names it"
    )
    if first is None or (first.kind is not first.VAR_POSITIONAL and first.name in AGENT_ARGUMENTS):
        raise ConfigError(f"agent.callable {spec!r} takes no task before its other parameters; {valid}")
    unknown = [
        p.name
        for p in parameters
        if p is not first
        and p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and (p.name not in AGENT_ARGUMENTS or p.kind is p.POSITIONAL_ONLY)
    ]
    if unknown:
        raise ConfigError(f"agent.callable {spec!r} takes {', '.join(unknown)}, which it would never be given; {valid}")
    return fn


def check_reward(fn: Callable[..., Any], spec: str) -> Callable[..., Any]:
    """``fn``, or a ConfigError where a parameter of its would get nothing: a reward function is given
    ``task``, ``result`` and ``transcript`` by name (a ``def f(result)`` given the task in its place would
    score every episode wrong, in silence)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin: called with all three by name
        return fn
    unknown = [
        f"*{p.name}" if p.kind is p.VAR_POSITIONAL else p.name
        for p in parameters
        if p.kind is p.VAR_POSITIONAL
        or (p.kind is p.POSITIONAL_ONLY and (p.name in REWARD_ARGUMENTS or p.default is p.empty))
        or (
            p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.default is p.empty
            and p.name not in REWARD_ARGUMENTS
        )
    ]
    if unknown:
        raise ConfigError(
            f"agent.reward {spec!r} takes {', '.join(unknown)}, which it would never be given; a reward function "
            f"is given {', '.join(REWARD_ARGUMENTS)} by name, each only where it takes it: name its parameters so"
        )
    return fn


def score(
    fn: Callable[..., Any], task: dict[str, Any], result: Any, transcript: list[dict[str, Any]], seconds: float
) -> dict[str, float]:
    """The reward function's components for one episode (a number is one named for the function: a
    ``score_answer`` returning 1.0 becomes ``{"score_answer": 1.0}``, logged ``reward_score_answer``)."""
    offered = {"task": task, "result": result, "transcript": transcript}
    accepted = _keywords(fn, offered)
    value = within(seconds, "the reward function", lambda: fn(**accepted))
    name = getattr(fn, "__name__", "")
    components = value if isinstance(value, dict) else {name if name.isidentifier() else "score": value}
    out = {}
    for name, number in components.items():
        if isinstance(number, bool) or not finite_number(number):
            raise AgentFailure(f"the reward function returned {name}={number!r}; it must return finite numbers")
        out[str(name)] = float(number)
    if not out:
        raise AgentFailure("the reward function returned an empty mapping; it must return a number or named numbers")
    return out
