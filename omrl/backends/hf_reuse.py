"""The ``hf`` backend's KV-reusing engine: a turn prefills only what its conversation added since the last one.

A multi-turn rollout sends each episode's whole conversation every turn. The
:class:`ReuseEngine` keeps, between calls, the keys and values each conversation
has already been run through (a :class:`~omrl.backends.kv_cache.PrefixCache`,
transformers' ``DynamicCache`` inside): a turn computes only the tokens after its
longest cached prefix (the observation since the last turn); identical prompts
(the samples of a task) are run once; a prefix two conversations began with (the
system prompt and worked example) is kept and shared until the weights change.
Each row then samples in a batch it leaves as soon as it ends, its states in preallocated
slots laid out as a left-padded stack (:class:`~omrl.backends.kv_slots.SlotBatch`: a
step writes one column instead of copying every row's states, as a growing
``DynamicCache`` does). Its
draws follow ``model.generate``'s random stream (:class:`Sampler`), so reuse on
and off sample the same ids from the same seed.

The engine holds only what reuse needs (the cache, the count of weight updates);
the model call and the sampler are the backend's, handed in per chunk, so that a
subclass or a test can wrap them (:meth:`~omrl.backends.hf.HFBackend._forward`, :meth:`~omrl.backends.hf.HFBackend._sampler`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from omrl.backends.base import SamplingParams
from omrl.backends.kv_cache import (
    KV,
    Entry,
    PrefixCache,
    common_prefix,
    crop,
    from_dynamic_cache,
    to_dynamic_cache,
)
from omrl.backends.kv_slots import SlotBatch

#: the model on ids (rows, new) at positions (rows, new) after a transformers cache (which it extends), with an
#: optional attention mask: (rows, vocab) float32 logits of each row's next token
Forward = Callable[..., torch.Tensor]


class RowSampler(Protocol):
    """Picks the next id of each live row: ``sampler(logits, live)`` with ``logits`` (len(live), vocab)
    float32 gives those rows' ids and log-probs."""

    def __call__(self, logits: torch.Tensor, live: list[int]) -> tuple[list[int], list[float]]: ...


@dataclass(frozen=True)
class BackendCalls:
    """What the backend hands the engine for a chunk: its model call, its sampler, the ids that end a row
    and the device the model runs on."""

    forward: Forward
    sampler: RowSampler
    stop_token_ids: frozenset[int]
    device: torch.device


def wait_for(device: torch.device) -> None:
    """Let a GPU finish what was queued, so a clock read after this times the work, not its queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warpers(params: SamplingParams) -> list[Any]:
    """Temperature and top-p, as transformers' own warpers (greedy: none); both engines warp with these."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    out: list[Any] = []
    if not params.greedy:
        if params.temperature != 1.0:
            out.append(TemperatureLogitsWarper(params.temperature))
        if params.top_p < 1.0:
            out.append(TopPLogitsWarper(params.top_p))
    return out


