"""The ``hf`` backend: batched ``transformers`` generation on the CPU or a GPU, reusing KV states across turns.

Prompts are sorted by length and cut into chunks of ``batch_size``. Sampling is
seeded (a forked RNG, so the caller's random state is left alone) and the
log-prob of every sampled id is recorded under the distribution it was drawn
from (temperature and top-p applied) without keeping the scores of every step.

Two engines, picked at construction:

- with ``kv_reuse`` (the default), a :class:`~omrl.backends.hf_reuse.ReuseEngine`
  keeps each conversation's KV states between calls, so a turn prefills only what
  was added since the last one, and each row leaves its batch as soon as it ends.
  It samples the same ids as the plain engine from the same seed;
- without it (or for a model whose states the cache cannot crop), each chunk is one
  plain ``model.generate`` call (the whole prompt prefilled, the batch run to its
  longest member). This engine keeps nothing between calls, so it lives here.

With ``batching="continuous"`` a rollout plays through :meth:`HFBackend.stream` instead
(:mod:`omrl.backends.hf_stream`): turns join the reuse engine's decode batch as their episodes are
ready, each row drawing from its own seeded stream.

What both share stays on :class:`HFBackend`: the model, the tokenizer's ids, the
chunking and seeding, weight updates, and the two seams the reuse engine calls
through (:meth:`HFBackend._forward`, :meth:`HFBackend._sampler`).

With ``bf16`` every call runs under bfloat16 autocast (:meth:`HFBackend.autocast`): matrix products and
attention in bfloat16, logits handed to sampling in float32; the weights stay as they are.
One autocast region spans a whole call, so each weight is cast once a call, not once a decode step.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from functools import cached_property
from typing import Any, Mapping, Sequence

import torch

from omrl.backends.base import Backend, Chats, Generation, Prompts, SamplingParams
from omrl.backends.hf_reuse import BackendCalls, ReuseEngine, RowSampler, Sampler, reuse_supported, wait_for, warpers
from omrl.backends.hf_stream import HFStream
from omrl.backends.kv_cache import PrefixCache, kv_bytes_per_token
from omrl.config.sections import BATCHING
from omrl.errors import OmrlError

MIB = 2**20
#: generation.batching: how a rollout's turns are batched


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
            wait_for(scores.device)
            self.first_scores_at = time.perf_counter()
        self._gather(input_ids)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(batch, new_tokens) log-probs, once generate has returned ``sequences``."""
        self._gather(sequences)
        self.previous = None
        return (
            torch.stack(self.picked, dim=1)
            if self.picked
            else sequences.new_zeros((len(sequences), 0), dtype=torch.float)
        )


