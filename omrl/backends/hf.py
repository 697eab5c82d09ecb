"""The ``hf`` backend: batched ``transformers`` generate on the CPU or a GPU.

Prompts are left-padded into chunks of ``batch_size``; the KV cache lives for
one call. Sampling is seeded (a forked RNG, so the caller's random state is left
alone) and the log-prob of every sampled id is recorded under the distribution
it was drawn from (temperature and top-p applied) without keeping the scores of
every step in memory.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from omrl.backends.base import Backend, Generation, SamplingParams


class _SampledLogprobs:
    """A logits processor, placed last, that records each sampled id's log-prob.

    It sees the final (warped) scores of step t and, at step t+1, the id that was
    drawn from them; so it keeps one step of log-probs instead of all of them.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def _gather(self, ids: torch.Tensor) -> None:
        if self.previous is not None:
            self.picked.append(self.previous.gather(1, ids[:, -1:]).squeeze(1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._gather(input_ids)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(batch, new_tokens) log-probs, once generate has returned ``sequences``."""
        self._gather(sequences)
        self.previous = None
        return torch.stack(self.picked, dim=1) if self.picked else sequences.new_zeros((len(sequences), 0), dtype=torch.float)


class HFBackend(Backend):
    """transformers generate, batched with left padding; greedy when temperature == 0."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32):
        super().__init__(tokenizer, batch_size)
        self.model = model
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 messages: Sequence[Sequence[Mapping[str, str]]] | None = None) -> list[Generation]:
        limits = params.limits(len(prompts))
        out: list[Generation | None] = [None] * len(prompts)
        # similar lengths share a chunk: less padding, and results stay in the caller's order
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk_no, start in enumerate(range(0, len(order), self.batch_size)):
                chunk = order[start:start + self.batch_size]
                seed = None if params.seed is None else params.seed + chunk_no
                gens = self._generate_chunk([prompts[i] for i in chunk], [limits[i] for i in chunk], params, seed)
                for i, gen in zip(chunk, gens):
                    out[i] = gen
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts: list[Sequence[int]], limits: list[int], params: SamplingParams,
                        seed: int | None) -> list[Generation]:
        from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids):] = torch.tensor(list(ids), dtype=torch.long)
                attention[row, width - len(ids):] = 1
        recorder = _SampledLogprobs()
        processors = []
        if not params.greedy:
            # our own warpers, placed before the recorder (generate would append its own after it)
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        processors.append(recorder)
        sampling = {} if params.greedy else {"top_k": 0}  # 0 turns off generate's default top-k of 50
        config = GenerationConfig(max_new_tokens=max(limits), do_sample=not params.greedy, use_cache=True,
                                  eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, **sampling)
        device = self.device
        # generate fills unset flags from the model's own generation_config (top_k, repetition
        # penalty...), which would change what is sampled and its log-probs: hide it for the call
        # (a peft-wrapped model generates through its base model, which holds the config)
        owner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        saved = owner.generation_config
        owner.generation_config = GenerationConfig(eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id)
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                sequences = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                    logits_processor=LogitsProcessorList(processors),
                )
        finally:
            owner.generation_config = saved
        new_ids = sequences[:, width:]
        logprobs = recorder.finish(sequences).cpu().tolist()
        return [self._cut(ids, lp, limit) for ids, lp, limit in zip(new_ids.cpu().tolist(), logprobs, limits)]

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy the trainer's weights in (a no-op when the trainer trains this very model)."""
        own = self.model.state_dict()
        if all(k in own and own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items()):
            return
        self.model.load_state_dict(dict(state_dict))
