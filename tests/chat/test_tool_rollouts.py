"""A rollout of the ``tool_call`` action template on real chat templates trl ships: the model is told to write
``<tool_call>`` JSON; where its own template writes calls in that format the call is recorded as a structured
call answered by a ``tool`` message, elsewhere (gpt-oss's channels) as text answered by a user message. Either
way each history mode lays the episode out token-exactly, and SFT on the episode's chat trains its rows."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.data import write_episodes
from omrl.data.conversations import load_conversations
from omrl.rollout import RolloutLimits
from omrl.training.packing import tokenize_conversations
from tests.fakes import KeyEnv, ScriptedBackend
from tests.helpers import play_keys

from .families import family_tokenizer


def play(name: str, history: str):
    tokenizer = family_tokenizer(name)
    template = registry.templates.get("tool_call")()
    env = KeyEnv()
    backend = ScriptedBackend(
        tokenizer, lambda call, index, prompt: template.format_action(["open", "take key"][call], env)
    )
    [episode] = play_keys(
        tokenizer,
        backend,
        template=template,
        limits=RolloutLimits(max_new_tokens=64, max_context=4096, history=history),
    )
    return tokenizer, episode


def rows(episode):
    bounds = [*episode.row_starts, len(episode.token_ids)] if episode.row_starts else [len(episode.token_ids)]
    starts = [0, *episode.row_starts]
    return [(episode.token_ids[a:b], episode.loss_mask[a:b]) for a, b in zip(starts, bounds)]


@pytest.mark.parametrize("history", ["keep", "as_template"])
@pytest.mark.parametrize("name", ["qwen2_5", "qwen3", "gptoss", "llama3_1", "glm4moe", "cohere2", "phi3"])
def test_a_tool_call_episode_plays_and_sft_on_its_file_trains_the_ids_sampled(name, history, tmp_path):
    tokenizer, episode = play(name, history)
    assert episode.end_reason == "done" and episode.won, (episode.end_reason, episode.error)
    assert [t.action for t in episode.turns] == ["open", "take key"]
    roles = [m["role"] for m in episode.messages]
    structured = any(m.get("tool_calls") for m in episode.messages)
    assert ("tool" in roles) == structured  # a structured call is answered by a tool message, a text one by a user
    sampled = [t for t, m in zip(episode.token_ids, episode.loss_mask) if m]
    assert sampled == [t for turn in episode.turns for t in episode.token_ids[slice(*turn.span)]]
    write_episodes([episode], tmp_path / "rollout.parquet", tokenizer)
    got, dropped, _ = tokenize_conversations(tokenizer, load_conversations(tmp_path / "rollout.parquet"), 4096)
    assert dropped == 0 and [row.input_ids for row in got] == [ids for ids, _ in rows(episode)]


def test_gpt_oss_keeps_a_call_written_in_another_format_as_text():
    _, episode = play("gptoss", "keep")
    assert not any(m.get("tool_calls") for m in episode.messages)
    assert "<tool_call>" in episode.messages[2]["content"] and episode.messages[3]["role"] == "user"


def test_a_call_in_the_templates_own_format_is_structured():
    _, episode = play("qwen2_5", "keep")
    assert episode.messages[2]["tool_calls"][0]["function"]["name"] == "act" and episode.messages[3]["role"] == "tool"
