"""A pool of env instances: created once, reused across tasks, stepped together.

An instance plays one episode at a time and starts the next one with
``reset``, so a rollout needs only as many instances as episodes it plays at
once, and a trainer that keeps its pool across steps never rebuilds an env.
Envs that wait on I/O (``io_bound``) are reset and stepped from a thread pool;
the others inline, where threads would only add overhead.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from omrl.envs import Env, Observation, StepResult, create_env

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
        self._threads: ThreadPoolExecutor | None = None
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
            _close_quietly(env)
            return problem
        self._idle.append(env)
        return None

    def probe(self) -> Env:
        """One instance for questions that need no episode (task ids, prompts); it stays in the pool."""
        if self._template_env is None:
            self._template_env = self.acquire()
            self.release(self._template_env)
        return self._template_env

    def reset_many(self, pairs: Sequence[tuple[Env, int]]) -> list[Observation | BaseException]:
        """``env.reset(task_id)`` for each pair; an exception is returned in its slot, not raised."""
        return self._map(lambda pair: pair[0].reset(pair[1]), pairs)

    def step_many(self, pairs: Sequence[tuple[Env, str]]) -> list[StepResult | BaseException]:
        """``env.step(action)`` for each pair; an exception is returned in its slot, not raised."""
        return self._map(lambda pair: pair[0].step(pair[1]), pairs)

    def call_many(self, fn: Callable[[Env], T], envs: Sequence[Env]) -> list[T | BaseException]:
        """``fn(env)`` for each env, concurrently when the env is I/O-bound."""
        return self._map(fn, envs)

    def _map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | BaseException]:
        def safe(item: Any) -> T | BaseException:
            try:
                return fn(item)
            except Exception as exc:  # noqa: BLE001 - one failing env must not stop the batch
                return exc

        if self.io_bound and len(items) > 1:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="omrl-env")
            return list(self._threads.map(safe, items))
        return [safe(item) for item in items]

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
        if self._threads is not None:
            self._threads.shutdown(wait=True)
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
