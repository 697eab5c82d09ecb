"""The envs of one ``omrl env serve`` server: env ids, their episodes and locks, and no HTTP.

Each id holds its own env instance; ids are handed out under a lock and every call on one id
holds that id's lock, so one id's calls are serialized while different ids run in parallel
(FastAPI runs the server's handlers in its thread pool). What the env returns is checked
(:mod:`omrl.serve.answers`: an answer that breaks the env protocol is the env's fault, a 500),
and every refusal is a :class:`Rejected` carrying the HTTP status the server answers with.

Ids never repeat across restarts, for any client: each start numbers its ids up from the
microseconds since the epoch at that start (about 1.8e15, inside JSON's exact integers), so a
server started later hands out ids above every id an earlier start could have handed out (one
per microsecond, far more than a server creates). A stale id from before a restart is then
unknown here (404), never another client's env. Only a clock set back between two starts could
bring an old id back; omrl's own client also names the instance (see :mod:`omrl.serve.guard`).

Envs no call has touched for ``idle_timeout`` seconds are closed (their client was most likely
killed: nothing else would ever close them, and they count against ``max_envs``); a call about
such an id is answered 410 saying so. The check runs at each create and at most once a second
on other calls, so nothing runs between requests.

An env that stops answering costs only its own id. Each env call runs in a thread of its own that
the request waits on for ``call_timeout`` seconds at most (then 504); the id stays busy (503) while
that call runs on, until it returns or the id is closed. A call waits ``BUSY_WAIT`` seconds at most
for another call on the same id (then 503 naming it busy), so calls on a stuck id cannot take every
worker thread. :meth:`ServedEnvs.stop` (shutdown) answers every waiting call 503 at once, and
:meth:`ServedEnvs.close_all` closes every env side by side, each failure one line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from omrl.envs import Env, EpisodeFinishedError, UnknownTaskError
from omrl.serve.answers import Opening, Step, actions_of, checked_step, opening_of
from omrl.threads import on_daemon_thread

DEFAULT_MAX_ENVS = 256
DEFAULT_IDLE_TIMEOUT = 1800.0  # seconds; an LLM turn takes far less, a killed client never comes back
SWEEP_EVERY = 1.0  # seconds between idle checks on calls other than create
REMEMBERED_RECLAIMS = 4096  # reclaimed ids answered 410 (older ones: 404)
DEFAULT_CALL_TIMEOUT = 300.0  # seconds an env call may run before its request gives up (504)
BUSY_WAIT = 5.0  # seconds a call waits for another call on the same id to end (then 503)
CLOSE_WAIT = 10.0  # seconds shutdown waits for the envs' close(), all together


class Rejected(Exception):
    """A request that gets an error answer with an HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Slot:
    """One env id: its instance, its lock and where its episode stands."""

    env: Env
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    ended: str = ""  # why the episode is over ("" while it runs)
    observation: str = ""  # the last observation, as the env gave it
    shown: str = ""  # the same with the goal inside it while it is the episode's first
    used: float = field(default_factory=time.monotonic)  # when a call last touched it
    gone: str = ""  # "idle" or "closed" once the id is closed: a call that waited for its lock is refused
    call: _Call | None = None  # the env call made last; while it runs, the id is busy


@dataclass
class _Call:
    """An env call running in a thread of its own (see :meth:`ServedEnvs._run`)."""

    what: str
    result: concurrent.futures.Future
    started: float = field(default_factory=time.monotonic)


