"""A decode batch whose rows feed different numbers of tokens in one forward: a prompt joins a decode step.

Run on its own, a turn's prompt costs a whole forward: on a CPU the weights are read for it as for a
decode step (about 60 ms for SmolLM2-135M on one thread), on a GPU a call's launches (about 24 ms on an
H200) whatever its size. A :class:`RaggedBatch` runs the prompts of rows that join and the one new
token of each decoding row as one flat sequence (batch 1): the projections and MLPs see every new
token at once, and each row's tokens attend to that row's own states alone, one attention call a row
(:func:`ragged_attention`), so no row attends to another's padding either.

Each row keeps its states in its own row of preallocated buffers, left-aligned: row ``r`` holds
``lengths[r]`` columns and writes its new tokens after them. A row that leaves is replaced by the last
row (one row copied), so the live rows stay the first ones.

The model runs with its attention implementation switched to ``omrl_ragged`` for the step; the step
checks that every layer attended through it (a model whose layers do not use transformers' attention
interface cannot run ragged, and says so instead of computing something else).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from omrl.backends.kv_cache import KV, kv_length
from omrl.errors import ConfigError

ATTENTION = "omrl_ragged"
#: columns a buffer is grown by beyond what it must hold, so growing is rare
HEADROOM = 256


@dataclass
class _Step:
    """One ragged forward: for each row fed, where its tokens sit in the flat sequence and in its row."""

    segments: list[tuple[int, int, int, int]]  # (first, end) in the flat sequence, row, columns before its tokens
    masks: list[torch.Tensor | None] = field(default_factory=list)  # per segment: causal within it (None: 1 token)
    keys: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # per layer: each segment's keys so far
    values: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    attended: int = 0  # layers that attended through ragged_attention


_STEP: ContextVar[_Step | None] = ContextVar("omrl_ragged_step", default=None)
#: what some models hand their attention that the plain per-row attention here does not do
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "sinks")


def ragged_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for a ragged step: each segment's queries (1, heads, n, dim) against its own row's keys and
    values, causal within the segment; returns (1, tokens, heads, dim) as transformers' attention functions do."""
    step = _STEP.get()
    if step is None:
        raise RuntimeError(f"the {ATTENTION} attention runs only inside RaggedBatch.step")
    unsupported = sorted(name for name in _UNSUPPORTED if kwargs.get(name) is not None)
    if unsupported or dropout:
        raise ConfigError(
            f"generation.batching=continuous cannot run this model's attention ({', '.join(unsupported) or 'dropout'}); "
            "valid: generation.batching=turns"
        )
    if not step.masks:  # built at the first layer, for them all
        step.masks = [_causal(before, end - first, query.device) for first, end, _, before in step.segments]
    layer = module.layer_idx
    outputs = []
    for (first, end, _, _), mask, keys, values in zip(step.segments, step.masks, step.keys[layer], step.values[layer]):
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, first:end], keys, values, attn_mask=mask, scale=scaling, enable_gqa=True
            )
        )
    step.attended += 1
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _causal(before: int, new: int, device: torch.device) -> torch.Tensor | None:
    """Which of a row's ``before + new`` columns each of its ``new`` tokens sees: its own and those before it."""
    if new == 1:
        return None  # one token sees every column
    columns = torch.arange(before + new, device=device)
    return columns[None, :] <= before + torch.arange(new, device=device)[:, None]


@functools.cache
def _registered() -> None:
    """Register :func:`ragged_attention` with transformers, once (the steps call this each time)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ragged_attention)


@contextmanager
def _attending_ragged(config: Any) -> Iterator[None]:
    """The model's layers attend through :func:`ragged_attention` inside this block, as before after it."""
    _registered()
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def _ragged_layer_class() -> type:
    """A transformers cache layer writing into a :class:`RaggedBatch`'s rows (built on first use, so importing
    this module does not import transformers)."""
    from transformers.cache_utils import DynamicLayer

    class RaggedLayer(DynamicLayer):
        """Writes each segment's new states after its row's columns; hands the attention each row's columns."""

        def __init__(self, batch: RaggedBatch, index: int):
            super().__init__()
            self.batch, self.index = batch, index
            self.is_initialized = True

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            pass

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            step = _STEP.get()
            assert step is not None, "a RaggedBatch's cache is used only inside its step"
            batch = self.batch
            keys_of, values_of = batch.keys[self.index], batch.values[self.index]
            step.keys[self.index], step.values[self.index] = [], []
            for first, end, row, before in step.segments:
                upto = before + end - first
                keys_of[row, :, before:upto] = key_states[0, :, first:end]
                values_of[row, :, before:upto] = value_states[0, :, first:end]
                step.keys[self.index].append(keys_of[row : row + 1, :, :upto])
                step.values[self.index].append(values_of[row : row + 1, :, :upto])
            return key_states, value_states

        def get_seq_length(self) -> int:
            return 0  # positions are given per token; nothing reads a shared length

    return RaggedLayer


