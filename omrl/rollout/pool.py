"""A pool of env instances: created once, reused across tasks, stepped together.

An instance plays one episode at a time and starts the next one with
``reset``, so a rollout needs only as many instances as episodes it plays at
once, and a trainer that keeps its pool across steps never rebuilds an env.
Envs that wait on I/O (``io_bound``) are reset and stepped from a thread pool;
the others inline, where threads would only add overhead.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, Sequence, TypeVar

from omrl import supervisor
from omrl.envs import Env, Observation, StepResult, create_env
from omrl.supervisor import StageStalled
from omrl.threads import on_daemon_thread

T = TypeVar("T")


class EnvPool:
    """Instances of one env class, handed out with :meth:`acquire` and given back with :meth:`release`."""

    def __init__(
        self, env_class: type[Env], options: dict[str, Any] | None = None, name: str = "", num_workers: int = 8
    ):
        self.env_class = env_class
        self.options = dict(options or {})
        self.name = name or env_class.__name__
        self.num_workers = max(1, num_workers)
        self.created = 0  # instances built so far (tests and benchmarks read it)
        self._idle: list[Env] = []
        self._all: list[Env] = []
        self._threads: DaemonThreads | None = None
        self._template_env: Env | None = None

    @property
    def io_bound(self) -> bool:
        return bool(getattr(self.env_class, "io_bound", False))

    def acquire(self) -> Env:
        """An idle instance, or a new one when all are playing."""
        return self._idle.pop() if self._idle else self._create()

    def release(self, env: Env, broken: bool = False) -> BaseException | None:
        """Give ``env`` back, its episode over; a broken one (it raised) is closed and never handed
        out again. The env frees what its episode held now (:meth:`Env.end_episode`): a server-side
        env kept until the next reset could outlive a server restart and end another client's env.
        Returns what ``end_episode`` raised (the env is then broken too): the episode's env was not
        what it should have been, so the caller cannot trust the episode."""
        problem = None
        if not broken:
            try:
                env.end_episode()
            except Exception as exc:  # noqa: BLE001 - whatever the env raised: the caller records it
                problem = broken = exc
        if broken:
            self._all.remove(env)
            if env is self._template_env:
                self._template_env = None
            # off this thread: a broken env may be one that stalled, and its close may stall too
            threading.Thread(target=_close_quietly, args=(env,), name="omrl-env-close", daemon=True).start()
            return problem
        self._idle.append(env)
        return None

    def probe(self) -> Env:
        """One instance for questions that need no episode (task ids, prompts); it stays in the pool."""
        if self._template_env is None:
            self._template_env = self.acquire()
            self.release(self._template_env)
        return self._template_env

    def reset_many(
        self, pairs: Sequence[tuple[Env, int]], labels: Sequence[str] = ()
    ) -> list[Observation | BaseException]:
        """``env.reset(task_id)`` for each pair; an exception is returned in its slot, not raised.
        ``labels`` name each pair's episode in a stall's message."""
        return self._map(lambda pair: pair[0].reset(pair[1]), pairs, "env_reset", labels)

    def step_many(
        self, pairs: Sequence[tuple[Env, str]], labels: Sequence[str] = ()
    ) -> list[StepResult | BaseException]:
        """``env.step(action)`` for each pair; an exception is returned in its slot, not raised."""
        return self._map(lambda pair: pair[0].step(pair[1]), pairs, "env_step", labels)

    def call_many(self, fn: Callable[[Env], T], envs: Sequence[Env]) -> list[T | BaseException]:
        """``fn(env)`` for each env, concurrently when the env is I/O-bound."""
        return self._map(fn, envs, "env_step", ())

    def _map(
        self, fn: Callable[[Any], T], items: Sequence[Any], stage: str, labels: Sequence[str]
    ) -> list[T | BaseException]:
        """``fn`` over ``items``, each under the run's deadline for ``stage``: one that outlives it is
        :class:`~omrl.supervisor.StageStalled` in its slot (its env is then broken and left behind),
        unless the run says to stop (``deadlines.on_stall=stop``): then it is raised."""
        names = list(labels) or [""] * len(items)

        watched = supervisor.current() is not None  # no supervisor (library use): no stage to open per call

        def safe(item: Any, label: str) -> T | BaseException:
            try:
                if not watched:
                    return fn(item)
                with supervisor.stage(stage, env=self.name, episode=label):
                    return fn(item)
            except StageStalled as exc:
                if not exc.drops_episodes():
                    raise
                return exc
            except Exception as exc:  # noqa: BLE001 - one failing env must not stop the batch
                return exc

        if self.io_bound and len(items) > 1:
            return self._map_threaded(fn, items, stage, names)
        return [safe(item, label) for item, label in zip(items, names)]

    def _map_threaded(self, fn: Callable[[Any], T], items: Sequence[Any], stage: str, labels: list[str]) -> list[Any]:
        """:meth:`_map` on the pool's threads. Their calls cannot be interrupted, so this thread bounds its
        wait: a call past its deadline (counted from when it was handed over) is left behind, and the next
        map starts on fresh threads."""
        if self._threads is None:
            self._threads = DaemonThreads(self.num_workers, f"omrl-env-{self.name}")
        watcher = supervisor.current()
        watched = [
            watcher.open(stage, {"env": self.name, "episode": label}, waited=True) if watcher else None
            for label in labels
        ]
        futures = {self._threads.submit(fn, item): index for index, item in enumerate(items)}
        results: list[Any] = [None] * len(items)
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.25 if any(watched) else None)
                for future in done:
                    error = future.exception()
                    results[futures[future]] = error if error is not None else future.result()
                for future in [f for f in pending if watched[futures[f]] and watched[futures[f]].fired]:
                    pending.discard(future)
                    results[futures[future]] = StageStalled(watched[futures[future]].message, stage)
        finally:
            for record in watched:
                if watcher is not None:
                    watcher.close(record)
        stalls = [r for r in results if isinstance(r, StageStalled)]
        if stalls:
            self._threads = None  # the stuck threads stay behind (daemons); the next map starts on new ones
            if not stalls[0].drops_episodes():
                raise stalls[0]
        return results

    def _create(self) -> Env:
        env = create_env(self.env_class, self.options, self.name)
        self.created += 1
        self._all.append(env)
        return env

    def close(self) -> None:
        """Close every instance and the thread pool."""
        for env in self._all:
            _close_quietly(env)
        self._all, self._idle, self._template_env = [], [], None
        self._threads = None

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_quietly(env: Env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing a broken env may fail again; nothing to do about it
        pass


class DaemonThreads:
    """At most ``workers`` calls at once, each on a daemon thread of its own: a call stuck for good
    (a server that never answers) is left behind without holding up the next calls or the process's exit,
    as a ``ThreadPoolExecutor``'s threads would (they are joined at exit)."""

    def __init__(self, workers: int, name: str):
        self._slots = threading.BoundedSemaphore(workers)
        self._name = name

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        return on_daemon_thread(lambda: fn(*args), self._name, gate=self._slots)
