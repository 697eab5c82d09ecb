"""Damaged dataset files (not UTF-8, truncated, empty, binary) are one-line errors naming the file, not crashes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omrl.cli import main
from omrl.data.conversations import Conversation, DatasetFormatError, load_conversations, write_conversations
from omrl.errors import OmrlError

RECORD = {
    "conversations": [
        {"role": "user", "content": "Buy a café table."},
        {"role": "assistant", "content": "search[café table]"},
    ]
}
LINE = json.dumps(RECORD, ensure_ascii=False) + "\n"
LATIN1 = LINE.encode("utf-8") + LINE.encode("latin-1")  # a good line, then one in latin-1
BINARY = bytes(range(256)) * 4
NOT_PARQUET = "truncated, damaged or not a parquet file"
NOT_ARROW = "truncated, damaged or not an Arrow IPC stream or file"


def _parquet_bytes(tmp_path) -> bytes:
    pq.write_table(pa.Table.from_pylist([RECORD] * 20), tmp_path / "good.parquet")
    return (tmp_path / "good.parquet").read_bytes()


LATIN1_AT = len(LINE.encode()) + LINE.encode("latin-1").index(0xE9)  # the first byte that is not UTF-8

# file name -> (its bytes, given a good parquet file's bytes; what the error says)
DAMAGED = {
    "latin1.jsonl": (lambda good: LATIN1, f"not UTF-8 at byte {LATIN1_AT} (line 2: 0xe9)"),
    "latin1.json": (
        lambda good: b"[" + LINE.encode("latin-1") + b"]",
        f"not UTF-8 at byte {1 + LINE.encode('latin-1').index(0xE9)} (line 1: 0xe9)",
    ),
    "binary.jsonl": (lambda good: BINARY, "row 1: not valid JSON"),  # its first line is ASCII
    "binary.json": (lambda good: BINARY, "not UTF-8 at byte 128"),
    "empty.json": (lambda good: b"", "the file is empty"),
    "deep.jsonl": (lambda good: b"[" * 100_000, "JSON nested too deeply to read"),
    "huge_number.jsonl": (lambda good: b"1" * 5000, "unreadable JSON (Exceeds the limit (4300 digits)"),
    "truncated.parquet": (lambda good: good[: len(good) // 2], f"{NOT_PARQUET} (Parquet magic bytes not found"),
    "empty.parquet": (lambda good: b"", f"{NOT_PARQUET} (Parquet file size is 0 bytes)"),
    "binary.parquet": (lambda good: BINARY, NOT_PARQUET),
    "text.parquet": (lambda good: LINE.encode() * 50, NOT_PARQUET),
    "bad_text.parquet": (lambda good: good.replace("é".encode(), b"\xff\xa9"), "Invalid UTF8 sequence"),
    "binary.arrow": (lambda good: BINARY, NOT_ARROW),
    "empty.arrow": (lambda good: b"", NOT_ARROW),
}


def damaged(tmp_path, name: str):
    make, expected = DAMAGED[name]
    path = tmp_path / name
    path.write_bytes(make(_parquet_bytes(tmp_path)))
    return path, expected


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_file_is_an_omrl_error_naming_it_and_the_damage(tmp_path, name):
    path, expected = damaged(tmp_path, name)
    with pytest.raises(OmrlError) as info:
        load_conversations(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + LINE.encode())
    assert load_conversations(path)[0].messages[1]["content"] == "search[café table]"
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + LINE.encode())  # JSON lines in a .json file
    assert len(load_conversations(path)) == 1


@pytest.mark.parametrize(
    "state, expected",
    [
        (b"\xff{}", "state.json: not UTF-8 at byte 0"),
        (b"{oops", "state.json: not valid JSON"),
        (b"[]", "state.json: must hold a JSON object, got a list"),
        (b'{"_data_files": [3]}', "'_data_files' must be a list of {'filename': ...}"),
    ],
)
def test_a_broken_save_to_disk_directory_is_an_error_naming_its_state_file(tmp_path, state, expected):
    (tmp_path / "state.json").write_bytes(state)
    with pytest.raises(DatasetFormatError, match=expected.replace("[", r"\[").replace("{", r"\{")):
        load_conversations(tmp_path)


def test_a_folders_json_files_are_named_as_left_out(tmp_path):
    """A folder of .jsonl files and a .json array read the .jsonl alone, and said nothing of the rest."""
    (tmp_path / "a.jsonl").write_text(json.dumps(RECORD) + "\n")
    (tmp_path / "more.json").write_text(json.dumps([RECORD, RECORD]))
    with pytest.warns(
        UserWarning, match=r"left out 1 .json file\(s\) \(more.json\).*name a .json file of records itself"
    ):
        assert len(load_conversations(tmp_path)) == 1
    assert len(load_conversations(tmp_path / "more.json")) == 2


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), pytest.param(10**400, id="10**400")])
def test_a_non_finite_reward_is_a_format_error(tmp_path, reward):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({**RECORD, "reward": reward}) + "\n")
    with pytest.raises(DatasetFormatError, match=r"row 1: 'reward' must be a finite number, got (nan|inf|1000)"):
        load_conversations(path)


def test_written_conversations_are_strict_json(tmp_path):
    conv = Conversation(RECORD["conversations"], "x", "a", {"score": float("nan"), "reward": 1.0, "won": None})
    path = write_conversations([conv], tmp_path / "out.jsonl")
    assert "NaN" not in path.read_text() and json.loads(path.read_text())["score"] is None
    assert load_conversations(path)[0].meta == {"score": None, "reward": 1.0, "won": None}


@pytest.mark.parametrize("name", ["latin1.jsonl", "truncated.parquet", "binary.arrow"])
def test_omrl_data_show_exits_2_with_one_line_for_a_damaged_file(tmp_path, capsys, name):
    path, expected = damaged(tmp_path, name)
    with pytest.raises(SystemExit) as info:
        main(["data", "show", str(path)])
    err = capsys.readouterr().err.replace("\n", "")
    assert info.value.code == 2 and f"error: {path}: " in err and expected in err
    assert "bug in omrl" not in err


@pytest.mark.parametrize("name", ["latin1.jsonl", "empty.parquet"])
def test_omrl_sft_exits_2_naming_a_damaged_dataset(tiny_model_dir, tmp_path, capsys, name):
    path, expected = damaged(tmp_path, name)
    with pytest.raises(SystemExit) as info:
        main(["sft", f"model.name={tiny_model_dir}", "--dataset", str(path), "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.replace("\n", "")
    assert info.value.code == 2 and f"error: {path}: " in err and expected in err


def test_atomic_writes_get_the_mode_a_plain_open_would_give(tmp_path):
    import os
    import stat

    from omrl.atomic import atomic_write_bytes, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.json", "{}")
        atomic_write_bytes(tmp_path / "plot.png", b"\x89PNG")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"report.json": 0o644, "plot.png": 0o644, "plain.txt": 0o644}  # not mkstemp's private 0600
    assert (tmp_path / "plot.png").read_bytes() == b"\x89PNG" and not list(tmp_path.glob(".*.tmp"))
