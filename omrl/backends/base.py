"""The generation-backend interface: token ids in, sampled token ids (and their log-probs) out.

Every backend takes prompts as token ids and returns exactly the ids it sampled,
so the rollout never decodes and re-encodes a model turn. A backend generates
one turn: it stops at the tokenizer's end-of-turn token (``eos_token``) or at
the per-prompt token limit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from omrl.chat.replies import stop_token_ids
from omrl.errors import OmrlError, short_repr

FINISH_REASONS = ("stop", "length")

#: token-id prompts, one a conversation
Prompts = Sequence[Sequence[int]]
#: the same conversations as chat messages (role and content)
Chats = Sequence[Sequence[Mapping[str, str]]]

#: what :attr:`Backend.stats` counts (a backend that cannot tell leaves a count at 0)
STATS = {
    "prefill_computed": "prompt tokens run through the model",
    "prefill_reused": "prompt tokens whose KV states came from a cache instead",
    "decode_tokens": "tokens sampled",
    "generate_seconds": "seconds spent in generate",
    "prefill_seconds": "of those, seconds before the first token was sampled (running the prompts)",
}


def checked_logprobs(values: Any, count: int, source: str, error: type[OmrlError] = OmrlError) -> list[float]:
    """The ``count`` sampled tokens' log-probs, as ``source`` (the field they came from) gave them, as
    floats; ``error`` when they are missing, short or not finite numbers. A trajectory keeps them
    for training, where a made-up 0.0 would weigh the token's importance ratio by its probability
    (about one over the vocabulary) and a NaN would make the loss NaN."""
    if not isinstance(values, list) or len(values) != count:
        raise error(
            f"{source} is {short_repr(values)}, not a list of the {count} sampled tokens' log-probs; "
            "its turn cannot be trained on"
        )
    out = []
    for i, value in enumerate(values):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise error(
                f"{source}: the log-prob of token {i} is {short_repr(value)}, not a finite number; "
                "its turn cannot be trained on"
            )
        out.append(float(value))
    return out


def generation_metrics(stats: dict[str, float]) -> dict[str, float]:
    """What a step or an eval logs from a backend's :data:`STATS`: tokens generated (a search's shared
    turns once), prompt tokens computed and reused, the share reused (the KV cache's hit rate) and
    decoding speed (tokens sampled a second of decoding, prompt processing left out; the whole call's
    time where the backend cannot tell the two apart)."""
    prefill = stats.get("prefill_computed", 0) + stats.get("prefill_reused", 0)
    out = {
        "generated_tokens": float(stats.get("decode_tokens", 0)),
        "prefill_tokens": float(stats.get("prefill_computed", 0)),
        "prefill_reused": float(stats.get("prefill_reused", 0)),
    }
    if prefill:
        out["prefill_hit_rate"] = stats.get("prefill_reused", 0) / prefill
    decode_seconds = stats.get("generate_seconds", 0) - stats.get("prefill_seconds", 0)
    if decode_seconds > 0:
        out["decode_tokens_per_s"] = stats.get("decode_tokens", 0) / decode_seconds
    if stats.get("prefill_seconds"):  # of the generate calls' time (time/generate), prompts alone
        out["prefill_time"] = float(stats["prefill_seconds"])
    if stats.get("prefill_seconds") and stats.get("prefill_computed"):
        out["prefill_tokens_per_s"] = stats["prefill_computed"] / stats["prefill_seconds"]
    return out


@dataclass
class SamplingParams:
    """How to sample one turn for every prompt of a call.

    ``max_new_tokens`` is one cap for all prompts or one per prompt (the rollout
    lowers it per episode to what the context still allows).
    """

    max_new_tokens: int | Sequence[int] = 96
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None  # same seed + same prompts -> same samples

    def limit(self, index: int) -> int:
        """The token limit of prompt ``index``."""
        if isinstance(self.max_new_tokens, int):
            return self.max_new_tokens
        return int(self.max_new_tokens[index])

    def limits(self, count: int) -> list[int]:
        """The token limits of ``count`` prompts; a per-prompt list must have that length."""
        if not isinstance(self.max_new_tokens, int) and len(self.max_new_tokens) != count:
            raise OmrlError(f"max_new_tokens lists {len(self.max_new_tokens)} limits for {count} prompts")
        out = [self.limit(i) for i in range(count)]
        if any(n < 1 for n in out):
            raise OmrlError(f"max_new_tokens must be >= 1 for every prompt, got {min(out)}")
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Generation:
    """One sampled turn.

    ``token_ids`` are the sampled ids, ending with the end-of-turn token when
    ``finish_reason == "stop"``; ``logprobs`` holds one log-probability per id
    under the sampling distribution (temperature and top-p applied; the model's
    own distribution when greedy). ``token_exact`` is False when the backend
    could only return text that was tokenized locally (the ids may then differ
    from what the model sampled, and training must not use the turn). ``prefill_reused``: how many
    of the prompt's tokens the engine took from its cache instead of computing them (None: the
    backend cannot tell); the rollout records it per turn, so prefill figures add up per env.
    ``weights_version``: the trainer's weight version that sampled it, where the sampler changes
    versions between turns (partial rollouts); the rollout records it in ``Turn.info``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    token_exact: bool = True
    prefill_reused: int | None = None
    weights_version: int | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise OmrlError(f"a generation has {len(self.token_ids)} ids but {len(self.logprobs)} log-probs")
        if self.finish_reason not in FINISH_REASONS:
            raise OmrlError(f"unknown finish reason {self.finish_reason!r}; valid: {', '.join(FINISH_REASONS)}")


