"""A record SFT cannot use is a one-line DatasetFormatError naming the file, the row and what would be valid
(`omrl data show` and `omrl sft` exit 2), never a traceback from deep inside the chat template."""

from __future__ import annotations

import json

import pytest

from omrl.cli import main
from omrl.data.conversations import DatasetFormatError, load_conversations

USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}
RESULT = {"role": "tool", "content": "r"}


def _call(call):
    return {"role": "assistant", "content": "", "tool_calls": [call]}


# record -> what the error says after "row 1"
ODD = {
    "assistant_first": (
        {"conversations": [REPLY, USER, REPLY]},
        ": message 0 has role 'assistant'; a conversation opens with a system or user message",
    ),
    "role_list": (
        {"conversations": [{"role": ["user"], "content": "x"}, REPLY]},
        " message 0: unknown role ['user']; valid: system, user, assistant, tool, human, gpt",
    ),
    "chat_kwargs_text": (
        {"conversations": [USER, REPLY], "chat_kwargs": "x"},
        ": 'chat_kwargs' must be an object of chat template options (e.g. {'tools': [...]}), got 'x'",
    ),
    "tools_number": (
        {"conversations": [USER, REPLY], "chat_kwargs": {"tools": 5}},
        ": chat_kwargs 'tools' must be a list of tool schemas (objects), got 5",
    ),
    "call_without_name": (
        {"conversations": [USER, _call({"x": 1}), RESULT, REPLY]},
        " message 1: tool call 0 has no function name; expected {'function': {'name': ..., 'arguments': ...}}",
    ),
    "both_message_keys": (
        {"conversations": [USER, REPLY], "messages": [USER, {"role": "assistant", "content": "other"}]},
        ": has both 'conversations' and 'messages'; give the messages once",
    ),
    "call_arguments_number": (
        {"conversations": [USER, _call({"function": {"name": "f", "arguments": 5}}), RESULT, REPLY]},
        " message 1: tool call 0's arguments must be an object or its JSON text, got 5",
    ),
}


def test_a_parquet_of_both_message_keys_reads_each_rows_own(tmp_path):
    """A row whose 'conversations' is null (its messages under 'messages') was refused as an empty list."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"conversations": [USER, REPLY], "messages": None}, {"conversations": None, "messages": [USER, REPLY]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "both.parquet")
    assert [len(c.messages) for c in load_conversations(tmp_path / "both.parquet")] == [2, 2]


def _write(tmp_path, name):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(ODD[name][0]) + "\n")
    return path


@pytest.mark.parametrize("name", ODD)
def test_an_unusable_record_is_a_format_error_naming_its_row(tmp_path, name):
    path = _write(tmp_path, name)
    with pytest.raises(DatasetFormatError) as info:
        load_conversations(path)
    assert str(info.value) == f"{path} row 1{ODD[name][1]}"


def test_a_tool_call_in_the_plain_form_is_valid(tmp_path):
    call = {"name": "f", "arguments": {"a": 1}}  # no "function" wrapper: templates read both
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"conversations": [USER, _call(call), RESULT, REPLY]}) + "\n")
    assert load_conversations(path)[0].messages[1]["tool_calls"] == [call]


@pytest.mark.parametrize("name", ["assistant_first", "role_list", "chat_kwargs_text", "tools_number"])
def test_omrl_data_show_exits_2_for_an_unusable_record(tmp_path, capsys, name):
    path = _write(tmp_path, name)
    with pytest.raises(SystemExit) as info:
        main(["data", "show", str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"error: {path} row 1" in err.replace("\n", "") and "Traceback" not in err


def test_omrl_sft_exits_2_for_a_conversation_opened_by_the_assistant(tiny_model_dir, tmp_path, capsys):
    path = _write(tmp_path, "assistant_first")
    with pytest.raises(SystemExit) as info:
        main(["sft", f"model.name={tiny_model_dir}", "--dataset", str(path), "--output-dir", str(tmp_path / "o")])
    assert info.value.code == 2 and "message 0 has role 'assistant'" in capsys.readouterr().err.replace("\n", "")


def test_an_assistant_message_with_nothing_in_it_is_warned_of(tmp_path):
    """A reply lost when the data was written trained the model to end its turn at once, silently."""
    path = tmp_path / "chats.jsonl"
    rows = [
        {"conversations": [USER, REPLY]},
        {"conversations": [USER, {"role": "assistant", "content": "  "}, USER, REPLY]},
        {"conversations": [USER, _call({"function": {"name": "f", "arguments": {}}}), RESULT, REPLY]},  # a call: fine
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(
        UserWarning,
        match=r"1 assistant message\(s\) in .*chats.jsonl hold no text and no tool call \(the first: .* row 2, message 1\)",
    ):
        assert len(load_conversations(path)) == 3
