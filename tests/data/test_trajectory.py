"""Trajectory records survive parquet unchanged; damaged files and non-finite numbers are handled."""

from __future__ import annotations

import json
import re

import pytest

from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.data.trajectory import UnreadableFileError
from omrl.errors import OmrlError
from omrl.rollout.convert import write_jsonl


def test_episode_parquet_round_trip(tmp_path):
    ep = Episode(
        env="gridworld",
        task_id=7,
        split="test",
        instruction="reach the goal",
        turns=[
            Turn("obs", "Act: up", "up", True, 0.0, False, {"won": False, "nested": {"a": [1, 2]}}, (5, 8)),
            Turn("obs2", "junk", None, False, 1.0, True, {"won": True, "score": 1.0}, (12, 14), "no action"),
        ],
        token_ids=list(range(14)),
        loss_mask=[0] * 5 + [1] * 3 + [0] * 4 + [1] * 2,
        logprobs=[0.0] * 5 + [-0.5, -0.25, -0.125] + [0.0] * 4 + [-1.0, -2.0],
        prompt_length=5,
        won=True,
        score=1.0,
        end_reason="done",
        group=2,
        sample=1,
        rewards={"goal": [0.0, 1.0], "total": [0.0, 1.0]},
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Act: up"}],
        demo_messages=2,
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
    import pyarrow.parquet as pq

    from omrl.data.trajectory import SCHEMA

    write_episodes(
        [Episode("gridworld", 3, "train", "reach the goal", messages=[{"role": "user", "content": "hi"}])],
        tmp_path / "new.parquet",
    )
    table = pq.read_table(tmp_path / "new.parquet").drop_columns(["demo_messages"])
    old = table.replace_schema_metadata({b"omrl.schema": b"episode/1"})
    assert old.schema.remove_metadata() != SCHEMA.remove_metadata()
    pq.write_table(old, tmp_path / "old.parquet")
    (episode,) = read_episodes(tmp_path / "old.parquet")
    assert episode.task_id == 3 and episode.demo_messages == 0 and episode.messages[0]["content"] == "hi"


@pytest.mark.parametrize("damage", ["empty", "truncated", "text"])
def test_a_damaged_trajectory_file_is_an_error_naming_it(tmp_path, damage):
    good = write_episodes([Episode("e", 1, "train", "i")], tmp_path / "good.parquet").read_bytes()
    data = {"empty": b"", "truncated": good[: len(good) // 2], "text": b"hello\n" * 100}[damage]
    path = tmp_path / f"{damage}.parquet"
    path.write_bytes(data)
    with pytest.raises(UnreadableFileError, match=re.escape(f"{path}: truncated, damaged or not a parquet file")):
        read_episodes(path)


def _no_constants(name: str):
    raise AssertionError(f"{name} in JSON output")


def test_non_finite_numbers_and_lone_surrogates_are_written_as_strict_json(tmp_path):
    nan, inf = float("nan"), float("inf")
    ep = Episode(
        "e",
        1,
        "train",
        "i",
        score=nan,
        rewards={"total": [nan], "goal": [inf]},
        turns=[Turn("obs", "reply", "go \ud800", True, -inf, True, {"x": inf, "deep": [{"y": nan}]})],
        messages=[{"role": "assistant", "content": "\udcff"}],
    )
    path = write_jsonl([ep], tmp_path / "r.jsonl")
    record = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constants)
    assert record["score"] is None and record["total_reward"] is None
    assert record["rewards"] == {"total": [None], "goal": [None]}
    assert record["turns"][0]["reward"] is None and record["turns"][0]["action"] == "go \ud800"
    assert record["messages"][0]["content"] == "\udcff"  # escaped in the file, the same text read back
    ep.turns[0].action, ep.messages = "go", []
    (turn,) = read_episodes(write_episodes([ep], tmp_path / "t.parquet"))[0].turns
    assert turn.info == {"x": None, "deep": [{"y": None}]}  # info is stored as JSON text in the parquet


def test_a_trajectory_file_records_the_tokenizer_of_its_ids_and_refuses_another(tmp_path, tiny_tokenizer):
    from omrl.data.conversations import load_conversations
    from omrl.data.trajectory import check_tokenizer, recorded_tokenizer, tokenizer_fingerprint
    from omrl.errors import ConfigError

    episode = Episode(env="gridworld", task_id=1, split="train", instruction="go", token_ids=[1, 2, 3])
    episode.messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Act: up"}]
    path = write_episodes([episode], tmp_path / "made.parquet", tiny_tokenizer)
    assert recorded_tokenizer(path) == tokenizer_fingerprint(tiny_tokenizer)
    assert len(load_conversations(str(path))) == 1  # still a trajectory file to every reader
    check_tokenizer(path, tiny_tokenizer, "tiny")  # the same vocabulary: fine

    class Other:  # another vocabulary of the same size
        name_or_path = "other-model"

        def get_vocab(self):
            vocab = tiny_tokenizer.get_vocab()
            first, second = sorted(vocab)[:2]
            return {**vocab, first: vocab[second], second: vocab[first]}

    with pytest.raises(ConfigError, match="made by the tokenizer of .* not by 'other'"):
        check_tokenizer(path, Other(), "other")
    unrecorded = write_episodes([episode], tmp_path / "old.parquet")
    assert recorded_tokenizer(unrecorded) is None
    check_tokenizer(unrecorded, Other(), "other")  # nothing recorded: the ids' own checks decide
