"""Rows that open with the same prompt run that prompt once in the update.

The samples of a GRPO group share their whole first prompt, and every WebShop episode opens
with the same system prompt and worked example: in the default job more than half of the
update's tokens are such repeats. Here a shared prefix runs forward once (its keys and values
captured), each row then runs only its own suffix on top of those keys and values, and the
prefix runs backward once with the gradients all suffixes sent into its keys and values. The
loss and the gradients are those of running every row whole (to float rounding; tests compare).

Only prompt tokens are shared: a prefix ends before the first trained token of any of its rows,
and one token early, so that each suffix starts with the token that predicts its first new one.

Where the attention takes a 4-D mask, a micro-batch's suffixes run packed into one sequence (each
sees the prefix and itself, :class:`PackedSuffixes`): one pass a micro-batch, not one a row. A row
alone paid for a vocabulary-sized gradient of the LM head and of a tied input embedding (two fresh
113 MB blocks for SmolLM2) and for small matrix products; packed, those come once a micro-batch.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator, Sequence

import torch
from torch import nn

from omrl.clock import timed
from omrl.data.batch import Batch

# Below this many shared tokens a separate prefix pass costs more than it saves.
MIN_SHARED_TOKENS = 32
# Attention that takes a 4-D mask as given: packed rows (a split episode) can run on a prefix only there.
PACKED_MASK_ATTENTION = ("sdpa", "eager")
# Suffix tokens packed into one pass at most. Packed, each suffix's queries also meet every other
# suffix's keys (masked, but computed): the cost grows with the square of the pack. Measured on a CPU
# with SmolLM2: 8 suffixes of 89 tokens packed cut the update a third; 2 WebShop rows of 931-990
# tokens on their shared prompt took 18% longer packed than one at a time (docs/performance.md).
PACKED_SUFFIX_TOKENS = 512


def _prompt_length(ids: torch.Tensor, mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """Tokens of one row before its first trained token (its whole length when none is)."""
    trained = loss_mask.nonzero()
    return int(trained[0]) if len(trained) else int(mask.sum())


def _common_length(rows: Sequence[torch.Tensor]) -> int:
    """Length of the longest prefix all ``rows`` (1-D id tensors) share."""
    first = rows[0]
    length = min(len(r) for r in rows)
    for row in rows[1:]:
        differ = (row[:length] != first[:length]).nonzero()
        length = int(differ[0]) if len(differ) else length
    return length


def shared_prefix_groups(batch: Batch, packed_rows_share: bool = False) -> list[tuple[list[int], int]]:
    """Rows grouped under a shared prompt prefix: ``[(row indices, prefix length)]``, every row once.

    Two groupings are weighed by the tokens they save: rows with the same first prompt (the
    samples of a task), or all rows under the prefix all of them share (the system prompt and
    worked example). A row in no useful group comes back alone with prefix length 0, and so does
    every row packed from several (``position_ids`` restarting: a split episode) unless
    ``packed_rows_share``: the model's attention then takes the packed mask that
    :func:`omrl.training.policy.packed_mask` builds (transformers builds none beside a cache).
    """
    ids, mask, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    prompts = [ids[i, : _prompt_length(ids[i], mask[i], loss_mask[i])] for i in range(len(batch))]
    positions = batch.tensors.get("position_ids")
    if positions is not None and not packed_rows_share:
        restarts = ((positions[:, 1:] == 0) & (mask[:, 1:] == 1)).any(-1).tolist()
        packed = [i for i, restart in enumerate(restarts) if restart]
        if packed:
            rest = [i for i in range(len(batch)) if i not in set(packed)]
            groups = (
                [([rest[i] for i in members], length) for members, length in shared_prefix_groups(batch.rows(rest))]
                if rest
                else []
            )
            return groups + [([i], 0) for i in packed]
    if not prompts:
        return []

    def prefix_of(members: list[int]) -> int:
        # one token early: the suffix's first input predicts its first new token
        return max(_common_length([prompts[i] for i in members]) - 1, 0) if len(members) > 1 else 0

    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_prompt.setdefault(tuple(prompt.tolist()), []).append(i)
    per_task = [(members, prefix_of(members)) for members in by_prompt.values()]
    everyone = [(list(range(len(prompts))), prefix_of(list(range(len(prompts)))))]

    def saved(groups: list[tuple[list[int], int]]) -> int:
        return sum((len(members) - 1) * prefix for members, prefix in groups if prefix >= MIN_SHARED_TOKENS)

    best = max((per_task, everyone), key=saved)
    groups: list[tuple[list[int], int]] = []
    for members, prefix in best:
        if prefix >= MIN_SHARED_TOKENS and len(members) > 1:
            groups.append((members, prefix))
        else:
            groups.extend(([i], 0) for i in members)
    return groups


def mask_for(model: nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """A 4-D mask ``allowed`` [bs, 1, queries, keys] (True: attend) as ``model``'s attention takes it:
    boolean for sdpa, additive for eager; other kernels take no 4-D mask."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in PACKED_MASK_ATTENTION:
        raise ValueError(
            f"packed rows on a shared prefix need {' or '.join(PACKED_MASK_ATTENTION)} attention, "
            f"not {implementation!r}"
        )
    if implementation == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def packs_suffixes(model: nn.Module) -> bool:
    """Whether ``model``'s attention takes the 4-D mask that packs several suffixes (or sequences) on one
    prefix as given: sdpa or eager, and no sliding-window layer (transformers hands those the same
    4-D mask, so they would attend past their window)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) not in PACKED_MASK_ATTENTION:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        return "sliding_attention" not in layer_types
    return getattr(text, "sliding_window", None) is None or not getattr(text, "use_sliding_window", True)


class PackedSuffixes:
    """Rows ``[bs, L]`` (right-padded, their first ``start`` tokens the shared prefix) as one sequence
    of their suffixes, each attending to the prefix and to itself (causally), never to another.

    ``input_ids``, ``position_ids`` [1, T] and ``attention_mask`` [1, 1, T, start + T] go to the model;
    :meth:`unpack` takes its per-position outputs [1, T, ...] back to the rows' layout.
    """

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int):
        lengths = attention_mask.sum(-1) - start  # each row's suffix
        if bool((lengths < 1).any()):
            raise ValueError(f"every row needs a suffix after its {start}-token prefix, got lengths {lengths.tolist()}")
        width = input_ids.shape[1] - start
        offsets = torch.arange(width, device=input_ids.device)
        valid = offsets[None] < lengths[:, None]  # [bs, width]: positions that hold a suffix token
        self.input_ids = input_ids[:, start:][valid][None]
        self.position_ids = (offsets[None] + start).expand_as(valid)[valid][None]
        segment = torch.arange(len(lengths), device=input_ids.device).repeat_interleave(lengths)
        total = len(segment)
        causal = torch.ones(total, total, dtype=torch.bool, device=input_ids.device).tril()
        own = causal & (segment[:, None] == segment[None, :])
        seen = torch.ones(total, start, dtype=torch.bool, device=input_ids.device)
        self.attention_mask = mask_for(model, torch.cat([seen, own], -1)[None, None])
        # where each row position sits in the packed sequence (0 on padding, which nothing reads)
        self.index = torch.zeros_like(valid, dtype=torch.long)
        self.index[valid] = torch.arange(total, device=input_ids.device)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[1, T, ...] per packed position -> [bs, width, ...] per row position (padding: a copy of
        the first position's, never read)."""
        return packed[0][self.index]


