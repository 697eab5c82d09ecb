"""Continuous batching for the ``hf`` backend: a turn joins the decode batch between steps and leaves it when it ends.

Turn by turn, a rollout hands the backend every live episode's turn at once and waits for the
slowest reply before any env steps. A :class:`HFStream` takes each turn when its episode is ready
(:meth:`HFStream.submit`) and runs decode steps until some rows end (:meth:`HFStream.advance`); the
rollout steps those episodes' envs and submits their next turns, which are prefilled (from the KV
cache, as in :mod:`omrl.backends.hf_reuse`) and join the batch at the next step. No episode waits
for another's reply, only for the decode steps they share.

Each row draws from its own random stream, seeded per request, so its ids do not depend on which
rows shared its batch or when it joined. The turn-by-turn engine follows ``model.generate``'s one
stream for a whole batch instead: the two modes sample different ids from one seed, as two seeds
would, and each is reproducible on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch

from omrl.backends.base import Generation, SamplingParams
from omrl.backends.hf_reuse import ReuseEngine, wait_for, warpers
from omrl.backends.kv_cache import KV
from omrl.backends.kv_slots import SlotBatch

if TYPE_CHECKING:
    from omrl.backends.hf import HFBackend


@dataclass(eq=False)
class _Row:
    """One submitted turn: its prompt, token limit, own random stream, and what it sampled so far."""

    ticket: int
    prompt: torch.Tensor  # (length,) long, CPU
    limit: int
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reused: int = 0  # prompt tokens whose states came from the cache


def sample_rows(logits: torch.Tensor, rows: Sequence[_Row], params: SamplingParams) -> tuple[list[int], list[float]]:
    """Each row's next id and its log-prob from ``logits`` (len(rows), vocab) float32, each row drawing
    from its own generator (temperature and top-p applied as the turn-by-turn engine applies them)."""
    scores = logits
    for warp in warpers(params):
        scores = warp(None, scores)  # these warpers never read the ids so far
    if params.greedy:
        picked = scores.argmax(dim=-1)
    else:
        probs = torch.softmax(scores, dim=-1)
        picked = torch.cat(
            [torch.multinomial(probs[i], num_samples=1, generator=row.generator) for i, row in enumerate(rows)]
        )
    logprobs = torch.log_softmax(scores, dim=-1).gather(1, picked[:, None]).squeeze(1)
    return picked.tolist(), logprobs.tolist()


class HFStream:
    """Turns submitted one by one, decoded together (see the module docstring).

    At most ``max_rows`` rows decode at once (the backend's ``batch_size``); the rest wait their
    turn in submission order. Not thread-safe: the rollout drives it from one thread.
    """

    def __init__(self, backend: HFBackend, engine: ReuseEngine, params: SamplingParams, max_rows: int):
        self.backend = backend
        self.engine = engine
        self.params = params
        self.max_rows = max_rows
        self.tickets = 0
        self._waiting: list[_Row] = []  # submitted, not yet prefilled
        self._fresh: list[tuple[_Row, KV, torch.Tensor]] = []  # prefilled: states and first logits
        self._rows: list[_Row] = []  # in the decode batch, in its row order
        self._batch: SlotBatch | None = None  # built at the first row that decodes
        self._logits: torch.Tensor | None = None  # (len(_rows), vocab): each batch row's next-token logits
        engine.begin(backend.model)

    @property
    def pending(self) -> int:
        """Turns submitted and not yet returned by :meth:`advance`."""
        return len(self._waiting) + len(self._fresh) + len(self._rows)

    def submit(self, prompt: Sequence[int], max_new_tokens: int, seed: int | None) -> int:
        """Queue one turn; its ticket, which :meth:`advance` returns it under. ``seed`` seeds this row's
        own stream (None: torch's global one)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.backend.device).manual_seed(seed)
        self.tickets += 1
        self._waiting.append(
            _Row(self.tickets, torch.tensor(list(prompt), dtype=torch.long), max_new_tokens, generator)
        )
        return self.tickets

    def advance(self, steps: int = 0) -> list[tuple[int, Generation]]:
        """Decode until at least one row ends, or for at most ``steps`` steps (0: no limit); the ended rows'
        tickets and generations (empty when nothing is pending or none ended yet)."""
        started = time.perf_counter()
        model = self.backend.model
        was_training = model.training
        model.eval()
        done: list[tuple[int, Generation]] = []
        try:
            with torch.no_grad(), self.backend.autocast():
                taken = 0
                while not done and self.pending and (not steps or taken < steps):
                    self._admit()
                    done = self._step()
                    taken += 1
        finally:
            model.train(was_training)
        self.backend._count_call([gen for _, gen in done], time.perf_counter() - started)
        return done

    def close(self) -> None:
        """Drop every row still held (an unfinished rollout): their states are not cached."""
        self._waiting, self._fresh, self._rows = [], [], []
        self._batch = self._logits = None

    def pick(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """Each row's next id and its log-prob (a benchmark scripts replies through this seam)."""
        return sample_rows(logits, rows, self.params)

    def _admit(self) -> None:
        """Prefill waiting turns while the batch has room; they join it at the next step."""
        room = self.max_rows - len(self._rows) - len(self._fresh)
        if room <= 0 or not self._waiting:
            return
        taken, self._waiting = self._waiting[:room], self._waiting[room:]
        stats, device = self.backend.stats, self.backend.device
        started = time.perf_counter()
        reused: list[int] = []
        firsts = self.engine.prefill([row.prompt for row in taken], self.backend._forward, device, stats, reused)
        wait_for(device)
        stats["prefill_seconds"] += time.perf_counter() - started
        for row, (kv, logits), count in zip(taken, firsts, reused):
            row.reused = count
            self._fresh.append((row, kv, logits))

    def _step(self) -> list[tuple[int, Generation]]:
        """Sample one id for every row; store and return the rows that ended; feed the others one step."""
        rows = self._rows + [row for row, _, _ in self._fresh]
        parts = ([self._logits] if self._rows else []) + [logits[None] for _, _, logits in self._fresh]
        picked, logprobs = self.pick(torch.cat(parts), rows)
        stops = frozenset(self.backend.stop_token_ids)
        ended: list[int] = []
        for index, (row, token, logprob) in enumerate(zip(rows, picked, logprobs)):
            row.ids.append(token)
            row.logprobs.append(logprob)
            if token in stops or len(row.ids) >= row.limit:
                ended.append(index)
                # its prompt and every id but the last (the model never saw it) serve the next turn
                seen = torch.cat([row.prompt, torch.tensor(row.ids[:-1], dtype=torch.long)])
                self.engine.cache.put(seen, self._states(index))
        fresh = self._fresh
        for index in sorted((i for i in ended if i < len(self._rows)), reverse=True):
            self._batch.remove(index)  # type: ignore[union-attr]  # the last row takes its place
            self._rows[index] = self._rows[-1]
            self._rows.pop()
        self._fresh = []
        for index, (row, kv, _) in enumerate(fresh, start=len(rows) - len(fresh)):
            if index not in ended:
                if self._batch is None:
                    self._batch = SlotBatch(kv, self.max_rows, self.backend.device)
                self._batch.add(kv)
                self._rows.append(row)
        if self._rows:
            self._logits = self._batch.step(self.backend._forward, [row.ids[-1] for row in self._rows])  # type: ignore[union-attr]
        return [(rows[i].ticket, self._generation(rows[i])) for i in ended]

    def _states(self, index: int) -> KV:
        """Row ``index`` (batch rows first, then fresh ones) as states of batch 1."""
        if index < len(self._rows):
            return self._batch.row(index)  # type: ignore[union-attr]
        return self._fresh[index - len(self._rows)][1]

    def _generation(self, row: _Row) -> Generation:
        gen = self.backend._cut(row.ids, row.logprobs, row.limit)
        gen.prefill_reused = row.reused
        return gen
