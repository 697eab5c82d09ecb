"""A gateway over a backend that keeps what it was given and what it sampled, so rows can be checked."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from omrl.backends.base import Backend
from omrl.gateway.server import Gateway
from omrl.rollout.spec import RolloutLimits


class Recording(Backend):
    """Wraps a backend and keeps every (prompt, generation) pair it served."""

    name = "recording"

    def __init__(self, inner: Backend):
        super().__init__(inner.tokenizer, inner.batch_size)
        self.inner = inner
        self.served: list[tuple[list[int], Any]] = []
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def generate(self, prompts, params, messages=None):
        out = self.inner.generate(prompts, params, messages)
        with self.lock:
            self.calls.append(len(prompts))
            self.served += [(list(p), g) for p, g in zip(prompts, out)]
        return out

    def release(self, conversations=None):
        self.inner.release(conversations)


def assert_token_exact(episode: Any, backend: Recording) -> None:
    """Every turn's ids are what the backend sampled (all of it, or its start where a stop string cut
    it), after exactly the ids it was given; the loss mask is 1 on those sampled ids and nowhere else."""
    starts = [0, *episode.row_starts]
    sampled = set()
    for turn in episode.turns:
        start, end = turn.span
        row = max(s for s in starts if s <= start)
        prompt, ids = episode.token_ids[row:start], episode.token_ids[start:end]
        match = [g for p, g in backend.served if p == prompt and g.token_ids[: len(ids)] == ids]
        assert match, f"turn at {turn.span}: no generate call was given this row's ids and sampled these"
        assert episode.logprobs[start:end] == pytest.approx(match[0].logprobs[: len(ids)])
        sampled.update(range(start, end))
    assert [i for i, m in enumerate(episode.loss_mask) if m] == sorted(sampled)


def make_gateway(tokenizer: Any, inner: Backend, **kw: Any) -> tuple[Gateway, Recording]:
    backend = Recording(inner)
    limits = kw.pop("limits", None) or RolloutLimits(max_new_tokens=96, max_context=1024)
    return Gateway(tokenizer, backend, limits, **kw), backend