def reuse_supported(model: Any) -> bool:
    """True when every layer keeps plain full-attention states, the only kind the cache crops and stacks
    (not sliding-window or linear-attention layers, nor encoder-decoder models)."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            return False
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
    except (ImportError, TypeError, AttributeError):  # an older transformers: generate as before
        return False


class Sampler:
    """Picks the next id of each live row as ``model.generate`` would, from the same random stream.

    generate draws for every row of its batch every step, finished or not
    (``torch.multinomial`` on a (rows, vocab) tensor). Drawing for all ``rows`` of
    the chunk too keeps each row's draw independent of which rows have left, so
    the ids equal generate's for equal logits.
    """

    def __init__(self, params: SamplingParams, rows: int):
        self.greedy = params.greedy
        self.rows = rows
        self.warpers = warpers(params)

    def __call__(self, logits: torch.Tensor, live: list[int]) -> tuple[list[int], list[float]]:
        """``logits``: (len(live), vocab) float32 of the rows ``live``; their ids and log-probs."""
        scores = logits
        for warp in self.warpers:
            scores = warp(None, scores)  # these warpers never read the ids so far
        if self.greedy:
            picked = scores.argmax(dim=-1)
        else:
            probs = scores.new_full((self.rows, scores.shape[1]), 1.0 / scores.shape[1])
            probs[live] = torch.softmax(scores, dim=-1)
            picked = torch.multinomial(probs, num_samples=1).squeeze(1)[live]
        logprobs = torch.log_softmax(scores, dim=-1).gather(1, picked[:, None]).squeeze(1)
        return picked.tolist(), logprobs.tolist()


class ReuseEngine:
    """Generation that keeps each conversation's KV states between calls (see the module docstring).

    ``max_bytes`` bounds what :attr:`cache` holds between calls (0: no bound). Call
    :meth:`begin` once per generate call, then :meth:`generate_chunk` per chunk.
    """

    def __init__(self, max_bytes: int):
        self.cache = PrefixCache(max_bytes=max_bytes)
        self.weights_updates = 0  # weights_updated calls: part of the version cached states belong to

    def begin(self, model: Any) -> None:
        """A generate call starts: drop states of weights other than ``model``'s now; advance the cache's clock."""
        self.cache.check_version(self._weights_version(model))
        self.cache.tick()

    def weights_updated(self) -> None:
        """The backend loaded new weights (or was told they changed): no state of the old ones is served again."""
        self.weights_updates += 1
        self.cache.clear()

    def _weights_version(self, model: Any) -> tuple[float, ...]:
        """What tells the weights apart, so states of older weights are never reused: weights_updated calls,
        every parameter's in-place version counter (load_state_dict, most optimizer steps), and each
        parameter's sum, for in-place updates that bump no counter (fused AdamW). The sums read the
        weights once a call: about 0.05 s for SmolLM2 on one CPU thread."""
        params = list(model.parameters())
        with torch.no_grad():
            sums = torch.stack([p.sum(dtype=torch.float32) for p in params]).tolist()
        return (self.weights_updates, *(p._version for p in params), *sums)

    def generate_chunk(
        self,
        prompts: list[torch.Tensor],
        limits: list[int],
        seed: int | None,
        calls: BackendCalls,
        stats: dict[str, float],
    ) -> list[tuple[list[int], list[float], int]]:
        """Prefill what the cache lacks, then sample each row until it ends; store every row's states.

        ``prompts``: (length,) long CPU tensors. Returns each row's sampled ids and
        log-probs (the last id is the end-of-turn id or the row's limit was reached), and
        how many of its prompt's tokens came from the cache.
        ``stats`` gets the prefill's tokens computed and reused, and its seconds.
        """
        started = time.perf_counter()
        reused: list[int] = []
        with torch.no_grad():
            firsts = self.prefill(prompts, calls.forward, calls.device, stats, reused)
        wait_for(calls.device)
        stats["prefill_seconds"] += time.perf_counter() - started
        sampled = self._decode(prompts, firsts, limits, seed, calls)
        return [(ids, logprobs, cached) for (ids, logprobs), cached in zip(sampled, reused)]

    def prefill(
        self,
        prompts: list[torch.Tensor],
        forward: Forward,
        device: torch.device,
        stats: dict[str, float],
        reused_per_prompt: list[int],
    ) -> list[tuple[KV, torch.Tensor]]:
        """Each prompt's states (batch 1) and next-token logits ((vocab,) float32), from its longest cached prefix.

        A prompt may also continue an earlier prompt of this chunk (two tasks' shared
        opening); identical prompts are run once and share the result. ``reused_per_prompt``
        gets, per prompt, how many of its tokens were not computed for it.
        """
        done: dict[tuple[int, ...], tuple[KV, torch.Tensor]] = {}
        fresh: list[Entry] = []  # this chunk's prompts, as sources for the ones after them
        out = []
        for ids in prompts:
            key = tuple(ids.tolist())
            if key in done:
                stats["prefill_reused"] += len(ids)
                reused_per_prompt.append(len(ids))
                out.append(done[key])
                continue
            source, reused = self.cache.longest(ids, also=fresh)
            past = to_dynamic_cache(crop(source.kv, reused)) if source is not None else to_dynamic_cache([])
            positions = torch.arange(reused, len(ids), device=device)[None]
            logits = forward(ids[reused:].to(device)[None], positions, past)[0]
            if source is not None:
                self.after_match(source, ids, reused)
            done[key] = (from_dynamic_cache(past), logits)
            fresh.append(Entry(ids, done[key][0]))
            stats["prefill_computed"] += len(ids) - reused
            stats["prefill_reused"] += reused
            reused_per_prompt.append(reused)
            out.append(done[key])
        return out

    def after_match(self, source: Entry, ids: torch.Tensor, reused: int) -> None:
        """A prompt continued all of an episode's entry: that entry is superseded. It parted from another
        conversation: the part they share becomes a shared entry (an opening)."""
        if reused == len(source.ids) and not source.shared:
            self.cache.drop(source)
        elif common_prefix(source.ids, ids) < min(len(source.ids), len(ids)):
            self.cache.share(source, reused)

    def _decode(
        self,
        prompts: list[torch.Tensor],
        firsts: list[tuple[KV, torch.Tensor]],
        limits: list[int],
        seed: int | None,
        calls: BackendCalls,
    ) -> list[tuple[list[int], list[float]]]:
        """Sample every row until its end-of-turn id or its limit; a row leaves the batch the step it ends.

        ``firsts`` (each row's prefill states and logits) is emptied once the batch
        holds its own copy. Each ended row's states (its prompt and all its ids but
        the last, which the model never saw) go to the cache.
        """
        rows = len(prompts)
        ids: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        live = list(range(rows))
        logits = torch.stack([first[1] for first in firsts])  # (rows, vocab)
        batch: SlotBatch | None = None  # built after the first draw, from the rows still going
        forward, sampler, stop_token_ids, device = calls.forward, calls.sampler, calls.stop_token_ids, calls.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            while live:
                picked, picked_logprobs = sampler(logits, live)
                for row, token, logprob in zip(live, picked, picked_logprobs):
                    ids[row].append(token)
                    logprobs[row].append(logprob)
                ended = {r for r in live if ids[r][-1] in stop_token_ids or len(ids[r]) >= limits[r]}
                for index, row in enumerate(live):
                    if row in ended:
                        states = firsts[row][0] if batch is None else batch.row(index)
                        self.cache.put(torch.cat([prompts[row], torch.tensor(ids[row][:-1], dtype=torch.long)]), states)
                going = [index for index, row in enumerate(live) if row not in ended]
                live = [live[index] for index in going]
                if not live:
                    break
                if batch is None:  # states in preallocated slots: a step copies no row's states
                    batch = SlotBatch.stack([firsts[row][0] for row in live], device)
                    firsts.clear()  # the batch holds copies: free the prefill states now
                elif len(going) < batch.rows:
                    batch.keep(going)
                logits = batch.step(forward, [ids[row][-1] for row in live])
        return list(zip(ids, logprobs))