class ServedEnvs:
    """The env instances of one server, by id, at most ``max_envs`` at once; those idle past
    ``idle_timeout`` seconds are closed, and a request gives up on an env call after ``call_timeout``
    seconds (None or 0: never)."""

    def __init__(
        self,
        name: str,
        make_env: Callable[[], Env],
        max_envs: int = DEFAULT_MAX_ENVS,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
    ):
        self.name = name
        self.max_envs = max_envs
        self.idle_timeout = idle_timeout or None
        self.call_timeout = call_timeout or None
        self._stopping: concurrent.futures.Future = concurrent.futures.Future()  # done once stop() ran
        self.instance = _new_instance()  # drawn again at each start (see start)
        self._make_env = make_env
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._creating = 0  # envs being built: they count against max_envs already
        self.first_id = _first_id()
        self._ids = itertools.count(self.first_id)
        self._reclaimed: OrderedDict[int, None] = OrderedDict()
        self._swept = time.monotonic()

    def start(self) -> None:
        """A new instance name and a new first id: ids handed out before this start are refused
        (410) to omrl's client and unknown (404) to any other, never handed out again."""
        self.instance = _new_instance()
        self._stopping = concurrent.futures.Future()
        with self._lock:
            self.first_id = max(_first_id(), next(self._ids))  # above this object's earlier ids, whatever the clock
            self._ids = itertools.count(self.first_id)

    # -- ids -------------------------------------------------------------------------------
    def create(self) -> int:
        """A new env id with a fresh env, not in an episode yet; 503 past ``max_envs``."""
        self.reclaim_idle()
        with self._lock:
            if len(self._slots) + self._creating >= self.max_envs:
                raise Rejected(
                    503,
                    f"this server holds its limit of {self.max_envs} live envs (max_envs); "
                    "close some with POST /close, or restart it with a higher --max-envs" + self._idle_hint(),
                )
            self._creating += 1
        try:
            env = self._make_env()
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            raise Rejected(500, f"creating env {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self._creating -= 1
        with self._lock:
            env_id = next(self._ids)
            self._slots[env_id] = _Slot(env)
        return env_id

    def get(self, env_id: Any) -> _Slot:
        """The slot of ``env_id``; unknown ids get a 404, ids closed for idleness a 410."""
        if self.idle_timeout and time.monotonic() - self._swept > SWEEP_EVERY:
            self.reclaim_idle()
        valid = isinstance(env_id, int) and not isinstance(env_id, bool)
        with self._lock:
            slot = self._slots.get(env_id) if valid else None
            if slot is None:
                if valid and env_id in self._reclaimed:
                    raise self._gone(env_id)
                raise self._unknown(env_id)
            slot.used = time.monotonic()
            return slot

    @contextlib.contextmanager
    def _held(self, env_id: Any, even_busy: bool = False) -> Iterator[_Slot]:
        """The slot of ``env_id`` with its lock held; its idle time starts again when the call ends.
        503 while an earlier call on it runs on (``even_busy``: go ahead anyway, as a close does)."""
        slot = self.get(env_id)
        if not slot.lock.acquire(timeout=BUSY_WAIT):
            raise self._busy(env_id, slot)
        try:
            if slot.gone:  # closed while this call waited for the lock
                raise self._gone(env_id) if slot.gone == "idle" else self._unknown(env_id)
            if not even_busy and slot.call is not None and not slot.call.result.done():
                raise self._busy(env_id, slot)
            yield slot
        finally:
            slot.used = time.monotonic()
            slot.lock.release()

    def _run(self, env_id: int, slot: _Slot, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` (an env method) in a thread of its own; the request waits for it ``call_timeout``
        seconds at most (then 504: the call runs on and its id stays busy), or until :meth:`stop`."""
        slot.call = _Call(what, on_daemon_thread(call, f"omrl-env-{env_id}-{what}"))
        concurrent.futures.wait(
            [slot.call.result, self._stopping], self.call_timeout, concurrent.futures.FIRST_COMPLETED
        )
        if slot.call.result.done():
            return slot.call.result.result()
        if self._stopping.done():
            raise Rejected(503, f"env id {env_id}: the server is shutting down; its {what} was left running")
        raise Rejected(
            504,
            f"env id {env_id}: the env did not return from {what} within {self.call_timeout:g} s "
            "(--call-timeout); the id stays busy while it runs: close it and create a new env",
        )

    def stop(self) -> None:
        """Shutdown begins: requests waiting on env calls answer 503 now instead of holding it up."""
        if not self._stopping.done():
            self._stopping.set_result(None)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)

    def close(self, env_id: int) -> None:
        """Forget ``env_id`` and free what its env holds (processes, connections); a stuck env too."""
        with self._held(env_id, even_busy=True) as slot:
            slot.gone = "closed"  # a call that looked the id up before this close answers 404
            with self._lock:
                self._slots.pop(env_id, None)
            try:
                self._run(env_id, slot, "close", slot.env.close)
            except Exception as exc:  # noqa: BLE001 - the id is forgotten either way
                raise _crash("close", exc) from exc

    def close_all(self) -> list[str]:
        """Stop, then close every env side by side, waiting ``CLOSE_WAIT`` seconds at most in all;
        returns a line for each env whose close raised or did not return."""
        self.stop()
        with self._lock:
            slots, self._slots = self._slots, {}
        closing = {
            env_id: on_daemon_thread(slot.env.close, f"omrl-env-{env_id}-close") for env_id, slot in slots.items()
        }
        concurrent.futures.wait(closing.values(), CLOSE_WAIT)
        problems = []
        for env_id, closed in closing.items():
            if not closed.done():
                problems.append(f"env id {env_id}: close() did not return within {CLOSE_WAIT:g} s; left running")
            elif closed.exception() is not None:
                problems.append(f"env id {env_id}: close() raised {_one_line(closed.exception())}")
        return problems

    def reclaim_idle(self) -> list[int]:
        """Close the envs no call touched for ``idle_timeout`` seconds; returns their ids.

        Such an env's client most likely died (a killed run never closes its envs): without this,
        envs of killed clients fill the server until every create is refused. An env a call is
        using right now is never taken.
        """
        if not self.idle_timeout:
            return []
        now, taken = time.monotonic(), []
        with self._lock:
            self._swept = now
            for env_id, slot in list(self._slots.items()):
                if now - slot.used > self.idle_timeout and slot.lock.acquire(blocking=False):
                    slot.gone = "idle"
                    del self._slots[env_id]
                    self._reclaimed[env_id] = None
                    taken.append((env_id, slot))
                    slot.lock.release()
            while len(self._reclaimed) > REMEMBERED_RECLAIMS:
                self._reclaimed.popitem(last=False)
        for env_id, slot in taken:  # the env is forgotten either way; nobody waits on these closes
            on_daemon_thread(slot.env.close, f"omrl-env-{env_id}-close")
        return [env_id for env_id, _ in taken]

    def _unknown(self, env_id: Any) -> Rejected:
        # other clients' ids are theirs: naming them would let this client step their episodes
        return Rejected(404, f"the id {env_id!r} is not valid: no live env holds it (create one, or check the id)")

    def _busy(self, env_id: int, slot: _Slot) -> Rejected:
        call = slot.call
        running = f": its {call.what} has run for {time.monotonic() - call.started:.0f} s" if call else ""
        return Rejected(503, f"env id {env_id} is busy{running}; calls on one id run one at a time (close a stuck env)")

    def _gone(self, env_id: int) -> Rejected:
        return Rejected(
            410,
            f"env id {env_id} was closed after no call touched it for {self.idle_timeout:g} s "
            "(this server's --idle-timeout): its client looked dead; create a new env",
        )

    def _idle_hint(self) -> str:
        if self.idle_timeout:
            return f" (envs idle for {self.idle_timeout:g} s are closed: --idle-timeout)"
        return " (envs are never closed for idleness here: --idle-timeout 0)"

    # -- episodes --------------------------------------------------------------------------
    def reset(self, env_id: int, task_id: int) -> Opening:
        """Start task ``task_id`` on ``env_id``; 404 for a task the env does not have."""
        with self._held(env_id) as slot:
            slot.started, slot.ended = False, "not reset"
            try:
                opening = self._run(env_id, slot, "reset", lambda: opening_of(slot.env, task_id))
            except UnknownTaskError as exc:
                slot.ended = "its last reset named an unknown task"
                raise Rejected(404, str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - an env crash is the server's 500
                raise _crash("reset", exc) from exc
            slot.started, slot.ended = True, ""
            slot.observation, slot.shown = opening.text, opening.shown
            return opening

    def step(self, env_id: int, action: str) -> Step:
        """Play ``action``; 409 before a reset or after the episode ended (or crashed)."""
        with self._held(env_id) as slot:
            if not slot.started:
                raise Rejected(409, f"env id {env_id} has no episode ({slot.ended or 'not reset'}): reset it first")
            if slot.ended:
                raise Rejected(409, f"the episode of env id {env_id} is over ({slot.ended}): reset it")
            try:
                step = self._run(env_id, slot, "step", lambda: checked_step(slot.env, action))
            except EpisodeFinishedError as exc:
                slot.ended = "finished"
                raise Rejected(409, str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - the episode cannot go on after a crash or a timeout
                failure = _crash("step", exc)
                slot.ended = f"it crashed: {failure}"
                raise failure from exc
            slot.observation = slot.shown = step.observation
            if step.done:
                slot.ended = "finished"
            return step

    def observation(self, env_id: int, with_goal: bool = True) -> str:
        """The last observation ("" before the first reset); ``with_goal``: the goal inside the
        episode's first, as :func:`~omrl.serve.answers.with_goal` puts it."""
        with self._held(env_id) as slot:
            return slot.shown if with_goal else slot.observation

    def actions(self, env_id: int) -> list[str]:
        """The admissible actions now; [] when the env does not know them or no episode runs."""
        with self._held(env_id) as slot:
            if not slot.started or slot.ended:
                return []
            try:
                return self._run(env_id, slot, "admissible_actions", lambda: actions_of(slot.env))
            except Exception as exc:  # noqa: BLE001
                raise _crash("admissible_actions", exc) from exc

    def expert_action(self, env_id: int) -> str | None:
        """The env's expert action now; None when it has none or no episode runs."""
        with self._held(env_id) as slot:
            if not slot.started or slot.ended:
                return None
            try:
                return self._run(env_id, slot, "expert_action", slot.env.expert_action)
            except Exception as exc:  # noqa: BLE001
                raise _crash("expert_action", exc) from exc


def _new_instance() -> str:
    return uuid.uuid4().hex[:16]


def _first_id() -> int:
    """Where a start numbers its ids from: the microseconds since the epoch (see the module docstring)."""
    return time.time_ns() // 1000


def _crash(what: str, exc: BaseException) -> Rejected:
    """The answer to an env call that failed: 500 naming what it raised (a refusal stays as it is)."""
    return exc if isinstance(exc, Rejected) else Rejected(500, f"the env raised in {what}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
