"""The gateway returns a thinking model's reasoning apart from its answer, as vLLM's reasoning parsers do, on
the real templates trl ships (each on the tiny tokenizer with its family's tokens)."""

from __future__ import annotations

import pytest

from omrl.backends.base import Generation
from omrl.chat import encode_chat, prompt_ids, reply_text
from omrl.chat.replies import reply_shape
from omrl.data.trajectory import Episode
from omrl.gateway.protocol import ChatRequest, completion
from omrl.gateway.recorder import EpisodeRecorder
from omrl.gateway.server import tool_layout
from tests.chat.families import family_tokenizer

CHAT = [{"role": "user", "content": "Find the key."}]


@pytest.mark.parametrize("name", ["qwen3", "gptoss", "deepseek_r1_distill", "gemma4_v5", "glm4moe"])
def test_reasoning_comes_back_as_reasoning_content_and_the_answer_as_content(name):
    tokenizer = family_tokenizer(name)
    field = reply_shape(tokenizer, {}).field
    reply = {"role": "assistant", "content": "open drawer 1", field: "It may be in drawer 1."}
    sampled = encode_chat(tokenizer, reply_text(tokenizer, CHAT, reply))
    recorder = EpisodeRecorder(
        Episode(env="agent", task_id=0, split="test", instruction=""), tokenizer, "keep", 4096, tool_layout(tokenizer)
    )
    recorder.prompt(CHAT, [])
    answer = recorder.record(Generation(sampled, [0.0] * len(sampled), "stop"), [], cap_by="max_tokens")
    assert answer.content.strip() == "open drawer 1"
    assert answer.reasoning.strip() == "It may be in drawer 1."
    turn = recorder.episode.turns[-1]  # rewards that read the answer (tag_count, a judge) skip the reasoning
    assert turn.answer.strip() == "open drawer 1" and "drawer 1." in turn.response[: turn.info["answer_from"]]
    message = completion(ChatRequest(CHAT), [answer], len(prompt_ids(tokenizer, CHAT)), "m", tokenizer)["choices"][0]
    assert message["message"]["reasoning_content"] == answer.reasoning
    assert message["message"]["content"] == answer.content


def test_a_reply_without_reasoning_has_no_reasoning_content():
    tokenizer = family_tokenizer("qwen2_5")
    sampled = encode_chat(tokenizer, "open drawer 1<|im_end|>")
    recorder = EpisodeRecorder(
        Episode(env="agent", task_id=0, split="test", instruction=""), tokenizer, "keep", 4096, tool_layout(tokenizer)
    )
    recorder.prompt(CHAT, [])
    answer = recorder.record(Generation(sampled, [0.0] * len(sampled), "stop"), [], cap_by="max_tokens")
    assert answer.reasoning is None and answer.content == "open drawer 1"
    assert "answer_from" not in recorder.episode.turns[-1].info
    message = completion(ChatRequest(CHAT), [answer], 1, "m", tokenizer)["choices"][0]["message"]
    assert "reasoning_content" not in message
