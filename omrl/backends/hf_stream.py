"""Continuous batching for the ``hf`` backend: a turn joins the decode batch between steps and leaves it when it ends.

Turn by turn, a rollout hands the backend every live episode's turn at once and waits for the
slowest reply before any env steps. A :class:`HFStream` takes each turn when its episode is ready
(:meth:`HFStream.submit`) and runs decode steps until some rows end (:meth:`HFStream.advance`); the
rollout steps those episodes' envs and submits their next turns. A new turn joins the batch with the
states of its longest cached prefix (as in :mod:`omrl.backends.hf_reuse`), and the rest of its prompt
rides the next decode step, beside the other rows' one new token each (:mod:`omrl.backends.kv_ragged`):
no prompt costs a forward of its own, and no episode waits for another's reply, only for the steps
they share.

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
from omrl.backends.kv_cache import Entry, common_prefix, crop
from omrl.backends.kv_ragged import RaggedBatch

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
    feed: list[int] = field(default_factory=list)  # what the next step feeds it: its prompt's rest, then its last id


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
        self._waiting: list[_Row] = []  # submitted, not yet in the batch
        self._rows: list[_Row] = []  # in the batch, in its row order
        self._batch = RaggedBatch(backend.model, max_rows, backend.device)
        engine.begin(backend.model)

    @property
    def pending(self) -> int:
        """Turns submitted and not yet returned by :meth:`advance`."""
        return len(self._waiting) + len(self._rows)

    def submit(self, prompt: Sequence[int], max_new_tokens: int, seed: int | None) -> int:
        """Queue one turn; its ticket, which :meth:`advance` returns it under. ``seed`` seeds this row's
        own stream (None: torch's global one)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompt:
            raise ValueError("a prompt needs one or more ids, got none")
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
        self._waiting, self._rows = [], []
        self._batch = RaggedBatch(self.backend.model, self.max_rows, self.backend.device)

    def pick(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """Each row's next id and its log-prob (a benchmark scripts replies through this seam)."""
        return sample_rows(logits, rows, self.params)

    def _admit(self) -> None:
        """Waiting turns join the batch while it has room, each with the states of its longest cached prefix
        (stored, or a row's in the batch); the rest of its prompt is fed at the next step, beside the other
        rows' one new token each. A prompt that shares more with one joining at this step than with any
        states held waits one step, then continues that one's states instead of computing them again."""
        room = self.max_rows - len(self._rows)
        if room <= 0 or not self._waiting:
            return
        stats, cache = self.backend.stats, self.engine.cache
        held = [Entry(self._seen(row), self._batch.view(i)) for i, row in enumerate(self._rows)]
        joining: list[_Row] = []
        waiting: list[_Row] = []
        for row in self._waiting:
            if len(joining) == room:
                waiting.append(row)
                continue
            source, reused = cache.longest(row.prompt, also=held)
            # (at most all but its last id: an identical prompt still feeds that one, as it would from the store)
            if any(min(common_prefix(other.prompt, row.prompt), len(row.prompt) - 1) > reused for other in joining):
                waiting.append(row)
                continue
            if source is not None and all(source is not entry for entry in held):
                self.engine.after_match(source, row.prompt, reused)
            self._batch.add(crop(source.kv, reused) if source is not None else [])
            row.reused, row.feed = reused, row.prompt[reused:].tolist()
            stats["prefill_computed"] += len(row.feed)
            stats["prefill_reused"] += reused
            self._rows.append(row)
            joining.append(row)
        self._waiting = waiting

    def _step(self) -> list[tuple[int, Generation]]:
        """Feed every row (a joining row its prompt's rest, the others their last id) in one forward, sample
        one id each; store and return the rows that ended."""
        started = time.perf_counter()
        feeds = [row.feed for row in self._rows]
        logits = self._batch.step(self.backend._forward, feeds)
        wait_for(self.backend.device)
        prompts = sum(len(feed) for feed, row in zip(feeds, self._rows) if not row.ids)
        if prompts:  # the prompts' share of the step's tokens counts as their time (time before a first id)
            self.backend.stats["prefill_seconds"] += (time.perf_counter() - started) * prompts / sum(map(len, feeds))
        rows = list(self._rows)
        picked, logprobs = self.pick(logits, rows)
        stops = frozenset(self.backend.stop_token_ids)
        ended: list[int] = []
        for index, (row, token, logprob) in enumerate(zip(rows, picked, logprobs)):
            row.ids.append(token)
            row.logprobs.append(logprob)
            row.feed = [token]
            if token in stops or len(row.ids) >= row.limit:
                ended.append(index)
                # its prompt and every id but the last (the model never saw it) serve the next turn
                self.engine.cache.put(self._seen(row), self._batch.row(index))
        for index in reversed(ended):
            self._batch.remove(index)  # the last row takes its place
            self._rows[index] = self._rows[-1]
            self._rows.pop()
        return [(rows[i].ticket, self._generation(rows[i])) for i in ended]

    @staticmethod
    def _seen(row: _Row) -> torch.Tensor:
        """The ids a row's states hold: its prompt and every sampled id but the last (not fed yet)."""
        return torch.cat([row.prompt, torch.tensor(row.ids[:-1], dtype=torch.long)])

    def _generation(self, row: _Row) -> Generation:
        gen = self.backend._cut(row.ids, row.logprobs, row.limit)
        gen.prefill_reused = row.reused
        return gen
