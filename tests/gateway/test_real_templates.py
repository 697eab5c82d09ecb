"""Real families' chat templates (PyPI `trl`'s package data) through the gateway: each family's tool-call
format read from its template, calls parsed in it, tool results in its own tool role, rows token-exact;
a family whose format the gateway cannot read refuses tools by name instead of losing every call."""

from __future__ import annotations

import importlib.resources
import json

import openai
import pytest
from transformers import AutoTokenizer

from omrl import registry
from omrl.data.trajectory import Episode
from omrl.gateway.play import AgentSpec, play_agents
from omrl.models import TINY_TOKENIZER_DIR
from omrl.rollout.pool import EnvPool
from tests.fakes import ScriptedBackend
from tests.gateway.agents import MULTIPLY
from tests.gateway.conftest import assert_token_exact, make_gateway

LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "<|eom_id|>"]
GPT_OSS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]
FAMILIES = {  # template -> (special tokens it needs, end-of-turn token, how it calls multiply, its tool result's role)
    "qwen2_5": ([], None, '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>', "user"),
    "qwen3": ([], None, '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>', "user"),
    "llama3_1": (LLAMA3, "<|eot_id|>", '{"name": "multiply", "parameters": {"a": 6, "b": 7}}', "ipython"),
}


def family_tokenizer(name: str, specials: list[str], eos: str | None):
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    tokenizer.chat_template = (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": specials})
    if eos:
        tokenizer.eos_token = eos
    return tokenizer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_familys_tool_calls_are_read_in_its_own_format(family):
    specials, eos, call, result_role = FAMILIES[family]
    tokenizer = family_tokenizer(family, specials, eos)

    def model(_call, _index, prompt):
        return "The answer is 42." if "42" in tokenizer.decode(prompt).rsplit("6 times 7", 1)[-1] else call

    gateway, backend = make_gateway(tokenizer, ScriptedBackend(tokenizer, model))
    try:
        ep = Episode(env="agent", task_id=0, split="train", instruction="")
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        chat = [{"role": "user", "content": "What is 6 times 7?"}]
        first = client.chat.completions.create(model="m", messages=chat, tools=[MULTIPLY])
        (made,) = first.choices[0].message.tool_calls
        assert made.function.name == "multiply" and first.choices[0].finish_reason == "tool_calls"
        chat += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": made.id, "content": "42"},
        ]
        second = client.chat.completions.create(model="m", messages=chat, tools=[MULTIPLY])
        assert second.choices[0].message.content == "The answer is 42."
    finally:
        gateway.close()
    assert gateway.layout.native and ep.turns[0].info["tool_calls"] == [{"status": "ok", "name": "multiply"}]
    assert_token_exact(ep, backend)
    between = tokenizer.decode(ep.token_ids[ep.turns[0].span[1] : ep.turns[1].span[0]])
    assert result_role in between and "42" in between  # the template's own tool role (Qwen writes it as a user turn)


def test_a_family_whose_call_format_cannot_be_read_refuses_tools_by_name():
    tokenizer = family_tokenizer("muse_glimmer", [], None)  # <atem:function_calls> XML: no parser reads it
    gateway, _ = make_gateway(tokenizer, ScriptedBackend(tokenizer, lambda *_: "ok"))
    try:
        key, _ = gateway.open(Episode(env="agent", task_id=0, split="train", instruction=""))
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="writes tool calls in a format the gateway cannot parse"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[MULTIPLY])
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
    finally:
        gateway.close()


def test_calls_past_the_first_where_the_template_renders_one_are_the_models_mistake(tmp_path):
    """Llama 3.1's template raises on a reply holding two calls: the model's second call is lost, named
    ``unsupported_parallel``, and the episode plays on and is trained, never an env_error for a 500."""
    specials, eos, call, _ = FAMILIES["llama3_1"]
    tokenizer = family_tokenizer("llama3_1", specials, eos)

    def model(_call, _index, prompt):
        return "42" if "42" in tokenizer.decode(prompt).rsplit("6 times 7", 1)[-1] else f"{call}; {call}"

    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    gateway, backend = make_gateway(tokenizer, ScriptedBackend(tokenizer, model))
    pool = EnvPool(registry.envs.get("dataset"), {"path": str(path)}, name="dataset")
    try:
        spec = AgentSpec(run=agent_sending_back_every_call, command=None, reward=None, timeout_s=30)
        (ep,) = play_agents(spec, gateway, pool, [0])
    finally:
        gateway.close()
        pool.close()
    assert not gateway.layout.parallel
    assert ep.end_reason == "done" and ep.error is None and ep.score == 1.0 and len(ep.turns) == 2
    assert [a["status"] for a in ep.turns[0].info["tool_calls"]] == ["ok", "unsupported_parallel"]
    assert not ep.turns[0].format_ok and ep.turns[0].info["tool_error"].startswith("unsupported_parallel")
    assert_token_exact(ep, backend)  # the row holds both calls as sampled


def agent_sending_back_every_call(task, base_url, api_key):
    """A plain `openai` agent that answers every call it is handed, as frameworks do."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    while True:
        message = client.chat.completions.create(model="m", messages=messages, tools=[MULTIPLY]).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "42"} for call in message.tool_calls]
