"""The Batch container: selection, slicing, splitting, padding, devices and a lossless parquet round trip."""

from __future__ import annotations

import pytest
import torch

from omrl.data.batch import Batch, pad_sequences
from omrl.errors import OmrlError


def make(n: int = 5) -> Batch:
    return Batch(
        tensors={
            "input_ids": torch.arange(n * 3).reshape(n, 3),
            "logprobs": torch.linspace(-1, 0, n * 3).reshape(n, 3).to(torch.bfloat16),
            "mask": torch.tensor([[True, False, True]] * n),
            "scores": torch.arange(n, dtype=torch.float32),
            "cube": torch.randn(n, 2, 2),
        },
        non_tensors={
            "task": [f"t{i}" for i in range(n)],
            "info": [{"k": i, "v": [i] * i} for i in range(n)],
            "mixed": ([1, "a", None, 2.5, [1]] * 2)[:n],
        },
        meta={"step": 3},
    )


def test_rows_slice_index_and_mask():
    b = make()
    assert len(b) == 5
    assert b[1:3]["task"] == ["t1", "t2"]
    picked = b[[4, 0]]
    assert picked["task"] == ["t4", "t0"] and picked["input_ids"][0].tolist() == [12, 13, 14]
    masked = b[b["scores"] > 2]
    assert masked["task"] == ["t3", "t4"]
    assert b[2]["task"] == ["t2"] and b.meta == {"step": 3}


def test_select_union_and_missing_column():
    b = make()
    s = b.select("input_ids", "task")
    assert s.keys() == ["input_ids", "task"]
    assert set(s.union(b.select("scores")).keys()) == {"input_ids", "task", "scores"}
    with pytest.raises(KeyError, match="no column"):
        b.select("nope")


def test_split_chunk_concat_round_trip():
    b = make(7)
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert [len(p) for p in b.chunk(3)] == [2, 3, 2]
    joined = Batch.concat(parts)
    assert torch.equal(joined["input_ids"], b["input_ids"]) and joined["task"] == b["task"]
    with pytest.raises(OmrlError):
        b.split(0)


def test_pad_rows_to_a_multiple():
    padded, added = make(5).pad_rows(4)
    assert (len(padded), added) == (8, 3)
    assert padded["task"][5:] == ["t0", "t1", "t2"]


def test_rows_must_agree():
    with pytest.raises(OmrlError, match="disagree"):
        Batch({"a": torch.zeros(2)}, {"b": [1, 2, 3]})


def test_parquet_round_trip_is_lossless(tmp_path):
    b = make()
    path = tmp_path / "sub" / "batch.parquet"
    b.to_parquet(path)
    back = Batch.from_parquet(path)
    for k, t in b.tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch.equal(back[k], t), k
    assert back.non_tensors == b.non_tensors
    assert back.meta == b.meta
    assert not list(path.parent.glob(".*tmp*")), "temporary file left behind"


def test_from_parquet_refuses_foreign_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1]}), tmp_path / "x.parquet")
    with pytest.raises(OmrlError, match="not an omrl Batch"):
        Batch.from_parquet(tmp_path / "x.parquet")


def test_to_device_and_pad_sequences():
    b = make().to("cpu")
    assert b["input_ids"].device.type == "cpu"
    padded = pad_sequences([[1, 2, 3], [4]], pad_value=0)
    assert padded.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_sequences([[1, 2, 3], [4]], pad_value=9, left=True).tolist() == [[1, 2, 3], [9, 9, 4]]
