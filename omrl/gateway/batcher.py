"""Requests of many agents, generated together.

Agents call the gateway on threads of their own and at their own pace. The batcher's one thread owns
the backend: it waits for the first request, keeps collecting for a short window (or until every live
episode is waiting, whichever comes first), then runs everything collected in as few generate calls as
there are sampling settings among them. Requests that arrive meanwhile go in the next call, so no
agent waits for another agent's tool or its next thought, only for the generate call it is in.
Releasing an ended episode's cached KV states goes through the same thread (the backend is not
thread-safe).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from omrl.backends.base import Backend, Generation, SamplingParams


@dataclass(eq=False)
class _Job:
    prompt: list[int] | None  # None: a release job
    cap: int = 0
    sampling: tuple[float, float, int | None] = (1.0, 1.0, None)  # temperature, top_p, a request's own seed
    releases: list[list[int]] = field(default_factory=list)
    future: Future = field(default_factory=Future)


class Batcher:
    """Runs generate calls for the gateway's requests (see the module docstring).

    ``waiting_for``: how many episodes are live, so a batch goes as soon as each of them has a
    request in it. ``failure``: the first exception a generate call raised (the run must not
    mistake a broken engine for agents that failed).
    """

    def __init__(
        self, backend: Backend, window_s: float = 0.02, seed: int = 0, waiting_for: Callable[[], int] | None = None
    ):
        self.backend = backend
        self.window_s = window_s
        self.seed = seed
        self.waiting_for = waiting_for or (lambda: 0)
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.failure: BaseException | None = None
        self._jobs: list[_Job] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="omrl-gateway-batcher", daemon=True)
        self._thread.start()

    def generate(
        self, prompt: list[int], cap: int, temperature: float, top_p: float, seed: int | None = None
    ) -> Future:
        """A future of the :class:`Generation` for ``prompt`` (at most ``cap`` new tokens). A request with its
        own ``seed`` is generated in a call of its own settings (the same seed and prompts: the same samples)."""
        return self._put(_Job(list(prompt), cap, (temperature, top_p, seed)))

    def release(self, rows: list[list[int]]) -> None:
        """Forget the backend's cached states of these rows (an ended episode's), in turn with the calls."""
        if rows:
            self._put(_Job(None, releases=rows))

    def _put(self, job: _Job) -> Future:
        with self._ready:
            if self._closed:
                job.future.set_exception(RuntimeError("the gateway's batcher is closed"))
                return job.future
            self._jobs.append(job)
            self._ready.notify()
        return job.future

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if self._closed and not self._jobs:
                    return
                deadline = time.monotonic() + self.window_s
                while not self._closed and self._pending() < max(1, self.waiting_for()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                jobs, self._jobs = self._jobs, []
            try:
                self._serve(jobs)
            except BaseException as exc:  # noqa: BLE001 - the thread must outlive a failed release, and say why
                self.failure = self.failure or exc
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _pending(self) -> int:
        return sum(job.prompt is not None for job in self._jobs)

    def _serve(self, jobs: list[_Job]) -> None:
        releases = [row for job in jobs if job.prompt is None for row in job.releases]
        if releases:
            try:
                self.backend.release(releases)
            finally:
                for job in jobs:
                    if job.prompt is None:
                        job.future.set_result(None)
        by_sampling: dict[tuple[float, float, int | None], list[_Job]] = {}
        for job in jobs:
            if job.prompt is not None:
                by_sampling.setdefault(job.sampling, []).append(job)
        for (temperature, top_p, seed), batch in by_sampling.items():
            params = SamplingParams(
                max_new_tokens=[job.cap for job in batch],
                temperature=temperature,
                top_p=top_p,
                seed=self.seed * 1_000_003 + self.calls * 10_007 if seed is None else seed,
            )
            self.calls += 1
            self.batch_sizes.append(len(batch))
            try:
                replies: list[Any] = list(self.backend.generate([job.prompt for job in batch], params))
            except BaseException as exc:  # noqa: BLE001 - every waiting request learns why
                self.failure = self.failure or exc
                for job in batch:
                    job.future.set_exception(exc)
                continue
            if len(replies) != len(batch) or not all(isinstance(reply, Generation) for reply in replies):
                wrong = next((r for r in replies if not isinstance(r, Generation)), None)
                broken = RuntimeError(
                    f"the {type(self.backend).__name__} backend answered {len(batch)} prompts with {len(replies)} "
                    f"replies{'' if wrong is None else f', one of them {type(wrong).__name__}: {wrong}'}"
                )
                self.failure = self.failure or broken
                for job in batch:
                    job.future.set_exception(broken)
                continue
            for job, reply in zip(batch, replies):
                job.future.set_result(reply)