class Stream(Protocol):
    """Turns generated as they come (continuous batching): each joins the running batch between
    decode steps and leaves it when it ends, so no turn waits for a slower one to finish."""

    def submit(self, prompt: Sequence[int], max_new_tokens: int, seed: int | None) -> int:
        """Queue one turn (``seed`` seeds its own random stream); its ticket."""
        ...

    def advance(self, steps: int = 0) -> list[tuple[int, "Generation"]]:
        """Generate until at least one queued turn ends, or for at most ``steps`` decode steps (0: no
        limit, for a caller whose next requests wait on these replies); those turns' tickets and
        generations."""
        ...

    def close(self) -> None:
        """Drop what is still queued."""
        ...


class Backend(ABC):
    """Generates one model turn for a batch of token-id prompts."""

    #: the name `make_backend` knows this backend by
    name: ClassVar[str] = ""

    def __init__(self, tokenizer: Any, batch_size: int = 32):
        if batch_size < 1:
            raise OmrlError(f"generation.batch_size must be >= 1, got {batch_size}")
        if tokenizer.eos_token_id is None:
            raise OmrlError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no eos_token; "
                "the rollout needs the end-of-turn token to stop a turn"
            )
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_token_id = int(tokenizer.eos_token_id)
        # every token a reply ends at, eos first: the chat template's own (gpt-oss's <|call|>, Gemma's <end_of_turn>)
        self.stop_token_ids = list(stop_token_ids(tokenizer)) if getattr(tokenizer, "chat_template", None) else []
        self.stop_token_ids = self.stop_token_ids or [self.eos_token_id]
        self.stats: dict[str, float] = dict.fromkeys(STATS, 0)  # summed over calls; see take_stats

    @abstractmethod
    def generate(self, prompts: Prompts, params: SamplingParams, messages: Chats | None = None) -> list[Generation]:
        """One turn for each prompt, in order, chunked by ``batch_size`` internally.

        ``messages`` (the same chats as text) is only used by backends that can
        fall back to a chat API when the server does not take token ids.
        """

    def stream(self, params: SamplingParams) -> Stream | None:
        """Turns sampled with ``params`` (temperature, top-p), generated as they come, or None when this
        backend generates whole calls only (then :meth:`generate` serves a rollout turn by turn)."""
        return None

    #: one engine that every training process samples from (a server): only the main process sends it weights
    shared: bool = False
    #: an engine that knows no LoRA adapters: a LoRA model's weights reach it merged, under the base's names
    merges_lora: bool = False

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load the trainer's weights (a state dict) into the generation engine in place."""
        raise OmrlError(f"the {self.name} backend cannot load new weights; use the hf or vllm backend for training")

    def warm_tokens(self) -> int | None:
        """How many tokens of conversation this backend keeps ready between calls (their KV states):
        a caller that keeps more live at once makes it prefill them again. None: no bound known."""
        return None

    def release(self, conversations: Prompts | None = None) -> None:
        """Forget what is cached for these conversations (token ids; every one when None): they ended.

        A no-op for backends that keep nothing between calls.
        """

    def take_stats(self) -> dict[str, float]:
        """The :data:`STATS` counts since the last call, then zeroed (a recipe logs them per step)."""
        out = dict(self.stats)
        self.stats = dict.fromkeys(STATS, 0)
        return out

    def close(self) -> None:
        """Free what the backend holds (engines, connections)."""

    def _count_call(
        self, generations: Sequence[Generation], seconds: float, computed: int = 0, reused: int = 0
    ) -> None:
        """Add one generate call to :attr:`stats`: its sampled tokens and seconds, and the prompt tokens
        the engine computed and took from its cache (when it tells; 0 otherwise)."""
        self.stats["decode_tokens"] += sum(len(g.token_ids) for g in generations)
        self.stats["generate_seconds"] += seconds
        self.stats["prefill_computed"] += computed
        self.stats["prefill_reused"] += reused

    def _cut(self, ids: Sequence[int], logprobs: Sequence[float], limit: int) -> Generation:
        """Stop at the first stop token (kept: :attr:`stop_token_ids`) or at ``limit`` ids."""
        ids, logprobs = list(ids), list(logprobs)
        stops = set(self.stop_token_ids)
        end = next((k + 1 for k, token in enumerate(ids[:limit]) if token in stops), None)
        if end is not None:
            return Generation(ids[:end], [float(x) for x in logprobs[:end]], "stop")
        return Generation(ids[:limit], [float(x) for x in logprobs[:limit]], "length")
