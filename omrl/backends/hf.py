"""The ``hf`` backend: batched ``transformers`` generation on the CPU or a GPU, reusing KV states across turns.

Prompts are sorted by length and cut into chunks of ``batch_size``. Sampling is
seeded (a forked RNG, so the caller's random state is left alone) and the
log-prob of every sampled id is recorded under the distribution it was drawn
from (temperature and top-p applied) without keeping the scores of every step.

With ``kv_reuse`` (the default) the backend keeps, between calls, the keys and
values each conversation has already been run through (:mod:`omrl.backends.kv_cache`,
transformers' ``DynamicCache`` inside): a turn computes only the tokens after its
longest cached prefix (the observation since the last turn); identical prompts
(the samples of a task) are run once; a prefix two conversations began with (the
system prompt and worked example) is kept and shared until the weights change.
Each row then samples in a left-padded batch it leaves as soon as it ends. Its
draws follow ``model.generate``'s random stream, so reuse on and off sample the
same ids from the same seed. Without ``kv_reuse``, each chunk is one plain
``model.generate`` call (the whole prompt prefilled, the batch run to its longest
member).
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any, Mapping, Sequence

import torch

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.backends.kv_cache import (KV, Entry, PrefixCache, common_prefix, crop, from_dynamic_cache,
                                    kv_bytes_per_token, stack_left_padded, take_row, to_dynamic_cache)

MIB = 2**20


class _SampledLogprobs:
    """A logits processor, placed last, that records each sampled id's log-prob.

    It sees the final (warped) scores of step t and, at step t+1, the id that was
    drawn from them; so it keeps one step of log-probs instead of all of them.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []
        self.first_scores_at: float | None = None  # when the prompts' forward had ended (perf_counter)

    def _gather(self, ids: torch.Tensor) -> None:
        if self.previous is not None:
            self.picked.append(self.previous.gather(1, ids[:, -1:]).squeeze(1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.first_scores_at is None:
            _wait_for(scores.device)
            self.first_scores_at = time.perf_counter()
        self._gather(input_ids)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(batch, new_tokens) log-probs, once generate has returned ``sequences``."""
        self._gather(sequences)
        self.previous = None
        return torch.stack(self.picked, dim=1) if self.picked else sequences.new_zeros((len(sequences), 0), dtype=torch.float)


def _wait_for(device: torch.device) -> None:
    """Let a GPU finish what was queued, so a clock read after this times the work, not its queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warpers(params: SamplingParams) -> list[Any]:
    """Temperature and top-p, as transformers' own warpers (greedy: none)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    out: list[Any] = []
    if not params.greedy:
        if params.temperature != 1.0:
            out.append(TemperatureLogitsWarper(params.temperature))
        if params.top_p < 1.0:
            out.append(TopPLogitsWarper(params.top_p))
    return out


class _Sampler:
    """Picks the next id of each live row as ``model.generate`` would, from the same random stream.

    generate draws for every row of its batch every step, finished or not
    (``torch.multinomial`` on a (rows, vocab) tensor). Drawing for all ``rows`` of
    the chunk too keeps each row's draw independent of which rows have left, so
    the ids equal generate's for equal logits.
    """

    def __init__(self, params: SamplingParams, rows: int):
        self.greedy = params.greedy
        self.rows = rows
        self.warpers = _warpers(params)

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


class _DecodeBatch:
    """The rows still sampling: one left-padded DynamicCache, its attention mask and next positions."""

    def __init__(self, kvs: list[KV], device: torch.device):
        self.cache, self.pads = stack_left_padded(kvs)  # (rows, kv_heads, width, head_dim) per layer
        width = self.cache.get_seq_length()
        self.mask = torch.ones((len(kvs), width), dtype=torch.long, device=device)  # (rows, width + steps)
        for row, pad in enumerate(self.pads):
            self.mask[row, :pad] = 0
        self.positions = torch.tensor([width - pad for pad in self.pads], device=device)  # (rows,)

    def step(self, forward: Any, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row; (rows, vocab) float32 logits of the next."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=1)
        ids = torch.tensor(tokens, device=self.mask.device)[:, None]
        logits = forward(ids, self.positions[:, None], self.cache, self.mask)
        self.positions = self.positions + 1
        return logits

    def row(self, index: int) -> KV:
        """Row ``index``'s states without padding (a copy that outlives the batch)."""
        return take_row(self.cache, index, self.pads[index])

    def keep(self, indices: list[int]) -> None:
        """Drop every row not in ``indices``: a finished row costs nothing after this."""
        self.cache.batch_select_indices(torch.tensor(indices, device=self.mask.device))
        self.mask, self.positions = self.mask[indices], self.positions[indices]
        self.pads = [self.pads[i] for i in indices]


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


class HFBackend(Backend):
    """transformers generation in chunks of ``batch_size``; greedy when temperature == 0.

    ``kv_reuse`` keeps KV states across calls (see the module docstring);
    ``kv_cache_mb`` bounds what they hold between calls (0: no bound).
    """

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32, kv_reuse: bool = True,
                 kv_cache_mb: int = 1024):
        super().__init__(tokenizer, batch_size)
        self.model = model
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)
        self.weights_updates = 0  # update_weights calls: part of the version cached states belong to
        self.kv_cache: PrefixCache | None = None
        if model is not None and kv_reuse and not reuse_supported(self._owner):
            warnings.warn(f"{type(self._owner).__name__} keeps KV states the reuse cache cannot crop "
                          "(sliding-window, linear-attention or encoder-decoder layers, or an older transformers): "
                          "the hf backend prefills every turn in full", stacklevel=2)
        elif model is not None and kv_reuse:
            self.kv_cache = PrefixCache(max_bytes=kv_cache_mb * MIB)
            accepted = inspect.signature(self._owner.forward).parameters
            self._cache_arg = "cache" if "cache" in accepted else "past_key_values"  # renamed in transformers 5
            self._logits_to_keep = "logits_to_keep" in accepted

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def _owner(self) -> Any:
        """The transformers model (a peft model's base, its adapters in place), which holds the generation config."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 messages: Sequence[Sequence[Mapping[str, str]]] | None = None) -> list[Generation]:
        limits = params.limits(len(prompts))
        started = time.perf_counter()
        out: list[Generation | None] = [None] * len(prompts)
        # similar lengths share a chunk: less padding, and results stay in the caller's order
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        if self.kv_cache is not None:
            self.kv_cache.check_version(self._weights_version())
            self.kv_cache.tick()
        run = self._generate_chunk if self.kv_cache is None else self._generate_chunk_reusing
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk_no, start in enumerate(range(0, len(order), self.batch_size)):
                chunk = order[start:start + self.batch_size]
                seed = None if params.seed is None else params.seed + chunk_no
                gens = run([prompts[i] for i in chunk], [limits[i] for i in chunk], params, seed)
                for i, gen in zip(chunk, gens):
                    out[i] = gen
        finally:
            self.model.train(was_training)
        self._count_call([g for g in out if g is not None], time.perf_counter() - started)
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts: list[Sequence[int]], limits: list[int], params: SamplingParams,
                        seed: int | None) -> list[Generation]:
        """One ``model.generate`` call: the whole prompts prefilled, left-padded, run to the longest member."""
        from transformers import GenerationConfig, LogitsProcessorList

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids):] = torch.tensor(list(ids), dtype=torch.long)
                attention[row, width - len(ids):] = 1
        self.stats["prefill_computed"] += sum(len(p) for p in prompts)
        recorder = _SampledLogprobs()
        # our own warpers, placed before the recorder (generate would append its own after it)
        processors = [*_warpers(params), recorder]
        sampling = {} if params.greedy else {"top_k": 0}  # 0 turns off generate's default top-k of 50
        config = GenerationConfig(max_new_tokens=max(limits), do_sample=not params.greedy, use_cache=True,
                                  eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, **sampling)
        device = self.device
        # generate fills unset flags from the model's own generation_config (top_k, repetition
        # penalty...), which would change what is sampled and its log-probs: hide it for the call
        # (a peft-wrapped model generates through its base model, which holds the config)
        owner = self._owner
        saved = owner.generation_config
        owner.generation_config = GenerationConfig(eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id)
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                started = time.perf_counter()
                sequences = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                    logits_processor=LogitsProcessorList(processors),
                )
        finally:
            owner.generation_config = saved
        self.stats["prefill_seconds"] += (recorder.first_scores_at or time.perf_counter()) - started
        new_ids = sequences[:, width:]
        logprobs = recorder.finish(sequences).cpu().tolist()
        return [self._cut(ids, lp, limit) for ids, lp, limit in zip(new_ids.cpu().tolist(), logprobs, limits)]

    # -- with KV reuse --------------------------------------------------------------------------------
    def _generate_chunk_reusing(self, prompts: list[Sequence[int]], limits: list[int], params: SamplingParams,
                                seed: int | None) -> list[Generation]:
        """Prefill what the cache lacks, then sample each row until it ends; store every row's states."""
        ids = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
        started = time.perf_counter()
        with torch.no_grad():
            firsts = self._prefill(ids)
        _wait_for(self.device)
        self.stats["prefill_seconds"] += time.perf_counter() - started
        sampled = self._decode(ids, firsts, limits, params, seed)
        return [self._cut(toks, lps, limit) for (toks, lps), limit in zip(sampled, limits)]

    def _weights_version(self) -> tuple[float, ...]:
        """What tells the weights apart, so states of older weights are never reused: update_weights calls,
        every parameter's in-place version counter (load_state_dict, most optimizer steps), and each
        parameter's sum, for in-place updates that bump no counter (fused AdamW). The sums read the
        weights once a call: about 0.05 s for SmolLM2 on one CPU thread."""
        params = list(self.model.parameters())
        with torch.no_grad():
            sums = torch.stack([p.sum(dtype=torch.float32) for p in params]).tolist()
        return (self.weights_updates, *(p._version for p in params), *sums)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """The model on ``ids`` (rows, new) at ``positions`` (rows, new) after ``cache`` (which it extends);
        (rows, vocab) float32 logits of each row's next token."""
        kwargs: dict[str, Any] = {self._cache_arg: cache, "use_cache": True, "position_ids": positions}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1  # not (rows, new, vocab): a prompt's logits would dwarf its states
        return self._owner(input_ids=ids, **kwargs).logits[:, -1].float()

    def _prefill(self, prompts: list[torch.Tensor]) -> list[tuple[KV, torch.Tensor]]:
        """Each prompt's states (batch 1) and next-token logits ((vocab,) float32), from its longest cached prefix.

        A prompt may also continue an earlier prompt of this chunk (two tasks' shared
        opening); identical prompts are run once and share the result.
        """
        cache = self.kv_cache
        assert cache is not None
        device = self.device
        done: dict[tuple[int, ...], tuple[KV, torch.Tensor]] = {}
        fresh: list[Entry] = []  # this chunk's prompts, as sources for the ones after them
        out = []
        for ids in prompts:
            key = tuple(ids.tolist())
            if key in done:
                self.stats["prefill_reused"] += len(ids)
                out.append(done[key])
                continue
            source, reused = cache.longest(ids, also=fresh)
            past = to_dynamic_cache(crop(source.kv, reused)) if source is not None else to_dynamic_cache([])
            positions = torch.arange(reused, len(ids), device=device)[None]
            logits = self._forward(ids[reused:].to(device)[None], positions, past)[0]
            if source is not None:
                self._after_match(source, ids, reused)
            done[key] = (from_dynamic_cache(past), logits)
            fresh.append(Entry(ids, done[key][0]))
            self.stats["prefill_computed"] += len(ids) - reused
            self.stats["prefill_reused"] += reused
            out.append(done[key])
        return out

    def _after_match(self, source: Entry, ids: torch.Tensor, reused: int) -> None:
        """A prompt continued all of an episode's entry: that entry is superseded. It parted from another
        conversation: the part they share becomes a shared entry (an opening)."""
        cache = self.kv_cache
        assert cache is not None
        if reused == len(source.ids) and not source.shared:
            cache.drop(source)
        elif common_prefix(source.ids, ids) < min(len(source.ids), len(ids)):
            cache.share(source, reused)

    def _sampler(self, params: SamplingParams, prompts: list[torch.Tensor]) -> _Sampler:
        """What picks each row's next id in the KV-reusing decode loop: ``sampler(logits, live)`` gives
        the ids and log-probs of the live rows (a benchmark scripts replies through this loop here)."""
        return _Sampler(params, len(prompts))

    def _decode(self, prompts: list[torch.Tensor], firsts: list[tuple[KV, torch.Tensor]], limits: list[int],
                params: SamplingParams, seed: int | None) -> list[tuple[list[int], list[float]]]:
        """Sample every row until its end-of-turn id or its limit; a row leaves the batch the step it ends.

        ``firsts`` (each row's prefill states and logits) is emptied once the batch
        holds its own copy. Each ended row's states (its prompt and all its ids but
        the last, which the model never saw) go to the cache.
        """
        cache = self.kv_cache
        assert cache is not None
        rows, device = len(prompts), self.device
        sampler = self._sampler(params, prompts)
        ids: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        live = list(range(rows))
        logits = torch.stack([first[1] for first in firsts])  # (rows, vocab)
        batch: _DecodeBatch | None = None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            while live:
                picked, picked_logprobs = sampler(logits, live)
                for row, token, logprob in zip(live, picked, picked_logprobs):
                    ids[row].append(token)
                    logprobs[row].append(logprob)
                ended = {r for r in live if ids[r][-1] == self.eos_token_id or len(ids[r]) >= limits[r]}
                for index, row in enumerate(live):
                    if row in ended:
                        states = firsts[row][0] if batch is None else batch.row(index)
                        cache.put(torch.cat([prompts[row], torch.tensor(ids[row][:-1], dtype=torch.long)]), states)
                going = [index for index, row in enumerate(live) if row not in ended]
                live = [live[index] for index in going]
                if not live:
                    break
                if batch is None:
                    batch = _DecodeBatch([firsts[row][0] for row in live], device)
                    firsts.clear()  # the batch holds copies: free the prefill states now
                elif len(going) < len(batch.pads):
                    batch.keep(going)
                logits = batch.step(self._forward, [ids[row][-1] for row in live])
        return list(zip(ids, logprobs))

    # -- weights and memory ---------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy the trainer's weights in (no copy when the trainer trains this very model); cached states
        of the old weights are dropped either way."""
        self.weights_updates += 1
        if self.kv_cache is not None:
            self.kv_cache.clear()
        own = self.model.state_dict()
        if all(k in own and own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items()):
            return
        self.model.load_state_dict(dict(state_dict))

    def warm_tokens(self) -> int | None:
        """Tokens whose KV states fit in ``kv_cache_mb`` (None without reuse or without a bound)."""
        if self.kv_cache is None or not self.kv_cache.max_bytes:
            return None
        dtype = next(self.model.parameters()).dtype
        return self.kv_cache.max_bytes // kv_bytes_per_token(self._owner.config, dtype.itemsize)

    def release(self, conversations: Sequence[Sequence[int]] | None = None) -> None:
        """Free the cached states of ended conversations (all of them when None); shared openings stay."""
        if self.kv_cache is not None:
            self.kv_cache.release(None if conversations is None else
                                  [torch.tensor(list(c), dtype=torch.long) for c in conversations])

    def close(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.clear()
