"""`omrl data convert` never writes over what it reads, and says what it left out."""

from __future__ import annotations

import json

import pytest

from omrl.data import write_episodes
from tests.data.episodes import CHAT, seat_episode

RECORD = json.dumps({"conversations": CHAT}) + "\n"


@pytest.fixture
def source(tmp_path):
    """A folder of two record files."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text(RECORD)
    return folder


@pytest.mark.parametrize("target", ["a.jsonl", "new.jsonl", "sub/new.parquet"])
def test_convert_refuses_a_target_inside_the_source_folder(omrl_main, source, target):
    code, _, err = omrl_main("data", "convert", str(source), str(source / target))
    assert code == 2 and f"error: the target {source / target} is inside the source {source}" in err.replace("\n", "")
    assert (source / "a.jsonl").read_text() == RECORD and sorted(p.name for p in source.iterdir()) == [
        "a.jsonl",
        "b.jsonl",
    ]


def test_convert_refuses_a_target_the_source_folder_links_to(omrl_main, source, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(RECORD)
    (source / "c.jsonl").symlink_to(outside)
    code, _, err = omrl_main("data", "convert", str(source), str(outside))
    assert code == 2 and f"error: the target {outside} is" in err and outside.read_text() == RECORD


def test_convert_into_another_folder_reads_every_file(omrl_main, source, tmp_path):
    code, out, _ = omrl_main("data", "convert", str(source), str(tmp_path / "all.jsonl"))
    assert code == 0 and "wrote 2 conversations" in out


def test_convert_says_how_many_episodes_it_skipped(omrl_main, tmp_path):
    episodes = [seat_episode("x", "loss", CHAT), seat_episode("o", "win", [])]
    path = write_episodes(episodes, tmp_path / "game.parquet")
    code, out, err = omrl_main("data", "convert", str(path), str(tmp_path / "game.jsonl"))
    assert code == 0 and "wrote 1 conversations" in out
    assert "warning: " in err and "skipped 1 of 2 episodes that hold no reply to learn from" in err


def test_show_prints_tool_calls_reasoning_and_what_a_result_answers(omrl_main, tmp_path):
    """A reply that is a tool call printed as 'assistant: ' and nothing else."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 0, "b": 1}'}}
    messages = [
        {"role": "user", "content": "What is 0+1?"},
        {"role": "assistant", "content": None, "reasoning_content": "Add them.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "1"},
        {"role": "assistant", "content": "The answer is 1"},
    ]
    (tmp_path / "tools.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    code, out, _ = omrl_main("data", "show", str(tmp_path / "tools.jsonl"))
    said = " ".join(out.split())
    assert code == 0 and 'assistant: (reasoning) Add them. (tool call) add({"a": 0, "b": 1})' in said
    assert "tool: (name=add, tool_call_id=c1) 1" in said