def _base(model: nn.Module) -> nn.Module:
    """Under LoRA, the wrapped model (whose forward reads the arguments); else ``model`` itself."""
    return getattr(model, "get_base_model", lambda: model)()


def _takes(model: nn.Module, argument: str) -> bool:
    """Whether ``model``'s forward (or, under LoRA, its base model's) names ``argument``."""
    return any(argument in inspect.signature(m.forward).parameters for m in (model, _base(model)))


def no_logits(model: nn.Module) -> dict[str, object]:
    """The ``logits_to_keep`` argument that makes ``model`` compute no logits at all where transformers
    reads it (no positions), else the last position's: the caller runs the LM head itself."""
    if type(_base(model)).__module__.startswith("transformers."):
        return {"logits_to_keep": torch.zeros(0, dtype=torch.long)}
    return {"logits_to_keep": 1}


def cache_argument(model: nn.Module) -> str | None:
    """The name under which ``model``'s forward takes a KV cache (``cache`` or ``past_key_values``),
    or None when it takes neither."""
    return next((name for name in ("cache", "past_key_values") if _takes(model, name)), None)


def supports_shared_prefix(model: nn.Module) -> bool:
    """Whether ``model`` can run a suffix on a prefix's keys and values under its checkpointing."""
    if cache_argument(model) is None:
        return False
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    # transformers that drop the cache under checkpointing have no switch to keep it
    return bool(layers) and all(hasattr(layer, "_can_checkpoint_with_cache") for layer in layers)


def _caches():
    from transformers import DynamicCache

    class Capture(DynamicCache):
        """Keeps each layer's keys and values as computed; a checkpoint's recompute overwrites
        them with equal ones, so it is safe to replay."""

        def __init__(self) -> None:
            super().__init__()
            self.captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.captured[layer_idx] = (key_states, value_states)
            return key_states, value_states

    class ReadOnly(DynamicCache):
        """The prefix's keys and values in front of a suffix's, never stored: a replay sees the same."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)

    return Capture, ReadOnly


def _checkpointed(model: nn.Module) -> bool:
    """Whether ``model``'s layers recompute their activations in backward (gradient checkpointing is on)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return any(m.gradient_checkpointing for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


