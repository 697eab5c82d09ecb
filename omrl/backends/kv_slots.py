"""The turn-by-turn decode batch: rows' KV states in preallocated slots, so a step copies no row's states.

The KV-reusing engine (:mod:`omrl.backends.hf_reuse`) decodes a call's rows together until each ends.
transformers' ``DynamicCache`` grows by ``cat``, copying every row's states each step; a
:class:`SlotBatch` keeps each layer's keys and values in buffers with room to grow:

- the rows are stacked once, right-aligned to a shared column, ``end``, as a left-padded stack is;
  every row writes its next token at ``end``;
- rows that end leave with :meth:`SlotBatch.keep` (the others move up), so the live rows stay the first ones
  (no row joins a running batch: continuous batching is :mod:`omrl.backends.kv_ragged`'s);
- the model sees views of the columns in use, and writes its new states into the buffers in place.

The attention mask says which columns hold each row's tokens, and positions are given per row, so a
row's logits equal those of the same row in any other batch (up to float rounding).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from omrl.backends.kv_cache import KV, kv_length

#: columns a buffer is grown by beyond what it must hold, so growing is rare
HEADROOM = 256


def _slot_layer_class() -> type:
    """A transformers cache layer that lives in a :class:`SlotBatch`'s buffers (built on first use, so
    importing this module does not import transformers)."""
    from transformers.cache_utils import DynamicLayer

    class SlotLayer(DynamicLayer):
        """Writes new states into its batch's buffers at ``end`` and hands the model views of the columns in use."""

        def __init__(self, batch: SlotBatch, index: int):
            super().__init__()
            self.batch, self.index = batch, index
            self.is_initialized = True
            self.keys = self.values = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            pass

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            batch, new = self.batch, key_states.shape[-2]
            keys, values = batch.keys[self.index], batch.values[self.index]
            keys[: batch.rows, :, batch.end : batch.end + new] = key_states
            values[: batch.rows, :, batch.end : batch.end + new] = value_states
            self.keys = keys[: batch.rows, :, : batch.end + new]
            self.values = values[: batch.rows, :, : batch.end + new]
            return self.keys, self.values

    return SlotLayer


class SlotBatch:
    """Rows of KV states decoding together: stacked once (:meth:`stack`), leaving as they end (:meth:`keep`)."""

    def __init__(self, template: KV, rows: int, columns: int, device: torch.device):
        from transformers.cache_utils import Cache

        self.device = device
        self.rows = 0
        self.end = 0  # columns [0, end) are in use; every row writes its next token in column end
        self._shapes = [(k.shape[1], k.shape[3], v.shape[1], v.shape[3], k.dtype) for k, v in template]
        self._allocate(rows, columns)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)  # each row's next position
        layer = _slot_layer_class()
        self.cache = Cache(layers=[layer(self, i) for i in range(len(template))])

    @classmethod
    def stack(cls, kvs: list[KV], device: torch.device) -> SlotBatch:
        """A batch of exactly these rows (batch 1 each), in order, each right-aligned to the longest: the
        layout of a left-padded stack, so each row's logits equal those of such a stack to the bit."""
        width = max(kv_length(kv) for kv in kvs)
        batch = cls(kvs[0], len(kvs), width + HEADROOM, device)
        batch.end = width  # every row ends there
        for row, kv in enumerate(kvs):
            first = width - kv_length(kv)
            batch._clear(slice(row, row + 1), 0, first)
            for layer, (keys, values) in enumerate(kv):
                batch.keys[layer][row, :, first:width] = keys[0]
                batch.values[layer][row, :, first:width] = values[0]
            batch.mask[row] = 0
            batch.mask[row, first:width] = 1
            batch.positions[row] = width - first
        batch.rows = len(kvs)
        return batch

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    def row(self, index: int) -> KV:
        """Row ``index``'s states, its own columns only (a copy of batch 1)."""
        columns = self.mask[index, : self.end].nonzero().squeeze(1)
        return [
            (k[index : index + 1].index_select(2, columns), v[index : index + 1].index_select(2, columns))
            for k, v in zip(self.keys, self.values)
        ]

    def keep(self, indices: list[int]) -> None:
        """Keep the rows at ``indices`` (ascending), in their order, as rows 0, 1, ...; the columns stay
        as they are (dropping unused leading ones would change the attention's float rounding)."""
        for new, old in enumerate(indices):
            if new != old:  # ascending: a row moves only to a lower index, never over one still to move
                for keys, values in zip(self.keys, self.values):
                    keys[new, :, : self.end] = keys[old, :, : self.end]
                    values[new, :, : self.end] = values[old, :, : self.end]
                self.mask[new] = self.mask[old]
                self.positions[new] = self.positions[old]
        self.rows = len(indices)

    def step(self, forward: Callable[..., torch.Tensor], tokens: list[int]) -> torch.Tensor:
        """Feed one token per row; (rows, vocab) float32 logits of each row's next."""
        self._reserve(self.end + 1)
        rows = self.rows
        self.mask[:rows, self.end] = 1
        ids = torch.tensor(tokens, device=self.device)[:, None]
        mask = self.mask[:rows, : self.end + 1]
        for layer in self.cache.layers:  # the model reads the cache's length before it writes
            layer.keys = self.keys[layer.index][:rows, :, : self.end]
            layer.values = self.values[layer.index][:rows, :, : self.end]
        logits = forward(ids, self.positions[:rows, None], self.cache, mask)
        self.end += 1
        self.positions[:rows] += 1
        return logits

    def _reserve(self, columns: int) -> None:
        """Room for ``columns`` columns: past the buffers' size the live rows move to larger buffers (half
        again as wide as the columns in use, plus HEADROOM: growing stays rare)."""
        if columns <= self.capacity:
            return
        old_keys, old_values, old_mask, live, end = self.keys, self.values, self.mask, self.rows, self.end
        self._allocate(old_mask.shape[0], max(columns, 3 * end // 2) + HEADROOM)
        for layer in range(len(old_keys)):
            self.keys[layer][:live, :, :end] = old_keys[layer][:live, :, :end]
            self.values[layer][:live, :, :end] = old_values[layer][:live, :, :end]
        self.mask[:live, :end] = old_mask[:live, :end]

    def _clear(self, rows: slice, first: int, last: int) -> None:
        """Zero columns [first, last) of ``rows``: masked columns the model sees must hold numbers (attention
        multiplies a masked value by a weight of 0, and 0 times a NaN left in fresh memory is a NaN)."""
        if last > first:
            for keys, values in zip(self.keys, self.values):
                keys[rows, :, first:last] = 0
                values[rows, :, first:last] = 0
            self.mask[rows, first:last] = 0

    def _allocate(self, rows: int, columns: int) -> None:
        """Buffers of ``rows`` rows and ``columns`` columns, left unset: a column is written or cleared
        (:meth:`_clear`) before any row's view takes it in."""
        self.keys = [
            torch.empty((rows, kh, columns, kd), dtype=dtype, device=self.device)
            for kh, kd, _, _, dtype in self._shapes
        ]
        self.values = [
            torch.empty((rows, vh, columns, vd), dtype=dtype, device=self.device)
            for _, _, vh, vd, dtype in self._shapes
        ]
        self.mask = torch.zeros((rows, columns), dtype=torch.long, device=self.device)