class HFBackend(Backend):
    """transformers generation in chunks of ``batch_size``; greedy when temperature == 0.

    ``kv_reuse`` keeps KV states across calls (:attr:`reuse`, see the module docstring);
    ``kv_cache_mb`` bounds what they hold between calls (0: no bound). ``batching``: ``turns`` (a
    rollout's turns in one call each turn) or ``continuous`` (:meth:`stream`; needs ``kv_reuse``).
    ``bf16``: generate under bfloat16 autocast (:meth:`autocast`).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 32,
        kv_reuse: bool = True,
        kv_cache_mb: int = 1024,
        batching: str = "turns",
        bf16: bool = False,
    ):
        super().__init__(tokenizer, batch_size)
        self.bf16 = bf16
        if batching not in BATCHING:
            raise OmrlError(f"unknown generation.batching {batching!r}; valid: {', '.join(BATCHING)}")
        self.batching = batching
        self.model = model
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)
        #: the KV-reusing engine; None: every chunk is one plain ``model.generate`` call
        self.reuse: ReuseEngine | None = None
        if model is not None and kv_reuse:
            if reuse_supported(self._owner):
                self.reuse = ReuseEngine(max_bytes=kv_cache_mb * MIB)
            else:
                warnings.warn(
                    f"{type(self._owner).__name__} keeps KV states the reuse cache cannot crop "
                    "(sliding-window, linear-attention or encoder-decoder layers, or an older "
                    "transformers): the hf backend prefills every turn in full",
                    stacklevel=2,
                )
        if batching == "continuous" and self.reuse is None and model is not None:
            raise OmrlError(
                "generation.batching=continuous needs the KV-reusing engine (generation.kv_reuse=true, and a "
                f"model whose states it can crop; {type(self._owner).__name__} with kv_reuse={kv_reuse}): "
                "set generation.batching=turns"
            )

    @property
    def kv_cache(self) -> PrefixCache | None:
        """The states kept between calls (the reuse engine's cache); None without reuse."""
        return None if self.reuse is None else self.reuse.cache

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def autocast(self) -> torch.autocast:
        """The precision generation runs in: bfloat16 autocast with ``bf16``, else the weights' own
        (a disabled region)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @property
    def _owner(self) -> Any:
        """The transformers model (a peft model's base, its adapters in place), which holds the generation config."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def generate(self, prompts: Prompts, params: SamplingParams, messages: Chats | None = None) -> list[Generation]:
        limits = params.limits(len(prompts))
        started = time.perf_counter()
        out: list[Generation | None] = [None] * len(prompts)
        # similar lengths share a chunk: less padding, and results stay in the caller's order
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        if self.reuse is not None:
            self.reuse.begin(self.model)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.autocast():
                for chunk_no, start in enumerate(range(0, len(order), self.batch_size)):
                    chunk = order[start : start + self.batch_size]
                    seed = None if params.seed is None else params.seed + chunk_no
                    chunk_prompts, chunk_limits = [prompts[i] for i in chunk], [limits[i] for i in chunk]
                    if self.reuse is None:
                        gens = self._generate_chunk(chunk_prompts, chunk_limits, params, seed)
                    else:
                        gens = self._generate_chunk_reusing(self.reuse, chunk_prompts, chunk_limits, params, seed)
                    for i, gen in zip(chunk, gens):
                        out[i] = gen
        finally:
            self.model.train(was_training)
        self._count_call([g for g in out if g is not None], time.perf_counter() - started)
        return out  # type: ignore[return-value]

    def stream(self, params: SamplingParams) -> HFStream | None:
        """With ``batching="continuous"``, a stream of turns decoded together as they come (each row seeded
        on its own, :mod:`omrl.backends.hf_stream`); None otherwise."""
        if self.batching != "continuous" or self.reuse is None:
            return None
        return HFStream(self, self.reuse, params, max_rows=self.batch_size)

    # -- without reuse: one model.generate call a chunk -------------------------------------------------
    def _generate_chunk(
        self, prompts: list[Sequence[int]], limits: list[int], params: SamplingParams, seed: int | None
    ) -> list[Generation]:
        """One ``model.generate`` call: the whole prompts prefilled, left-padded, run to the longest member."""
        from transformers import GenerationConfig, LogitsProcessorList

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
                attention[row, width - len(ids) :] = 1
        self.stats["prefill_computed"] += sum(len(p) for p in prompts)
        recorder = _SampledLogprobs()
        # our own warpers, placed before the recorder (generate would append its own after it)
        processors = [*warpers(params), recorder]
        sampling = {} if params.greedy else {"top_k": 0}  # 0 turns off generate's default top-k of 50
        config = GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=not params.greedy,
            use_cache=True,
            eos_token_id=list(self.stop_token_ids),
            pad_token_id=self.pad_token_id,
            **sampling,
        )
        device = self.device
        # generate fills unset flags from the model's own generation_config (top_k, repetition
        # penalty...), which would change what is sampled and its log-probs: hide it for the call
        # (a peft-wrapped model generates through its base model, which holds the config)
        owner = self._owner
        saved = owner.generation_config
        owner.generation_config = GenerationConfig(
            eos_token_id=list(self.stop_token_ids), pad_token_id=self.pad_token_id
        )
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                started = time.perf_counter()
                sequences = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                    logits_processor=LogitsProcessorList(processors),
                )
        finally:
            owner.generation_config = saved
        self.stats["prefill_seconds"] += (recorder.first_scores_at or time.perf_counter()) - started
        new_ids = sequences[:, width:]
        logprobs = recorder.finish(sequences).cpu().tolist()
        # every prompt is computed whole: none of it comes from a cache
        return [
            dataclasses.replace(self._cut(ids, lp, limit), prefill_reused=0)
            for ids, lp, limit in zip(new_ids.cpu().tolist(), logprobs, limits)
        ]

    # -- with KV reuse: the engine runs the chunk, through this backend's model call and sampler ----------
    def _generate_chunk_reusing(
        self,
        engine: ReuseEngine,
        prompts: list[Sequence[int]],
        limits: list[int],
        params: SamplingParams,
        seed: int | None,
    ) -> list[Generation]:
        ids = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
        calls = BackendCalls(self._forward, self._sampler(params, ids), frozenset(self.stop_token_ids), self.device)
        sampled = engine.generate_chunk(ids, limits, seed, calls, self.stats)
        return [
            dataclasses.replace(self._cut(toks, lps, limit), prefill_reused=reused)
            for (toks, lps, reused), limit in zip(sampled, limits)
        ]

    @cached_property
    def _forward_arguments(self) -> tuple[str, bool]:
        """How this transformers' forward takes a cache (``cache`` since transformers 5, ``past_key_values``
        before) and whether it can return the last position's logits only; read once, on first use."""
        accepted = inspect.signature(self._owner.forward).parameters
        return ("cache" if "cache" in accepted else "past_key_values"), "logits_to_keep" in accepted

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model on ``ids`` (rows, new) at ``positions`` (rows, new) after ``cache`` (which it extends);
        (rows, vocab) float32 logits of each row's next token, or with ``keep`` (a ragged step's one flat row)
        the logits at those positions. The reuse engine's only model call, kept on the backend (as
        :meth:`_sampler` is) so that a subclass or a test can wrap it."""
        cache_arg, logits_to_keep = self._forward_arguments
        kwargs: dict[str, Any] = {cache_arg: cache, "use_cache": True, "position_ids": positions}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if logits_to_keep:  # not (rows, new, vocab): a prompt's logits would dwarf its states
            kwargs["logits_to_keep"] = 1 if keep is None else keep
        logits = self._owner(input_ids=ids, **kwargs).logits
        if keep is None:
            return logits[:, -1].float()
        return (logits[0] if logits_to_keep else logits[0, keep]).float()

    def _sampler(self, params: SamplingParams, prompts: list[torch.Tensor]) -> RowSampler:
        """What picks each row's next id in the KV-reusing decode loop: ``sampler(logits, live)`` gives
        the ids and log-probs of the live rows (a benchmark scripts replies through this loop here)."""
        return Sampler(params, len(prompts))

    # -- weights and memory ---------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy the trainer's weights in (no copy when the trainer trains this very model); cached states
        of the old weights are dropped either way."""
        if self.reuse is not None:
            self.reuse.weights_updated()
        own = self.model.state_dict()
        if all(k in own and own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items()):
            return
        self.model.load_state_dict(dict(state_dict))

    def warm_tokens(self) -> int | None:
        """Tokens whose KV states fit in ``kv_cache_mb`` (None without reuse or without a bound)."""
        if self.reuse is None or not self.reuse.cache.max_bytes:
            return None
        dtype = next(self.model.parameters()).dtype
        return self.reuse.cache.max_bytes // kv_bytes_per_token(self._owner.config, dtype.itemsize)

    def release(self, conversations: Prompts | None = None) -> None:
        """Free the cached states of ended conversations (all of them when None); shared openings stay."""
        if self.reuse is not None:
            self.reuse.cache.release(
                None if conversations is None else [torch.tensor(list(c), dtype=torch.long) for c in conversations]
            )

    def close(self) -> None:
        if self.reuse is not None:
            self.reuse.cache.clear()