@contextlib.contextmanager
def _keep_cache_under_checkpointing(model: nn.Module) -> Iterator[None]:
    """Let checkpointed layers receive the cache: both caches here only read or overwrite, so a
    recompute in backward sees what the forward saw (transformers' stated condition)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    before = [layer.__dict__.get("_can_checkpoint_with_cache") for layer in layers]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer, value in zip(layers, before):
            if value is None:
                del layer._can_checkpoint_with_cache
            else:
                layer._can_checkpoint_with_cache = value


def with_shared_prefixes(
    model: nn.Module, batch: Batch, micro_batch_size: int
) -> Iterator[tuple[Batch, "SharedPrefix | None"]]:
    """The update's micro-batches of ``batch``, each with the shared prefix it runs on (or None).

    A group's rows run on its prefix, whose backward runs once after the group's last row has run
    backward: the caller runs each micro-batch's forward and backward before asking for the next.
    They go ``micro_batch_size`` at a time (packed: :class:`PackedSuffixes`) where the attention
    takes the mask that needs, else one at a time (no padding); rows split into several sequences
    (``position_ids``) always one at a time. Rows in no group go in length-sorted micro-batches of
    ``micro_batch_size``.
    """
    from omrl.training.rl_data import micro_batches

    packed = packs_suffixes(model)
    groups = shared_prefix_groups(batch, packed)
    alone = [i for rows, length in groups if not length for i in rows]
    if alone:
        yield from ((mb, None) for mb in micro_batches(batch.rows(alone), micro_batch_size))
    size = micro_batch_size if packed and "position_ids" not in batch.tensors else 1
    row_lengths = batch["attention_mask"].sum(-1).tolist()
    for rows, length in groups:
        if length:
            with SharedPrefix(model, batch["input_ids"][rows[0], :length]) as prefix:
                for pack in packs(rows, [row_lengths[i] - length for i in rows], size):
                    yield micro_batches(batch.rows(pack), len(pack))[0], prefix


def packs(rows: list[int], suffix_lengths: list[int], size: int) -> list[list[int]]:
    """``rows`` in order, cut into packs of at most ``size`` rows whose suffixes add up to at most
    PACKED_SUFFIX_TOKENS (a row longer than that alone)."""
    out: list[list[int]] = []
    tokens = 0
    for row, length in zip(rows, suffix_lengths):
        if out and len(out[-1]) < size and tokens + length <= PACKED_SUFFIX_TOKENS:
            out[-1].append(row)
            tokens += length
        else:
            out.append([row])
            tokens = length
    return out


class SharedPrefix:
    """One prefix's forward, its keys and values for the suffixes, and its backward at the end.

    Use as a context manager around the suffixes' forward and backward passes::

        with SharedPrefix(model, prefix_ids) as prefix:
            for row in rows:
                out = policy_forward(model, row_ids, row_mask, prefix=prefix, ...)
                loss.backward()
        # leaving the block sends the summed gradients back through the prefix once
    """

    def __init__(self, model: nn.Module, prefix_ids: torch.Tensor):
        if prefix_ids.dim() != 1 or not len(prefix_ids):
            raise ValueError(f"a shared prefix is a non-empty 1-D id tensor, got shape {tuple(prefix_ids.shape)}")
        self.model = model
        self.prefix_ids = prefix_ids
        self.length = len(prefix_ids)
        self.argument = cache_argument(model)
        self._stack = contextlib.ExitStack()
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._leaves: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> "SharedPrefix":
        capture_class, self._read_only = _caches()
        self._stack.enter_context(_keep_cache_under_checkpointing(self.model))
        capture = capture_class()
        # no vocabulary-sized logits for a prefix whose predictions are never used
        keep = no_logits(self.model) if _takes(self.model, "logits_to_keep") else {}
        # under checkpointing transformers turns use_cache off itself, with a warning: the same, unsaid
        use_cache = not (self.model.training and _checkpointed(self.model))
        with timed("forward"):  # the update's forward, as its rows' are
            self.model(input_ids=self.prefix_ids[None], use_cache=use_cache, **keep, **{self.argument: capture})
        self._captured = [capture.captured[i] for i in sorted(capture.captured)]
        grad = torch.is_grad_enabled()
        # the suffixes' gradients stop at these copies and are summed in their .grad
        self._leaves = [(k.detach().requires_grad_(grad), v.detach().requires_grad_(grad)) for k, v in self._captured]
        return self

    def cache_kwargs(self) -> dict[str, object]:
        """The keyword argument that puts the prefix in front of a suffix's forward."""
        return {self.argument: self._read_only(ddp_cache_data=self._leaves)}

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None and torch.is_grad_enabled():
                pairs = [
                    (out, leaf.grad)
                    for outs, leaves in zip(self._captured, self._leaves)
                    for out, leaf in zip(outs, leaves)
                    if leaf.grad is not None and out.requires_grad
                ]
                if pairs:
                    with timed("backward"):
                        torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        finally:
            self._captured, self._leaves = [], []
            self._stack.close()
