"""Records in shapes other tools write: a .json holding one pretty-printed object, a parquet whose messages mix
role/content and from/value (pyarrow gives every message all four fields, null where absent), and rows
without a score (a null reward)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omrl.cli import main
from omrl.data.conversations import DatasetFormatError, load_conversations, reward_of, reward_summary

USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "yo"}
RECORD = {"conversations": [USER, REPLY]}
VALID = "valid: a JSON list of records, or JSON lines (one record per line)"


# file holds (pretty-printed) -> what the error says of it beside "holds one JSON object"
ONE_OBJECT = {
    "record": (RECORD, "it has 'conversations', so it is one record, it seems"),
    "wrapped": ({"data": [RECORD, RECORD]}, "its one key 'data' holds a list of 2 objects, the records it seems"),
    "other": ({"version": 1, "rows": 2}, "keys: version, rows"),
}


@pytest.mark.parametrize("name", ONE_OBJECT)
def test_a_json_file_of_one_pretty_printed_object_says_what_it_holds_and_what_is_valid(tmp_path, name):
    value, said = ONE_OBJECT[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(value, indent=2) + "\n")
    with pytest.raises(DatasetFormatError) as info:
        load_conversations(path)
    message = str(info.value)
    assert message.startswith(f"{path}: holds one JSON object") and said in message and VALID in message
    assert "not valid JSON" not in message and "\n" not in message


def test_pretty_printed_objects_one_after_another_are_not_json_lines(tmp_path):
    path = tmp_path / "many.json"
    path.write_text(json.dumps(RECORD, indent=2) + "\n" + json.dumps(RECORD, indent=2) + "\n")
    with pytest.raises(
        DatasetFormatError, match=f"many.json: holds JSON objects over several lines each.*{re.escape(VALID)}"
    ):
        load_conversations(path)


def test_json_lines_in_a_json_file_still_load(tmp_path):
    many, one = tmp_path / "many.json", tmp_path / "one.json"
    many.write_text("".join(json.dumps({**RECORD, "id": str(n)}) + "\n" for n in range(3)))
    one.write_text(json.dumps(RECORD))  # one record on one line, no newline: JSON lines too
    assert [c.id for c in load_conversations(many)] == ["0", "1", "2"]
    assert load_conversations(one)[0].messages == [USER, REPLY]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(RECORD) + "\n{oops\n")
    with pytest.raises(DatasetFormatError, match="broken.json row 2: not valid JSON"):
        load_conversations(broken)


def test_a_parquet_mixing_role_content_and_from_value_messages_loads(tmp_path):
    path = tmp_path / "mixed.parquet"
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    table = pa.Table.from_pylist([RECORD, sharegpt])
    assert table.to_pylist()[1]["conversations"][0]["role"] is None  # every message has all four fields
    pq.write_table(table, path)
    got = [c.messages for c in load_conversations(path)]
    assert got == [[USER, REPLY], [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]


def test_a_message_whose_role_and_from_are_null_says_its_role_is_missing(tmp_path):
    path = tmp_path / "nulls.parquet"
    nameless = {"role": None, "content": "x", "from": None, "value": None}
    pq.write_table(pa.Table.from_pylist([{"conversations": [nameless, {**REPLY, "from": None, "value": None}]}]), path)
    with pytest.raises(DatasetFormatError) as info:
        load_conversations(path)
    message = str(info.value)
    assert f"{path} row 1 message 0: its role is missing ('role' and 'from' are null or absent)" in message
    assert "unknown role None" not in message


def _scored(tmp_path, rewards: list) -> str:
    path = tmp_path / "scored.jsonl"
    path.write_text("".join(json.dumps({**RECORD, "id": str(n), "reward": r}) + "\n" for n, r in enumerate(rewards)))
    return path


def test_a_null_reward_is_no_reward(tmp_path):
    conversations = load_conversations(_scored(tmp_path, [1.0, None, 0.5]))
    assert [reward_of(c) for c in conversations] == [1.0, None, 0.5]
    assert reward_of(load_conversations(tmp_path / "scored.jsonl")[1]) is None
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({**RECORD, "reward": "1.0"}) + "\n")
    with pytest.raises(DatasetFormatError, match=r"text.jsonl row 1: 'reward' must be a finite number, got '1.0'"):
        load_conversations(text)


def test_a_null_reward_total_reward_beside_it_is_the_reward(tmp_path):
    path = tmp_path / "both.jsonl"
    path.write_text(json.dumps({**RECORD, "reward": None, "total_reward": 2.0}) + "\n")
    assert reward_of(load_conversations(path)[0]) == 2.0


def test_min_reward_refuses_a_row_with_a_null_reward_as_one_without_a_reward(tmp_path):
    path = _scored(tmp_path, [1.0, None])
    with pytest.raises(DatasetFormatError, match="scored.jsonl row 2: min_reward=0.5 needs a numeric 'reward'"):
        load_conversations(path, min_reward=0.5)


def test_the_mean_reward_says_how_many_rows_it_covers_when_not_all_are_scored(tmp_path, capsys):
    some = load_conversations(_scored(tmp_path, [1.0, None, 0.5]))
    assert reward_summary(some) == "3 conversations, mean reward 0.750 (2 of 3 scored)"
    assert reward_summary(some[:1]) == "1 conversations, mean reward 1.000"
    assert reward_summary(some[1:2]) == "1 conversations"
    with pytest.raises(SystemExit) as info:
        main(["data", "show", str(tmp_path / "scored.jsonl"), "--rows", "0"])
    assert info.value.code == 0 and "3 conversations, mean reward 0.750 (2 of 3 scored)" in capsys.readouterr().out
