"""Sessions on OpenEnv servers: one WebSocket each, all on one event loop, spread over the servers.

OpenEnv's concurrency model: a server keeps an episode's state only inside a WebSocket session
(``/ws``). Each connection gets an Environment instance of its own from the server's env factory,
and it is destroyed when the connection closes; the HTTP ``/reset`` and ``/step`` routes build a
fresh env for every call, so they cannot play an episode of more than one step. A server holds at
most ``max_concurrent_envs`` sessions (1 unless its env declares ``SUPPORTS_CONCURRENT_SESSIONS``)
and answers the next connection with a ``CAPACITY_REACHED`` error; ``uvicorn --workers N`` gives N
such servers behind one port.

So each omrl env instance holds one session of its own (opened at its first reset, reused by the
next ones), and the rollout's N parallel episodes are N sessions side by side. :data:`SERVERS`
counts this process's sessions per server and hands each new one to the least loaded server of
those listed that has room (its capacity is the ``max_sessions`` option, or what its refusal said),
so one server with ``max_concurrent_envs=8``, or eight single-session servers, play eight episodes
at once. Every session's I/O runs on one background event loop (one thread, not one per session),
and every call has a deadline.

The wire work is openenv-core's own :class:`openenv.GenericEnvClient` (its URL handling, connect, message
format and timeouts); :func:`client_class` only makes its error answers keep their code and data
and checks each answer's shape, since the stock client folds errors into a RuntimeError's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, Sequence

from omrl.env_results import finite_number
from omrl.envs import EnvError
from omrl.errors import short_repr
from omrl_plugins.envs.background_loop import ProcessLoop
from omrl_plugins.envs.engines.common import require

SLACK = 2.0  # seconds past a call's own timeout before the caller stops waiting on the loop
FULL = "it is full"
CLOSE_TIMEOUT = 2.0  # a goodbye waits this long (plus SLACK) at most: the server may be gone


class SessionLost(EnvError):
    """A session's connection failed, timed out or answered garbage; it is closed, and the next
    reset opens another."""


class ServerAnswer(Exception):
    """An OpenEnv server's ``{"type": "error"}`` answer: its code (VALIDATION_ERROR,
    CAPACITY_REACHED, EXECUTION_ERROR, ...), message and data. The session itself lives on."""

    def __init__(self, code: str, message: str, data: dict[str, Any]):
        super().__init__(f"{message} ({code})")
        self.code, self.message, self.data = code, message, data


class Malformed(Exception):
    """An answer that is not the protocol's JSON."""


@dataclass(frozen=True)
class Settings:
    """How to reach the servers: timeouts (seconds), retries and backoff for opening a session, and
    how many sessions a server takes (None: learn it from its refusal)."""

    timeout: float
    connect_timeout: float
    retries: int
    backoff: float
    max_sessions: int | None


def message(url: str, what: str, detail: str) -> str:
    """The one form of every error: ``openenv server <url>: <call> failed: <why>``."""
    return f"openenv server {url}: {what} failed: {detail}"


@functools.cache
def client_class() -> type:
    """openenv-core's GenericEnvClient, with error answers raised as :class:`ServerAnswer` and answers
    of the wrong shape as :class:`Malformed` (imported on first use: the extra is optional)."""
    generic = require("openenv.core.generic_client", "openenv", "openenv").GenericEnvClient
    closed = require("websockets.exceptions", "openenv", "openenv").ConnectionClosed
    expected = {"reset": "observation", "step": "observation", "state": "state"}

    class SessionClient(generic):  # type: ignore[misc, valid-type]
        async def _send_and_receive(self, request: dict[str, Any]) -> dict[str, Any]:
            try:
                await self._send(request)
            except closed:  # a server refusing a session answers and closes before it is asked
                refusal = await self._refusal()
                if refusal is None:
                    raise
                raise refusal from None
            try:
                answer = await self._receive()
            except ValueError as exc:  # not JSON (json.JSONDecodeError, or bytes that are not UTF-8)
                raise Malformed(f"the answer is not JSON ({exc})") from exc
            if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
                raise Malformed(f"expected {{'type': ..., 'data': {{...}}}}, got {short_repr(answer)}")
            if (error := as_error(answer)) is not None:
                raise error
            if answer.get("type") != expected.get(request["type"]):
                raise Malformed(f"expected a {expected.get(request['type'])!r} answer, got {short_repr(answer)}")
            if answer["type"] == "observation":
                check_observation(answer["data"])
            return answer

        async def _refusal(self) -> ServerAnswer | None:
            """The error answer a server sent before it closed the connection, if one is waiting."""
            try:
                return as_error(await self._receive()) if self._ws is not None else None
            except Exception:  # noqa: BLE001 - nothing waiting: the closed connection is the news
                return None

    return SessionClient


