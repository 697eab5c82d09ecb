"""Requests of many agents, generated together.

Agents call the gateway on threads of their own and at their own pace. The batcher's one thread owns
the backend: it waits for the first request, then keeps collecting while requests keep coming, or until
every live episode is waiting, whichever comes first, then runs everything collected in as few generate
calls as there are sampling settings among them (a request with a seed of its own: a call of its own,
its choices together). "While requests keep coming": until a gap with none new passes, ``window_s`` or a tenth of the last generate call's time if longer, and at most
``max_wait_s`` (or half the last call's time) after the first. A request that misses a call waits for
the whole next one, so the longer a call takes, the longer it pays to wait for a straggler; an agent
busy with its tools holds the others back by that gap at most. Requests that arrive meanwhile go in the next call, so no
agent waits for another agent's tool or its next thought, only for the generate call it is in.
Releasing an ended episode's cached KV states goes through the same thread (the backend is not
thread-safe).

A backend that batches continuously (``generation.batching=continuous``: :meth:`Backend.stream`) needs
no window: each request joins the running decode batch as it arrives, between two decode steps, and
its reply goes back the step it ends, so no agent waits for another's longer reply either.

Which thread: a rollout drives the batcher from its own (the main) thread while the agents play
(:meth:`Batcher.drive`), because torch computes slower from a thread it was not set up on (measured:
SmolLM2's generate of 16 prompts took 4.0-4.3 s from another thread, 2.7-3.4 s from the main one); a
gateway used on its own runs the batcher on a thread of its own (``own_thread``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from omrl.backends.base import Backend, Generation, SamplingParams, Stream
from omrl.supervisor import stage

STRAGGLER_GAP = 0.1  # of the last generate call's time: how long a gap between requests may be in one batch
STRAGGLER_WAIT = 0.5  # of it: how long after the first request a batch may wait at most
DRIVE_POLL_S = 0.05  # how often a driving thread with nothing to serve asks whether it is done


@dataclass(eq=False)
class _Job:
    prompt: list[int] | None  # None: a release job
    cap: int = 0
    sampling: tuple[float, float, int | None] = (1.0, 1.0, None)  # temperature, top_p, a request's own seed
    call: object = None  # a seeded request's own token: its choices share a generate call, no other job does
    releases: list[list[int]] = field(default_factory=list)
    future: Future = field(default_factory=Future)


class Batcher:
    """Runs generate calls for the gateway's requests (see the module docstring).

    ``waiting_for``: how many episodes are live, so a batch goes as soon as each of them has a
    request in it. ``failure``: the first exception a generate call raised (the run must not
    mistake a broken engine for agents that failed).
    """

    def __init__(
        self,
        backend: Backend,
        window_s: float = 0.02,
        seed: int = 0,
        waiting_for: Callable[[], int] | None = None,
        max_wait_s: float = 0.25,
        own_thread: bool = True,
    ):
        self.backend = backend
        self.window_s = window_s
        self.max_wait_s = max(max_wait_s, window_s)
        self._last_arrival = 0.0
        self._last_call_s = 0.0  # how long the last generate call took
        self.seed = seed
        self.waiting_for = waiting_for or (lambda: 0)
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.failure: BaseException | None = None
        self._jobs: list[_Job] = []
        self._streams: dict[tuple[float, float], tuple[Stream, dict[int, _Job]]] = {}  # by temperature, top_p
        self._ready = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if own_thread:
            self._thread = threading.Thread(target=self._run, name="omrl-gateway-batcher", daemon=True)
            self._thread.start()

    @property
    def serves_itself(self) -> bool:
        """Whether a thread of its own serves the requests (else someone must :meth:`drive` it)."""
        return self._thread is not None

    def drive(self, until: Callable[[], bool]) -> None:
        """Serve requests on the calling thread until ``until()`` holds with none waiting (a batcher made
        without ``own_thread``). A failure is raised here, after every waiting request has been told."""
        if self._thread is not None:
            raise RuntimeError("this batcher serves on a thread of its own; drive() is for one made without")
        try:
            self._loop(until)
        except BaseException as exc:
            self._fail_all(exc)
            raise

    def generate(
        self,
        prompt: list[int],
        cap: int,
        temperature: float,
        top_p: float,
        seed: int | None = None,
        call: object = None,
    ) -> Future:
        """A future of the :class:`Generation` for ``prompt`` (at most ``cap`` new tokens). A request with its
        own ``seed`` is generated in a generate call of its own, shared only with the jobs given the same
        ``call`` token (a request's other choices): the same seed and prompts give the same samples, whatever
        else is waiting."""
        return self._put(_Job(list(prompt), cap, (temperature, top_p, seed), call=call if seed is not None else None))

    def release(self, rows: list[list[int]]) -> None:
        """Forget the backend's cached states of these rows (an ended episode's), in turn with the calls."""
        if rows:
            self._put(_Job(None, releases=rows))

    def _put(self, job: _Job) -> Future:
        with self._ready:
            if self._closed:
                why = f": {type(self.failure).__name__}: {self.failure}" if self.failure else ""
                job.future.set_exception(RuntimeError(f"the gateway's batcher is closed{why}"))
                return job.future
            self._jobs.append(job)
            self._last_arrival = time.monotonic()
            self._ready.notify()
        return job.future

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        if self._thread is not None:
            self._thread.join(timeout=60)
        else:  # nobody will serve what is still waiting
            self._fail_all(RuntimeError("the gateway closed"))

    def _run(self) -> None:
        try:
            self._loop(lambda: False)
        except BaseException as exc:  # noqa: BLE001 - no request may wait on a thread that is gone
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        self.failure = self.failure or exc
        with self._ready:
            self._closed = True
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(exc)

    def _loop(self, until: Callable[[], bool]) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed and not self._streams:
                    if until():
                        return
                    self._ready.wait(DRIVE_POLL_S)
                if self._closed and not self._jobs and not self._streams:
                    return
                gap = max(self.window_s, STRAGGLER_GAP * self._last_call_s)
                latest = time.monotonic() + max(self.max_wait_s, STRAGGLER_WAIT * self._last_call_s)
                # a stream takes requests between decode steps: none waits for the others
                while not self._streams and not self._closed and self._pending() < max(1, self.waiting_for()):
                    left = min(self._last_arrival + gap, latest) - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                jobs, self._jobs = self._jobs, []
            try:
                self._serve(jobs)
                self._advance_streams()
            except BaseException as exc:  # noqa: BLE001 - the thread must outlive a failed release, and say why
                self.failure = self.failure or exc
                for job in [*jobs, *(job for _, tickets in self._streams.values() for job in tickets.values())]:
                    if not job.future.done():
                        job.future.set_exception(exc)
                self._streams.clear()

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
        by_sampling: dict[tuple[float, float, int | None, object], list[_Job]] = {}
        for job in jobs:
            if job.prompt is not None:  # a seeded request's jobs alone (call): what else waits changes nothing
                by_sampling.setdefault((*job.sampling, job.call), []).append(job)
        for (temperature, top_p, seed, _), batch in by_sampling.items():
            if self._submit(temperature, top_p, seed, batch):
                continue
            params = SamplingParams(
                max_new_tokens=[job.cap for job in batch],
                temperature=temperature,
                top_p=top_p,
                seed=self.seed * 1_000_003 + self.calls * 10_007 if seed is None else seed,
            )
            self.calls += 1
            self.batch_sizes.append(len(batch))
            began = time.monotonic()
            try:
                with stage(
                    "generate", episode=f"{len(batch)} agent calls"
                ):  # past its deadline: named, then the run stops
                    replies: list[Any] = list(self.backend.generate([job.prompt for job in batch], params))
                self._last_call_s = time.monotonic() - began
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

    def _submit(self, temperature: float, top_p: float, seed: int | None, batch: list[_Job]) -> bool:
        """Hand ``batch`` to the backend's stream for these settings (opened on first use); False when the
        backend generates whole calls only. Each request gets a seed of its own (its own, or the next of
        this batcher's)."""
        key = (temperature, top_p)
        if key not in self._streams:
            stream = self.backend.stream(SamplingParams(temperature=temperature, top_p=top_p))
            if stream is None:
                return False
            self._streams[key] = (stream, {})
        stream, tickets = self._streams[key]
        for job in batch:
            own = self.seed * 1_000_003 + self.calls * 10_007 if seed is None else seed
            self.calls += 1
            tickets[stream.submit(job.prompt or [], job.cap, own)] = job
        return True

    def _advance_streams(self) -> None:
        """Decode each open stream until some of its requests end, and answer those. A stream left with
        nothing to do is closed: the next request opens a new one, which sees the weights of then."""
        for key, (stream, tickets) in list(self._streams.items()):
            if tickets:
                with stage("generate", episode=f"{len(tickets)} agent calls decoding"):
                    done = stream.advance(steps=1)  # then requests that came meanwhile join
                self.batch_sizes.append(len(tickets))
                for ticket, reply in done:
                    tickets.pop(ticket).future.set_result(reply)
            if not tickets:
                stream.close()
                del self._streams[key]
