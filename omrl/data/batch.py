"""Batch: named tensors + non-tensor columns + meta info (the reference design's DataProto).

Every tensor and every non-tensor column has the same first dimension (rows).
All operations return new batches; tensors are never copied when a view will do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from omrl.atomic import atomic_write_parquet
from omrl.errors import OmrlError

_META_KEY = b"omrl.batch"


@dataclass
class Batch:
    """A batch of rows: ``tensors`` (N, ...), ``non_tensors`` (N objects each), ``meta``."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: list(v) for k, v in self.non_tensors.items()}
        sizes = {k: t.shape[0] for k, t in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(sizes.values())) > 1:
            raise OmrlError(f"Batch columns disagree on the number of rows: {sizes}")

    # -- shape -------------------------------------------------------------
    def __len__(self) -> int:
        for t in self.tensors.values():
            return int(t.shape[0])
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def get(self, key: str, default: Any = None) -> Any:
        """The column ``key``, or ``default`` when the batch has none (as ``dict.get``: code that reads a
        micro-batch takes a Batch or a plain dict of tensors alike)."""
        return self[key] if key in self.tensors or key in self.non_tensors else default

    def __getitem__(self, key: str | int | slice | Sequence[int] | torch.Tensor) -> Any:
        """``batch["name"]`` gives a column; an int, slice, index list or mask gives rows."""
        if isinstance(key, str):
            if key in self.tensors:
                return self.tensors[key]
            if key in self.non_tensors:
                return self.non_tensors[key]
            raise KeyError(f"no column {key!r}; columns: {', '.join(self.keys())}")
        if isinstance(key, int):
            return self.rows(slice(key, key + 1 if key != -1 else None))
        return self.rows(key)

    def rows(self, index: slice | Sequence[int] | torch.Tensor) -> "Batch":
        """Select rows by slice, list of indices, index tensor or boolean mask."""
        if isinstance(index, slice):
            idx_list = list(range(len(self)))[index]
            tensors = {k: t[index] for k, t in self.tensors.items()}
        else:
            idx = torch.as_tensor(index)
            if idx.dtype == torch.bool:
                idx = idx.nonzero().flatten()
            idx_list = idx.tolist()
            tensors = {k: t[idx.to(t.device)] for k, t in self.tensors.items()}
        non_tensors = {k: [v[i] for i in idx_list] for k, v in self.non_tensors.items()}
        return Batch(tensors, non_tensors, dict(self.meta))

    # -- columns -----------------------------------------------------------
    def select(self, *keys: str) -> "Batch":
        """A batch with only the named columns (tensor or non-tensor)."""
        missing = [k for k in keys if k not in self.tensors and k not in self.non_tensors]
        if missing:
            raise KeyError(f"no column(s) {missing}; columns: {', '.join(self.keys())}")
        return Batch(
            {k: t for k, t in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def union(self, other: "Batch") -> "Batch":
        """Columns of both batches side by side (same number of rows)."""
        return Batch(
            {**self.tensors, **other.tensors}, {**self.non_tensors, **other.non_tensors}, {**self.meta, **other.meta}
        )

    # -- splitting and joining --------------------------------------------
    def split(self, size: int) -> list["Batch"]:
        """Consecutive micro-batches of ``size`` rows (the last may be smaller)."""
        if size <= 0:
            raise OmrlError(f"split size must be positive, got {size}")
        return [self.rows(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """``n`` nearly equal parts (for data-parallel ranks)."""
        if n <= 0:
            raise OmrlError(f"chunk count must be positive, got {n}")
        bounds = np.linspace(0, len(self), n + 1).round().astype(int)
        return [self.rows(slice(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        """Rows of all batches, one after the other; meta from the first."""
        batches = list(batches)
        if not batches:
            return Batch()
        keys = [set(b.keys()) for b in batches]
        if any(k != keys[0] for k in keys):
            raise OmrlError(f"cannot concat batches with different columns: {keys}")
        first = batches[0]
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: [x for b in batches for x in b.non_tensors[k]] for k in first.non_tensors}
        return Batch(tensors, non_tensors, dict(first.meta))

    def pad_rows(self, multiple: int) -> tuple["Batch", int]:
        """Repeat leading rows so the row count divides ``multiple``; returns (batch, added)."""
        extra = (-len(self)) % multiple
        if extra == 0:
            return self, 0
        if len(self) == 0:
            raise OmrlError("cannot pad an empty batch")
        filler = self.rows([i % len(self) for i in range(extra)])
        return Batch.concat([self, filler]), extra

    def to(self, device: str | torch.device) -> "Batch":
        return Batch({k: t.to(device) for k, t in self.tensors.items()}, self.non_tensors, self.meta)

    # -- parquet ------------------------------------------------------------
    def to_parquet(self, path: str | os.PathLike) -> None:
        """Write the batch to parquet atomically (a crash never leaves a partial file)."""
        columns, schema_info = {}, {"tensors": {}, "json": [], "meta": self.meta}
        for k, t in self.tensors.items():
            t = t.detach().cpu()
            store = t.float() if t.dtype == torch.bfloat16 else t  # arrow has no bf16; fp32 is exact
            flat = store.reshape(len(t), -1).numpy()
            columns[k] = pa.array(list(flat)) if flat.shape[1] else pa.array([[]] * len(t), pa.list_(pa.float32()))
            schema_info["tensors"][k] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape[1:])}
        for k, v in self.non_tensors.items():
            try:
                columns[k] = pa.array(v)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                columns[k] = pa.array([json.dumps(x) for x in v])
                schema_info["json"].append(k)
        table = pa.table(columns) if columns else pa.table({})
        table = table.replace_schema_metadata({_META_KEY: json.dumps(schema_info)})
        atomic_write_parquet(table, path)

    @staticmethod
    def from_parquet(path: str | os.PathLike) -> "Batch":
        """Read a batch written by :meth:`to_parquet`, dtypes and shapes restored."""
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise OmrlError(f"{path} is not an omrl Batch parquet file (no {_META_KEY.decode()} metadata)")
        info = json.loads(raw)
        tensors, non_tensors = {}, {}
        for k in table.column_names:
            if k in info["tensors"]:
                spec = info["tensors"][k]
                dtype = getattr(torch, spec["dtype"])
                values = table.column(k).to_pylist()
                arr = np.asarray(values, dtype=np.float32 if dtype == torch.bfloat16 else None)
                t = torch.as_tensor(arr.reshape(len(values), *spec["shape"]) if len(values) else arr)
                tensors[k] = t.to(dtype) if len(values) else torch.empty((0, *spec["shape"]), dtype=dtype)
            elif k in info["json"]:
                non_tensors[k] = [json.loads(x) for x in table.column(k).to_pylist()]
            else:
                non_tensors[k] = table.column(k).to_pylist()
        return Batch(tensors, non_tensors, info.get("meta", {}))


def pad_sequences(
    seqs: Sequence[Sequence[int | float]],
    pad_value: int | float = 0,
    dtype: torch.dtype = torch.long,
    left: bool = False,
) -> torch.Tensor:
    """Pad variable-length sequences into a (len(seqs), max_len) tensor."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_value, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s):
            values = torch.as_tensor(list(s), dtype=dtype)
            if left:
                out[i, width - len(s) :] = values
            else:
                out[i, : len(s)] = values
    return out
