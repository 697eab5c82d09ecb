"""Real agent frameworks from PyPI play multi-turn tool-using episodes through the gateway, unmodified,
with every row checked token-exact. The model is scripted as an expert (a tool call, then the answer
once it has seen the tool's result), so each framework's whole loop runs; the real model's rows are
checked in test_gateway.py."""

from __future__ import annotations

import pytest

from omrl.data.trajectory import Episode
from omrl.rollout.spec import RolloutLimits
from tests.fakes import ScriptedBackend
from tests.gateway import frameworks
from tests.gateway.conftest import assert_token_exact, make_gateway

MULTIPLY = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
FINAL = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "42"}}\n</tool_call>'


def expert(tokenizer):
    """Calls multiply until the last user turn holds its result (42), then answers: in text, or with the
    final_answer tool where one is offered (smolagents ends that way)."""

    def reply(call, index, prompt):
        text = tokenizer.decode(prompt)
        if "42" not in text.rsplit("<|im_start|>user\n", 1)[-1]:
            return MULTIPLY
        return FINAL if '"final_answer"' in text else "The answer is 42."

    return ScriptedBackend(tokenizer, reply)


@pytest.fixture
def gateway(tiny_tokenizer):
    limits = RolloutLimits(max_new_tokens=96, max_context=16384)  # smolagents' system prompt alone is 2k+ tokens
    served, backend = make_gateway(tiny_tokenizer, expert(tiny_tokenizer), limits=limits)
    yield served, backend
    served.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # LangGraph 1.x names its prebuilt graph deprecated
@pytest.mark.parametrize(
    "agent, rows",
    [
        (frameworks.openai_agents, "one"),
        (frameworks.openai_agents_default, "one"),  # the Responses API
        (frameworks.openai_agents_streamed, "one"),
        (frameworks.langgraph, "one"),
        (frameworks.langgraph_streaming, "one"),
        (frameworks.pydantic_ai, "one"),
        # smolagents keeps its history as text ("Calling tools: [...]", "Observation: 42"), never the
        # reply it was given, so every call is a rewritten chat: a row each
        (frameworks.smolagents, "each"),
    ],
)
def test_a_framework_plays_a_tool_using_episode_token_exactly(gateway, agent, rows):
    served, backend = gateway
    ep = Episode(env="agent", task_id=0, split="train", instruction="")
    key, _ = served.open(ep)
    answer = agent({"id": 0, "prompt": "What is 6 times 7?"}, served.base_url, key)
    served.end(key)
    assert "42" in str(answer)
    assert len(ep.turns) >= 2
    assert ep.turns[0].info["tool_calls"] == [{"status": "ok", "name": "multiply"}]
    assert len(ep.row_starts) == (0 if rows == "one" else len(ep.turns) - 1)
    assert_token_exact(ep, backend)
    tool_result = "<tool_response>\n42\n</tool_response>" if rows == "one" else "Observation:"
    assert tool_result in served.tokenizer.decode(ep.token_ids[ep.turns[0].span[1] : ep.turns[1].span[0]])
