"""Trajectory records survive parquet unchanged."""

from __future__ import annotations

import pytest

from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.errors import OmrlError


def test_episode_parquet_round_trip(tmp_path):
    ep = Episode(
        env="gridworld", task_id=7, split="test", instruction="reach the goal",
        turns=[Turn("obs", "Act: up", "up", True, 0.0, False, {"won": False, "nested": {"a": [1, 2]}}, (5, 8)),
               Turn("obs2", "junk", None, False, 1.0, True, {"won": True, "score": 1.0}, (12, 14), "no action")],
        token_ids=list(range(14)), loss_mask=[0] * 5 + [1] * 3 + [0] * 4 + [1] * 2,
        logprobs=[0.0] * 5 + [-0.5, -0.25, -0.125] + [0.0] * 4 + [-1.0, -2.0],
        prompt_length=5, won=True, score=1.0, end_reason="done", group=2, sample=1,
        rewards={"goal": [0.0, 1.0], "total": [0.0, 1.0]},
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Act: up"}], demo_messages=2,
    )
    path = write_episodes([ep, Episode("e", 1, "train", "i")], tmp_path / "t.parquet")
    back = read_episodes(path)
    assert back[0] == ep
    assert back[1].turns == [] and back[1].rewards == {} and back[1].demo_messages == 0
    assert back[0].total_reward == 1.0


def test_read_episodes_errors(tmp_path):
    with pytest.raises(OmrlError, match="no trajectory file"):
        read_episodes(tmp_path / "missing.parquet")


def test_files_of_the_first_schema_still_read(tmp_path):
    """episode/1 files (before demo_messages existed) read with no worked example."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from omrl.data.trajectory import SCHEMA

    write_episodes([Episode("gridworld", 3, "train", "reach the goal", messages=[{"role": "user", "content": "hi"}])],
                   tmp_path / "new.parquet")
    table = pq.read_table(tmp_path / "new.parquet").drop_columns(["demo_messages"])
    old = table.replace_schema_metadata({b"omrl.schema": b"episode/1"})
    assert old.schema.remove_metadata() != SCHEMA.remove_metadata()
    pq.write_table(old, tmp_path / "old.parquet")
    (episode,) = read_episodes(tmp_path / "old.parquet")
    assert episode.task_id == 3 and episode.demo_messages == 0 and episode.messages[0]["content"] == "hi"
