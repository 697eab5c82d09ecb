"""`omrl data convert`'s records: what they carry (and leave out), and files that read back as they were written."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from omrl.chat import conversation_rows
from omrl.data import Episode, write_episodes
from omrl.data.conversations import episode_to_record, load_conversations, record_to_conversation, write_conversations
from omrl.data.trajectory import tokenizer_fingerprint
from omrl.errors import OmrlError
from omrl.rollout.convert import write_jsonl
from omrl.training.packing import IGNORE_INDEX, tokenize_conversations

from .episodes import CHAT, played_episode, seat_episode


def trained_text(tokenizer, conversations) -> str:
    """The text SFT learns from ``conversations``: every label, decoded."""
    rows, _, _ = tokenize_conversations(tokenizer, conversations, 1024)
    return "".join(tokenizer.decode([label for label in row.labels if label != IGNORE_INDEX]) for row in rows)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- token ids stay with the trajectory file (bug 1) -----------------------------------------------------------------


def test_a_trajectory_file_trains_the_ids_its_episodes_were_played_in(tiny_tokenizer, tmp_path):
    sampled = tiny_tokenizer.encode("Act: down<|im_end|>", add_special_tokens=False)
    ep = played_episode(tiny_tokenizer, reply_ids=sampled)
    traj = write_episodes([ep], tmp_path / "t.parquet", tiny_tokenizer)
    assert trained_text(tiny_tokenizer, load_conversations(traj)) == "Act: down<|im_end|>Act: right<|im_end|>"


def test_converted_records_carry_no_token_ids_so_an_edited_reply_trains_its_new_text(tiny_tokenizer, tmp_path):
    traj = write_episodes([played_episode(tiny_tokenizer)], tmp_path / "t.parquet", tiny_tokenizer)
    out = write_conversations(load_conversations(traj), tmp_path / "c.jsonl")
    (record,) = _records(out)
    assert "rows" not in record and "vocab" not in record
    record["conversations"][2]["content"] = "Act: left"  # a user cleans the data
    _jsonl(out, [record])
    assert trained_text(tiny_tokenizer, load_conversations(out)) == "Act: left<|im_end|>Act: right<|im_end|>"


def test_token_ids_in_a_record_written_by_an_older_omrl_are_not_trained(tiny_tokenizer, tmp_path):
    ((ids, mask),) = conversation_rows(tiny_tokenizer, CHAT)
    vocab = tokenizer_fingerprint(tiny_tokenizer)["vocab"]
    path = _jsonl(tmp_path / "old.jsonl", [{"conversations": CHAT, "rows": [[ids, mask[:10]]], "vocab": vocab}])
    assert trained_text(tiny_tokenizer, load_conversations(path)) == "Act: up<|im_end|>Act: right<|im_end|>"


# -- episodes with nothing to learn (bug 5) and seats (bug 10) -------------------------------------------------------


def test_episodes_without_a_reply_are_skipped_and_counted(tmp_path):
    moved = seat_episode("x", "loss", [dict(m) for m in CHAT])
    never_moved = seat_episode("o", "win", [])
    reset_failed = seat_episode("x", "error", [], end_reason="env_error")
    only_prompt = seat_episode("o", "error", [dict(m) for m in CHAT[:2]], end_reason="env_error")
    path = write_episodes([moved, never_moved, reset_failed, only_prompt], tmp_path / "game.parquet")
    with pytest.warns(UserWarning) as said:
        conversations = load_conversations(path)
    assert [c.source for c in conversations] == [f"{path} row 1"]
    warned = [str(w.message) for w in said]
    assert any("game.parquet: skipped 1 of 4 episodes that hold no reply to learn from" in w for w in warned)
    assert any("game.parquet: skipped 2 of 4 episodes that ended env_error" in w for w in warned)


def test_an_episode_the_world_failed_is_not_learned_as_a_reward_of_0(tmp_path):
    """A judge that failed on an episode left it env_error with reward 0: data convert wrote it as a plain
    record of reward 0, which --min-reward 0 kept and data show averaged in."""
    scored = seat_episode("x", "win", [dict(m) for m in CHAT])
    judged_nothing = seat_episode("x", "error", [dict(m) for m in CHAT], end_reason="env_error")
    path = write_episodes([scored, judged_nothing], tmp_path / "judged.parquet")
    with pytest.warns(UserWarning, match=r"skipped 1 of 2 episodes that ended env_error .* not learned from"):
        conversations = load_conversations(path)
    assert [c.source for c in conversations] == [f"{path} row 1"]


def test_seat_episodes_keep_their_seat_and_outcome_under_ids_that_differ():
    records = [episode_to_record(seat_episode(seat, outcome, CHAT)) for seat, outcome in (("x", "loss"), ("o", "win"))]
    assert [r["id"] for r in records] == ["tictactoe-train-3-0-x", "tictactoe-train-3-0-o"]
    assert [(r["seat"], r["outcome"]) for r in records] == [("x", "loss"), ("o", "win")]


def test_an_episode_of_one_agent_has_no_seat(tiny_tokenizer):
    record = episode_to_record(played_episode(tiny_tokenizer))
    assert record["id"] == "gridworld-train-0-0" and "seat" not in record and "outcome" not in record


# -- ShareGPT cannot carry tool calls, reasoning or tool names (bug 7) ------------------------------------------------

CALL = {"type": "function", "function": {"name": "look", "arguments": {"where": "north"}}}
USER = {"role": "user", "content": "Look around."}
REPLY = {"role": "assistant", "content": "Done."}
TOOL_REPLY = {"role": "assistant", "content": "", "tool_calls": [CALL]}
TOOL_RESULT = {"role": "tool", "name": "look", "content": "a tree"}


@pytest.mark.parametrize(
    "messages, carried",
    [
        ([USER, TOOL_REPLY, {"role": "tool", "content": "a tree"}, REPLY], "message 1's tool_calls"),
        ([USER, {**REPLY, "reasoning_content": "Easy."}], "message 1's reasoning_content"),
        ([USER, {**REPLY, "thinking": "Easy."}], "message 1's thinking"),
        ([USER, REPLY, TOOL_RESULT, REPLY], "message 2's name"),
    ],
)
def test_sharegpt_refuses_a_conversation_holding_what_it_cannot_carry(tmp_path, messages, carried):
    conv = record_to_conversation({"id": "r7", "conversations": messages}, "in.jsonl row 7")
    with pytest.raises(OmrlError) as info:
        write_conversations([conv], tmp_path / "out.jsonl", style="sharegpt")
    assert str(info.value) == (
        f"in.jsonl row 7 (id 'r7'): ShareGPT records cannot carry {carried}; "
        "write the default style (--style openmanus), which keeps it"
    )
    assert not (tmp_path / "out.jsonl").exists()


# -- parquet files read back as written (bug 8) and a rollout's readable JSONL's reward (bug 12) -----------------

LOOK = {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}
GO = {"type": "function", "function": {"name": "go", "description": "Walk.", "parameters": {"type": "object"}}}
MIXED = [
    {
        "id": "a",
        "conversations": [USER, TOOL_REPLY, TOOL_RESULT, REPLY],
        "reward": 1.0,
        "chat_kwargs": {"tools": [LOOK]},
    },
    {
        "id": "b",
        "conversations": [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "go", "arguments": '{"n": 2}'}}]},
            {"role": "tool", "name": "go", "content": "moved", "tool_call_id": "call_1"},
            REPLY,
        ],
        "chat_kwargs": {"tools": [GO], "enable_thinking": False},
        "tags": ["b", 2],
    },
    {"id": "c", "conversations": [USER, {**REPLY, "reasoning_content": "Easy."}], "won": None},
]


def test_records_written_to_parquet_read_back_exactly(tmp_path):
    source = _jsonl(tmp_path / "mixed.jsonl", MIXED)
    parquet = write_conversations(load_conversations(source), tmp_path / "mixed.parquet")
    back = write_conversations(load_conversations(parquet), tmp_path / "back.jsonl")
    assert _records(back) == MIXED
    assert pq.read_table(parquet).to_pylist()[2]["conversations"][1]["reasoning_content"] == "Easy."  # still readable


@pytest.mark.parametrize("tools", [[LOOK], json.dumps([LOOK])])
def test_a_records_top_level_tools_are_what_its_template_renders_it_with(tools):
    """OpenAI's fine-tuning format gives the tools beside the messages: SFT trained the calls without them."""
    record = {"messages": [USER, TOOL_REPLY, TOOL_RESULT, REPLY], "tools": tools, "chat_kwargs": {"x": 1}}
    conv = record_to_conversation(record, "in.jsonl row 1")
    assert conv.meta["chat_kwargs"] == {"x": 1, "tools": [LOOK]} and "tools" not in conv.meta
    with pytest.raises(OmrlError, match="row 2: 'tools' and chat_kwargs 'tools' differ; give the tools once"):
        record_to_conversation({**record, "chat_kwargs": {"tools": [GO]}}, "in.jsonl row 2")
    with pytest.raises(OmrlError, match=r"row 3: 'tools' must be a list of tool schemas \(or its JSON text\)"):
        record_to_conversation({**record, "tools": "[not json"}, "in.jsonl row 3")


def test_a_reward_in_some_records_only_reads_back_from_parquet(tmp_path):
    source = _jsonl(tmp_path / "mixed.jsonl", MIXED)
    parquet = write_conversations(load_conversations(source), tmp_path / "mixed.parquet")
    assert [c.id for c in load_conversations(parquet)] == ["a", "b", "c"]
    with pytest.raises(OmrlError, match=r"mixed.parquet row 2: min_reward=0.5 needs a numeric 'reward'"):
        load_conversations(parquet, min_reward=0.5)


def test_min_reward_reads_the_total_reward_of_a_rollouts_readable_jsonl(tmp_path):
    episodes = [seat_episode("x", "win", CHAT), seat_episode("o", "loss", CHAT)]
    path = write_jsonl([Episode(**{**vars(ep), "info": {}}) for ep in episodes], tmp_path / "grid.jsonl")
    assert [c.meta["won"] for c in load_conversations(path, min_reward=0.5)] == [True]


def test_no_records_make_a_parquet_file_of_none(tmp_path):
    assert load_conversations(write_conversations([], tmp_path / "none.parquet")) == []
