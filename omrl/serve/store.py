"""The envs of one ``omrl env serve`` server: env ids, their episodes and locks, and no HTTP.

Each id holds its own env instance; ids are handed out under a lock and every call on one id
holds that id's lock, so one id's calls are serialized while different ids run in parallel
(FastAPI runs the server's handlers in its thread pool). What the env returns is checked here
(a reward that is not a finite number, an observation that is not text: the env's fault, a 500),
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
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from omrl.envs import Env, EpisodeFinishedError, UnknownTaskError, clean_text, reset_problem

DEFAULT_MAX_ENVS = 256
DEFAULT_IDLE_TIMEOUT = 1800.0  # seconds; an LLM turn takes far less, a killed client never comes back
SWEEP_EVERY = 1.0  # seconds between idle checks on calls other than create
REMEMBERED_RECLAIMS = 4096  # reclaimed ids answered 410 (older ones: 404)


class Rejected(Exception):
    """A request that gets an error answer with an HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def with_goal(text: str, instruction: str) -> str:
    """The first observation as an agent that reads only observations must see it: the
    instruction, a blank line, then ``text`` (just ``text`` when it holds the instruction already).

    omrl's rollout opens an episode with the same message, so an agent sees one prompt whether it
    plays an env through omrl or through AgentGym's clients, which read the observation alone.
    """
    return text if instruction in text else f"{instruction}\n\n{text}"


@dataclass
class Opening:
    """What a reset showed: the env's own observation and instruction, and ``shown``, the
    observation with the goal inside it (see :func:`with_goal`)."""

    task_id: int
    text: str
    instruction: str
    shown: str
    info: dict[str, Any]
    actions: list[str]


@dataclass
class Step:
    """What a step returned, checked: finite numbers, text, JSON-safe info."""

    observation: str
    reward: float
    score: float
    done: bool
    won: bool
    info: dict[str, Any]
    actions: list[str]  # admissible now; [] when unknown or the episode is over


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
    reclaimed: bool = False  # closed for idleness while a call waited for its lock


class ServedEnvs:
    """The env instances of one server, by id, at most ``max_envs`` at once; those idle past
    ``idle_timeout`` seconds are closed (None or 0: never)."""

    def __init__(
        self,
        name: str,
        make_env: Callable[[], Env],
        max_envs: int = DEFAULT_MAX_ENVS,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    ):
        self.name = name
        self.max_envs = max_envs
        self.idle_timeout = idle_timeout or None
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

    def get(self, env_id: Any, remove: bool = False) -> _Slot:
        """The slot of ``env_id`` (taken out with ``remove``); unknown ids get a 404, ids closed
        for idleness a 410."""
        if self.idle_timeout and time.monotonic() - self._swept > SWEEP_EVERY:
            self.reclaim_idle()
        valid = isinstance(env_id, int) and not isinstance(env_id, bool)
        with self._lock:
            slot = (self._slots.pop if remove else self._slots.get)(env_id, None) if valid else None
            if slot is None:
                if valid and env_id in self._reclaimed:
                    raise self._gone(env_id)
                raise Rejected(404, f"the id {env_id!r} is not valid; live ids: {sorted(self._slots)[:20]}")
            slot.used = time.monotonic()
            return slot

    @contextlib.contextmanager
    def _held(self, env_id: Any) -> Iterator[_Slot]:
        """The slot of ``env_id`` with its lock held; its idle time starts again when the call ends."""
        slot = self.get(env_id)
        with slot.lock:
            if slot.reclaimed:  # closed for idleness while this call waited for the lock
                raise self._gone(env_id)
            try:
                yield slot
            finally:
                slot.used = time.monotonic()

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)

    def close(self, env_id: int) -> None:
        """Forget ``env_id`` and free what its env holds (processes, connections)."""
        slot = self.get(env_id, remove=True)
        with slot.lock:
            slot.env.close()

    def close_all(self) -> None:
        for env_id in self.ids():
            self.close(env_id)

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
                    slot.reclaimed = True
                    del self._slots[env_id]
                    self._reclaimed[env_id] = None
                    taken.append((env_id, slot))
            while len(self._reclaimed) > REMEMBERED_RECLAIMS:
                self._reclaimed.popitem(last=False)
        for _, slot in taken:
            try:
                slot.env.close()
            except Exception:  # noqa: BLE001 - the env is forgotten either way; nobody waits on this close
                pass
            finally:
                slot.lock.release()
        return [env_id for env_id, _ in taken]

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
                opening = opening_of(slot.env, task_id)
            except UnknownTaskError as exc:
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
                result = slot.env.step(action)
                done = bool(result.done)
                step = Step(
                    clean_text(result.observation),
                    _finite(result.reward, "reward"),
                    _finite(result.score, "score"),
                    done,
                    result.won,
                    _jsonable(result.info),
                    [] if done else _actions(slot.env),
                )
            except EpisodeFinishedError as exc:
                slot.ended = "finished"
                raise Rejected(409, str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - the episode cannot go on after a crash
                slot.ended = f"the env crashed: {type(exc).__name__}: {exc}"
                raise _crash("step", exc) from exc
            slot.observation = slot.shown = step.observation
            if done:
                slot.ended = "finished"
            return step

    def observation(self, env_id: int, with_goal: bool = True) -> str:
        """The last observation ("" before the first reset); ``with_goal``: the goal inside the
        episode's first, as :func:`with_goal` puts it."""
        with self._held(env_id) as slot:
            return slot.shown if with_goal else slot.observation

    def actions(self, env_id: int) -> list[str]:
        """The admissible actions now; [] when the env does not know them or no episode runs."""
        with self._held(env_id) as slot:
            if not slot.started or slot.ended:
                return []
            try:
                return _actions(slot.env)
            except Exception as exc:  # noqa: BLE001
                raise _crash("admissible_actions", exc) from exc

    def expert_action(self, env_id: int) -> str | None:
        """The env's expert action now; None when it has none or no episode runs."""
        with self._held(env_id) as slot:
            if not slot.started or slot.ended:
                return None
            try:
                return slot.env.expert_action()
            except Exception as exc:  # noqa: BLE001
                raise _crash("expert_action", exc) from exc


def opening_of(env: Env, task_id: int) -> Opening:
    """Reset ``env`` to ``task_id`` and check what it returned (a bad return raises ValueError)."""
    first = env.reset(task_id)
    problem = reset_problem(first)
    if problem:
        raise ValueError(f"env {type(env).__name__} {problem}")
    text, instruction = clean_text(first.text), clean_text(first.instruction)
    return Opening(task_id, text, instruction, with_goal(text, instruction), _jsonable(first.info), _actions(env))


def _actions(env: Env) -> list[str]:
    return [str(a) for a in env.admissible_actions() or ()]


def _new_instance() -> str:
    return uuid.uuid4().hex[:16]


def _first_id() -> int:
    """Where a start numbers its ids from: the microseconds since the epoch (see the module docstring)."""
    return time.time_ns() // 1000


def _jsonable(value: Any) -> Any:
    """Env info as JSON (anything JSON cannot hold becomes its string, NaN and infinities too)."""
    return json.loads(json.dumps(value, default=str), parse_constant=str)


def _finite(value: Any, what: str) -> float:
    """A reward or score the env returned, as a float; anything else is the env's fault (500)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"the env returned a {what} that is not finite: {number}")
    return number


def _crash(what: str, exc: BaseException) -> Rejected:
    return Rejected(500, f"the env raised in {what}: {type(exc).__name__}: {exc}")
