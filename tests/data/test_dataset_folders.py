"""A folder of `omrl rollout` outputs: each episode is read once, from its trajectory parquet."""

from __future__ import annotations

import json
import warnings

import pytest

from omrl.data.conversations import load_conversations, write_conversations
from omrl.rollout.convert import write_trajectories

from .episodes import CHAT, seat_episode


def test_a_rollouts_readable_jsonl_beside_its_parquet_is_not_read_again(tmp_path):
    episodes = [seat_episode("x", "win", CHAT), seat_episode("o", "loss", CHAT)]
    write_trajectories(episodes, tmp_path / "a.parquet")
    write_trajectories(episodes, tmp_path / "b" / "b.parquet")
    with pytest.warns(UserWarning) as said:
        conversations = load_conversations(tmp_path)
    assert [c.source for c in conversations] == [
        f"{tmp_path / 'a.parquet'} row 1",
        f"{tmp_path / 'a.parquet'} row 2",
        f"{tmp_path / 'b' / 'b.parquet'} row 1",
        f"{tmp_path / 'b' / 'b.parquet'} row 2",
    ]
    assert [str(w.message) for w in said] == [
        f"{tmp_path}: read 2 rollout trajectory files, not the readable .jsonl beside each (a.jsonl, "
        "b/b.jsonl): they hold the same episodes"
    ]


def test_a_jsonl_beside_a_parquet_of_records_is_read(tmp_path):
    record = {"conversations": CHAT}
    (tmp_path / "a.jsonl").write_text(json.dumps(record) + "\n")
    write_conversations(load_conversations(tmp_path / "a.jsonl"), tmp_path / "a.parquet")  # records: not episodes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_conversations(tmp_path)) == 2
