"""Loading SFT conversations from every supported format, and writing them back."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omrl.data import Episode, Turn, write_episodes
from omrl.data.conversations import DatasetFormatError, episode_to_record, load_conversations, write_conversations

from .sample_data import agent_records

SHAREGPT = {
    "id": "sg1",
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello."},
    ],
}
EXPECTED_SHAREGPT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _save_to_disk(directory, records):
    """What ``datasets.Dataset.save_to_disk`` writes: state.json, dataset_info.json, arrow stream files."""
    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(records)
    halves = [table.slice(0, len(records) // 2), table.slice(len(records) // 2)]
    names = [f"data-0000{i}-of-00002.arrow" for i in range(2)]
    for name, part in zip(names, halves):
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(part)
    (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (directory / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": n} for n in names], "_fingerprint": "abc", "_split": "train"})
    )
    return directory


def test_openmanus_jsonl_loads(tmp_path):
    path = _write_jsonl(tmp_path / "a.jsonl", agent_records(3))
    convs = load_conversations(path)
    assert [c.id for c in convs] == ["os_0", "os_1", "os_2"]
    assert convs[0].messages == agent_records(1)[0]["conversations"]
    assert convs[2].source == f"{path} row 3"


def test_sharegpt_json_list_and_parquet_load(tmp_path):
    json_path = tmp_path / "sg.json"
    json_path.write_text(json.dumps([SHAREGPT, SHAREGPT]))
    parquet_path = tmp_path / "sg.parquet"
    pq.write_table(pa.Table.from_pylist([SHAREGPT]), parquet_path)
    assert [c.messages for c in load_conversations(json_path)] == [EXPECTED_SHAREGPT] * 2
    assert load_conversations(parquet_path)[0].messages == EXPECTED_SHAREGPT


def test_save_to_disk_directory_loads_with_pyarrow_only(tmp_path):
    records = agent_records(5)
    directory = _save_to_disk(tmp_path / "ds", records)
    convs = load_conversations(directory)
    assert [c.id for c in convs] == [r["id"] for r in records]
    assert convs[4].messages == records[4]["conversations"]


def test_dataset_dict_directory_uses_train_split(tmp_path):
    root = tmp_path / "dd"
    _save_to_disk(root / "train", agent_records(2))
    _save_to_disk(root / "test", agent_records(1))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert len(load_conversations(root)) == 2
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    with pytest.raises(DatasetFormatError, match="without a 'train' split"):
        load_conversations(root)


def test_directory_of_files_loads_all_in_name_order(tmp_path):
    _write_jsonl(tmp_path / "b.jsonl", agent_records(2))
    pq.write_table(pa.Table.from_pylist([SHAREGPT]), tmp_path / "a.parquet")
    convs = load_conversations(tmp_path)
    assert [c.id for c in convs] == ["sg1", "os_0", "os_1"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ({"id": "x"}, "row 2: has no 'conversations' or 'messages' key"),
        ({"conversations": [{"role": "robot", "content": "hi"}]}, "row 2 message 0: unknown role 'robot'"),
        ({"conversations": [{"role": "user", "content": 3}]}, "content must be text"),
        ({"conversations": [{"text": "hi"}]}, "is not a message"),
        ({"conversations": [{"role": "user", "content": "hi"}]}, "has no assistant"),
        ({"conversations": []}, "non-empty list"),
        ([1, 2], "row 2: is a list"),
    ],
)
def test_wrong_rows_fail_with_file_and_row(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(agent_records(1)[0]) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(DatasetFormatError) as info:
        load_conversations(path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_a_row_cut_short_is_named_where_it_stops(tmp_path):
    """A truncated row was said to be wrong "at column 1": of the next line, past its newline."""
    path = tmp_path / "cut.jsonl"
    path.write_text('{"messages": [ \n')
    with pytest.raises(DatasetFormatError, match=r"cut.jsonl row 1: not valid JSON \(Expecting value at column 16\)"):
        load_conversations(path)


def test_invalid_json_line_and_unknown_file_type_fail(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(agent_records(1)[0]) + "\n\n{not json\n")
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl row 3: not valid JSON"):
        load_conversations(path)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DatasetFormatError, match="unsupported file type '.csv'"):
        load_conversations(tmp_path / "data.csv")
    with pytest.raises(DatasetFormatError, match="does not exist"):
        load_conversations(tmp_path / "missing.jsonl")


def _episode(task_id: int, reward: float) -> Episode:
    messages = [
        {"role": "system", "content": "Shop."},
        {"role": "user", "content": f"Buy item {task_id}"},
        {"role": "assistant", "content": "Action: search[item]"},
        {"role": "user", "content": "Results"},
        {"role": "assistant", "content": "Action: click[buy]"},
    ]
    turns = [
        Turn("Buy", "Action: search[item]", "search[item]", True, 0.0, False),
        Turn("Results", "Action: click[buy]", "click[buy]", True, reward, True),
    ]
    return Episode(
        env="webshop",
        task_id=task_id,
        split="train",
        instruction=f"Buy item {task_id}",
        turns=turns,
        won=reward > 0.5,
        score=reward,
        rewards={"total": [0.0, reward]},
        messages=messages,
    )


def test_rollout_parquet_filtered_by_min_reward(tmp_path):
    path = write_episodes([_episode(0, 1.0), _episode(1, 0.2), _episode(2, 0.7)], tmp_path / "traj.parquet")
    assert [c.meta["task_id"] for c in load_conversations(path)] == [0, 1, 2]
    kept = load_conversations(path, min_reward=0.5)
    assert [c.meta["task_id"] for c in kept] == [0, 2]
    assert kept[0].messages == _episode(0, 1.0).messages and kept[0].source == f"{path} row 1"


def test_min_reward_on_records_without_reward_fails(tmp_path):
    path = _write_jsonl(tmp_path / "a.jsonl", agent_records(1))
    with pytest.raises(DatasetFormatError, match="row 1: min_reward=0.5 needs a numeric 'reward'"):
        load_conversations(path, min_reward=0.5)


def test_episodes_to_conversations_round_trip(tmp_path):
    episodes = [_episode(0, 1.0), _episode(1, 0.0)]
    traj = write_episodes(episodes, tmp_path / "traj.parquet")
    out = write_conversations(load_conversations(traj), tmp_path / "shared" / "convs.jsonl")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0] == episode_to_record(episodes[0])
    assert records[0]["conversations"][2] == {"role": "assistant", "content": "Action: search[item]"}
    back = load_conversations(out, min_reward=0.5)  # the reward travels with the records
    assert [c.messages for c in back] == [episodes[0].messages]
    assert not list((tmp_path / "shared").glob(".*tmp*"))  # written through a temp file, nothing left over


def test_sharegpt_output_reads_back_identically(tmp_path):
    convs = load_conversations(_write_jsonl(tmp_path / "a.jsonl", agent_records(2)))
    out = write_conversations(convs, tmp_path / "sg.parquet", style="sharegpt")
    row = pq.read_table(out).to_pylist()[0]
    assert row["conversations"][1] == {"from": "human", "value": "Count files in /etc/dir0"}
    assert [c.messages for c in load_conversations(out)] == [c.messages for c in convs]