def as_error(answer: Any) -> ServerAnswer | None:
    """``{"type": "error", "data": {"code", "message", ...}}`` as a ServerAnswer; None for any other answer."""
    if not (isinstance(answer, dict) and answer.get("type") == "error" and isinstance(answer.get("data"), dict)):
        return None
    data = answer["data"]
    return ServerAnswer(str(data.get("code", "UNKNOWN")), str(data.get("message", "")), data)


def check_observation(data: dict[str, Any]) -> None:
    """Raise Malformed unless ``data`` is ``{"observation": {...}, "reward": number|null, "done": bool}``."""
    reward, done = data.get("reward"), data.get("done", False)
    if not isinstance(data.get("observation"), dict):
        raise Malformed(f"'observation' must be an object, got {short_repr(data.get('observation'))}")
    if reward is not None and (isinstance(reward, bool) or not finite_number(reward)):  # true is no reward
        raise Malformed(f"'reward' must be a finite number or null, got {short_repr(reward)}")
    if not isinstance(done, bool):
        raise Malformed(f"'done' must be true or false, got {short_repr(done)}")


# -- the event loop ----------------------------------------------------------------------------
_sessions = ProcessLoop("omrl-openenv-sessions")


def run(make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Run the coroutine ``make()`` on the session loop; TimeoutError when it has no result after its
    own ``timeout`` seconds (the client's), or at the latest ``SLACK`` seconds later (ours)."""
    future = asyncio.run_coroutine_threadsafe(_call(make), _sessions.get())
    try:
        return future.result(timeout=timeout + SLACK)
    except TimeoutError as exc:
        if not future.done():
            future.cancel()
        elif str(exc):
            raise
        raise TimeoutError(f"no answer within {timeout:g} s") from None


async def _call(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


# -- which server gets a session ---------------------------------------------------------------
class Servers:
    """This process's open sessions per server, and each server's capacity once a refusal stated it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._capacity: dict[str, int] = {}  # learnt from CAPACITY_REACHED answers

    def reserve(self, urls: Sequence[str], skip: set[str], max_sessions: int | None) -> str | None:
        """Count a session on the least loaded of ``urls`` (not in ``skip``) with room; None if none has."""
        with self._lock:
            free = [url for url in urls if url not in skip and self._open[url] < self.capacity(url, max_sessions)]
            if not free:
                return None
            url = min(free, key=lambda u: self._open[u])  # ties: the order listed
            self._open[url] += 1
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self._open[url] = max(0, self._open[url] - 1)
            if not self._open[url]:  # a capacity matters while this process holds sessions there: a
                self._capacity.pop(url, None)  # server restarted with another may answer at that URL next

    def learn(self, url: str, max_sessions: Any) -> None:
        """Remember the capacity a server's refusal stated."""
        if isinstance(max_sessions, int) and not isinstance(max_sessions, bool) and max_sessions > 0:
            with self._lock:
                self._capacity[url] = max_sessions

    def capacity(self, url: str, max_sessions: int | None) -> float:
        return self._capacity.get(url, max_sessions if max_sessions is not None else math.inf)

    def open_sessions(self, url: str) -> int:
        with self._lock:
            return self._open[url]


SERVERS = Servers()


# -- one session -------------------------------------------------------------------------------
class Session:
    """One open WebSocket session on one server, with an env instance of its own there."""

    def __init__(self, url: str, client: Any, settings: Settings):
        self.url, self._client, self._settings = url, client, settings

    def reset(self, kwargs: dict[str, Any]) -> Any:
        """The reset answer (openenv's StepResult: observation dict, reward, done)."""
        return self._call(f"reset({_args(kwargs)})", lambda: self._client.reset(**kwargs))

    def step(self, action: dict[str, Any]) -> Any:
        """The step answer; a ServerAnswer (VALIDATION_ERROR) when the env's action model refuses ``action``."""
        return self._call(f"step({short_repr(action)})", lambda: self._client.step(action), refusable=True)

    def _call(self, what: str, make: Callable[[], Awaitable[Any]], refusable: bool = False) -> Any:
        """``make()``'s answer; failures become EnvError (SessionLost when the session is gone with them)."""
        if self._client is None:
            raise SessionLost(message(self.url, what, "the session is closed"))
        try:
            return run(make, self._settings.timeout)
        except ServerAnswer as answer:
            if refusable and answer.code == "VALIDATION_ERROR":
                raise
            raise EnvError(message(self.url, what, f"the server answered: {answer}")) from answer
        except Malformed as exc:
            self.close()  # the next answer could be out of step with its request
            raise SessionLost(message(self.url, what, f"malformed answer: {exc}")) from exc
        except (OSError, _websocket_error()) as exc:  # connection lost or refused, TimeoutError
            self.close()
            raise SessionLost(
                message(self.url, what, f"{describe(exc)}; the session is gone (the next reset opens another)")
            ) from exc
        except BaseException:  # unforeseen: the session cannot be trusted, and must not keep its slot
            self.close()
            raise

    def close(self) -> None:
        """Say goodbye (best effort: the server may be gone) and free the slot."""
        client, self._client = self._client, None
        if client is not None:
            _close_quietly(client)
            SERVERS.release(self.url)


def open_session(urls: Sequence[str], reset_kwargs: dict[str, Any], settings: Settings) -> tuple[Session, Any]:
    """A new session on one of ``urls``, and its first reset's answer.

    Each attempt tries every server with room once (least loaded first); a server that cannot be
    reached or is full is retried after ``backoff * 2**k`` seconds, ``retries`` times. When this
    process already fills every server, no wait can help (only closing one of its own sessions
    would): that fails at once.
    """
    what = f"opening a session and reset({_args(reset_kwargs)})"
    problems: dict[str, str] = {}
    for attempt in range(settings.retries + 1):
        if attempt:
            time.sleep(settings.backoff * 2 ** (attempt - 1))
        tried: set[str] = set()
        while (url := SERVERS.reserve(urls, tried, settings.max_sessions)) is not None:
            tried.add(url)
            client = client_class()(
                base_url=url, connect_timeout_s=settings.connect_timeout, message_timeout_s=settings.timeout
            )
            try:
                with _given_back_on_failure(client, url):
                    run(client.connect, settings.connect_timeout)
                    first = run(lambda client=client: client.reset(**reset_kwargs), settings.timeout)
                return Session(url, client, settings), first
            except ServerAnswer as answer:
                if answer.code != "CAPACITY_REACHED":  # the env itself failed: trying again will not help
                    raise EnvError(message(url, what, f"the server answered: {answer}")) from answer
                SERVERS.learn(url, answer.data.get("max_sessions"))
                problems[url] = f"{FULL} ({answer.message})"
            except (OSError, Malformed, _websocket_error()) as exc:
                problems[url] = describe(exc)
        if not tried:
            break
    raise EnvError(_no_session(urls, what, problems, settings))


def _no_session(urls: Sequence[str], what: str, problems: dict[str, str], settings: Settings) -> str:
    """Why no session could be opened, and what would help."""
    where = urls[0] if len(urls) == 1 else f"{urls[0]} (and the {len(urls) - 1} other servers listed)"
    full = [url for url in urls if SERVERS.open_sessions(url) >= SERVERS.capacity(url, settings.max_sessions)]
    if len(full) == len(urls):
        counts = ", ".join(f"{SERVERS.open_sessions(u)} on {u}" for u in urls)
        return message(
            where,
            what,
            f"this process already holds every session the servers take ({counts}); "
            "an OpenEnv server holds at most max_concurrent_envs sessions (its env must "
            "set SUPPORTS_CONCURRENT_SESSIONS for more than 1): start it with a larger "
            "max_concurrent_envs, list more servers in plugins.openenv.base_url, or play "
            "fewer episodes at once",
        )
    if len(urls) == 1:
        detail = next(iter(problems.values()), "no server tried")
    else:
        detail = "; ".join(f"{url}: {problem}" for url, problem in problems.items()) or "no server tried"
    hint = (
        "start the server with a larger max_concurrent_envs or list more servers in plugins.openenv.base_url"
        if any(problem.startswith(FULL) for problem in problems.values())
        else "is the server running?"
    )
    attempts = settings.retries + 1
    return message(where, what, f"{detail} (gave up after {attempts} attempt{'s' if attempts > 1 else ''}); {hint}")


@contextlib.contextmanager
def _given_back_on_failure(client: Any, url: str) -> Iterator[None]:
    """Close ``client`` and free its slot on ``url`` when the block raises, whatever it raises."""
    try:
        yield
    except BaseException:
        _close_quietly(client)
        SERVERS.release(url)
        raise


def _close_quietly(client: Any) -> None:
    try:
        run(client.close, CLOSE_TIMEOUT)
    except Exception:  # noqa: BLE001 - the server or the connection may be gone already
        pass


def _websocket_error() -> type[Exception]:
    """websockets' base error class (a dependency of openenv-core, imported with it)."""
    return require("websockets.exceptions", "openenv", "openenv").WebSocketException


def describe(exc: BaseException) -> str:
    text = str(exc).strip() or "no detail"
    return f"{type(exc).__name__}: {text if len(text) <= 300 else text[:300] + '...'}"


def _args(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={short_repr(value)}" for key, value in kwargs.items())
