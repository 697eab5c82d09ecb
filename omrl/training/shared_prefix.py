"""Rows that open with the same prompt run that prompt once in the update.

The samples of a GRPO group share their whole first prompt, and every WebShop episode opens
with the same system prompt and worked example: in the default job more than half of the
update's tokens are such repeats. Here a shared prefix runs forward once (its keys and values
captured), each row then runs only its own suffix on top of those keys and values, and the
prefix runs backward once with the gradients all suffixes sent into its keys and values. The
loss and the gradients are those of running every row whole (to float rounding; tests compare).

Only prompt tokens are shared: a prefix ends before the first trained token of any of its rows,
and one token early, so that each suffix starts with the token that predicts its first new one.
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

    Rows in a group run one at a time (no padding) on their group's prefix, whose backward runs
    once after the group's last row has run backward: the caller runs each micro-batch's
    forward and backward before asking for the next. Rows in no group go in length-sorted
    micro-batches of ``micro_batch_size``.
    """
    from omrl.training.rl_data import micro_batches

    groups = shared_prefix_groups(batch, getattr(model.config, "_attn_implementation", None) in PACKED_MASK_ATTENTION)
    alone = [i for rows, length in groups if not length for i in rows]
    if alone:
        yield from ((mb, None) for mb in micro_batches(batch.rows(alone), micro_batch_size))
    for rows, length in groups:
        if length:
            with SharedPrefix(model, batch["input_ids"][rows[0], :length]) as prefix:
                for i in rows:
                    yield micro_batches(batch.rows([i]), 1)[0], prefix


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
        with timed("forward"):  # the update's forward, as its rows' are
            self.model(input_ids=self.prefix_ids[None], use_cache=True, **keep, **{self.argument: capture})
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