class RaggedBatch:
    """Rows of KV states fed together, each its own number of new tokens a step (see the module docstring)."""

    def __init__(self, model: Any, max_rows: int, device: torch.device):
        from transformers.cache_utils import Cache

        config = model.config
        self.config, self.device, self.max_rows = config, device, max_rows
        self.lengths: list[int] = []  # each live row's columns
        self._shape = (  # a config without key-value heads of its own (GPT-2) has as many as query heads
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        )
        self._dtype = model.dtype
        self._no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)  # 4-D: transformers builds no mask
        layers = config.num_hidden_layers
        self.keys: list[torch.Tensor] = [torch.empty(0)] * layers
        self.values: list[torch.Tensor] = [torch.empty(0)] * layers
        self._allocate(1, HEADROOM)
        layer = _ragged_layer_class()
        self.cache = Cache(layers=[layer(self, i) for i in range(layers)])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def add(self, kv: KV) -> int:
        """A new row holding ``kv`` (batch 1; empty: no states yet); its index."""
        if self.rows == self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows already")
        length = kv_length(kv) if kv else 0
        row = self.rows
        self._room(length, row + 1)
        self.lengths.append(length)
        if kv:
            for layer, (keys, values) in enumerate(kv):
                self.keys[layer][row, :, :length] = keys[0]
                self.values[layer][row, :, :length] = values[0]
        return row

    def view(self, index: int) -> KV:
        """Row ``index``'s states as views (batch 1): valid until the batch next changes."""
        length = self.lengths[index]
        return [
            (k[index : index + 1, :, :length], v[index : index + 1, :, :length]) for k, v in zip(self.keys, self.values)
        ]

    def row(self, index: int) -> KV:
        """Row ``index``'s states, copied (batch 1)."""
        return [(k.clone(), v.clone()) for k, v in self.view(index)]

    def remove(self, index: int) -> None:
        """Row ``index`` leaves; the last row takes its place (callers reorder their rows the same way)."""
        last = self.rows - 1
        if index != last:
            length = self.lengths[last]
            for keys, values in zip(self.keys, self.values):
                keys[index, :, :length] = keys[last, :, :length]
                values[index, :, :length] = values[last, :, :length]
            self.lengths[index] = length
        self.lengths.pop()

    def step(self, forward: Callable[..., torch.Tensor], feeds: list[list[int]]) -> torch.Tensor:
        """Feed row ``r`` the ids ``feeds[r]`` (one or more each); (rows, vocab) float32 logits of each row's next
        token. ``forward(ids, positions, cache, mask, keep)`` runs the model on the flat (1, tokens) sequence
        and gives the logits at the positions ``keep``."""
        if len(feeds) != self.rows:
            raise ValueError(f"a step feeds each of the {self.rows} rows, got {len(feeds)} feeds")
        if not all(feeds):
            raise ValueError(f"a step feeds every row one or more ids; row {[len(f) for f in feeds].index(0)} got none")
        segments, first = [], 0
        for row, ids in enumerate(feeds):
            segments.append((first, first + len(ids), row, self.lengths[row]))
            first += len(ids)
        self._room(max(before + end - start for start, end, _, before in segments), self.rows)
        flat = torch.tensor([token for ids in feeds for token in ids], device=self.device)[None]
        positions = torch.cat([torch.arange(before, before + end - start) for start, end, _, before in segments]).to(
            self.device
        )[None]
        keep = torch.tensor([end - 1 for _, end, _, _ in segments], device=self.device)
        step = _Step(segments)
        token = _STEP.set(step)
        try:
            with _attending_ragged(self.config):
                logits = forward(flat, positions, self.cache, self._no_mask, keep)
        finally:
            _STEP.reset(token)
        if step.attended != len(self.cache.layers):
            raise ConfigError(
                f"generation.batching=continuous needs every layer to attend through transformers' attention "
                f"interface; {step.attended} of this model's {len(self.cache.layers)} did. valid: generation.batching=turns"
            )
        for row, ids in enumerate(feeds):
            self.lengths[row] += len(ids)
        return logits

    def _room(self, columns: int, rows: int) -> None:
        """Room for ``columns`` columns and ``rows`` rows; past the buffers' size the live rows move to larger
        ones (columns by half again, rows by doubling up to ``max_rows``: growing stays rare)."""
        have_rows, have_columns = self.keys[0].shape[0], self.keys[0].shape[2]
        if columns <= have_columns and rows <= have_rows:
            return
        old_keys, old_values = self.keys, self.values
        grown_rows = have_rows if rows <= have_rows else min(self.max_rows, max(rows, 2 * have_rows))
        grown_columns = have_columns if columns <= have_columns else max(columns, 3 * have_columns // 2) + HEADROOM
        self._allocate(grown_rows, grown_columns)
        live, width = self.rows, max(self.lengths, default=0)
        for layer in range(len(old_keys)):
            self.keys[layer][:live, :, :width] = old_keys[layer][:live, :, :width]
            self.values[layer][:live, :, :width] = old_values[layer][:live, :, :width]

    def _allocate(self, rows: int, columns: int) -> None:
        """Buffers of ``rows`` rows and ``columns`` columns, left unset: a row's columns are written before any
        attention reads them."""
        heads, dim = self._shape
        shape = (rows, heads, columns, dim)
        self.keys = [torch.empty(shape, dtype=self._dtype, device=self.device) for _ in self.keys]
        self.values = [torch.empty(shape, dtype=self._dtype, device=self.device) for _ in self.values]
