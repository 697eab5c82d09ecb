"""What goes wrong around a call: late calls, failed calls, a broken engine, hostile requests, budgets."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from omrl.backends.base import Backend
from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.data.trajectory import Episode
from omrl.rollout import PlaySpec, RolloutSession
from tests.fakes import ScriptedBackend
from tests.gateway.conftest import make_gateway

CHAT = [{"role": "user", "content": "hi"}]


def episode() -> Episode:
    return Episode(env="agent", task_id=0, split="train", instruction="")


def address(gateway) -> tuple[str, int]:
    host, port = gateway.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    return host, int(port)


def test_a_call_whose_body_arrives_after_the_episode_ended_is_refused(tiny_tokenizer):
    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "ok"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        body = json.dumps({"model": "m", "messages": CHAT}).encode()
        with socket.create_connection(address(gateway)) as conn:
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            conn.sendall(head.encode())
            time.sleep(0.3)  # the handler has looked the key up and waits for the body
            gateway.end(key)
            conn.sendall(body)
            status = conn.recv(4096).split(b"\r\n", 1)[0]
        assert b"401" in status
        assert ep.token_ids == [] and ep.turns == [] and backend.calls == []
    finally:
        gateway.close()


class FailsOnce(Backend):
    """Raises on its first call, then answers "ok"."""

    name = "fails_once"

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.inner = ScriptedBackend(tokenizer, lambda *_: "ok")
        self.calls = 0

    def generate(self, prompts, params, messages=None):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the engine hiccuped")
        return self.inner.generate(prompts, params, messages)


def test_a_failed_call_leaves_the_episode_as_it_was(tiny_tokenizer):
    gateway, _ = make_gateway(tiny_tokenizer, FailsOnce(tiny_tokenizer))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        with pytest.raises(openai.InternalServerError, match="the engine hiccuped"):
            client.chat.completions.create(model="m", messages=CHAT)
        assert ep.token_ids == [] and ep.turns == []
        client.chat.completions.create(model="m", messages=[*CHAT, {"role": "user", "content": "again"}])
        assert (
            len(ep.turns) == 1 and ep.row_starts == [] and sum(ep.loss_mask) == len(ep.token_ids) - ep.turns[0].span[0]
        )
    finally:
        gateway.close()


# a template that refuses a system message after the first, as many real ones do (raise_exception)
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be first') }}{% endif %}<|{{ m.role }}|>{{ m.content }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_messages_the_models_template_refuses_get_a_400_and_leave_the_episode_as_it_was(tiny_tokenizer):
    strict = copy.deepcopy(tiny_tokenizer)
    strict.chat_template = STRICT_TEMPLATE
    gateway, _ = make_gateway(strict, ScriptedBackend(strict, lambda *_: "ok"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        late = [*CHAT, {"role": "system", "content": "late"}]
        with pytest.raises(openai.BadRequestError, match="the model's chat template refuses these messages: System"):
            client.chat.completions.create(model="m", messages=late)
        assert ep.token_ids == [] and ep.turns == []
        client.chat.completions.create(model="m", messages=CHAT)
        assert len(ep.turns) == 1 and ep.turns[0].response == "ok"
    finally:
        gateway.close()


class Drops(Backend):
    """Answers a batch with fewer replies than prompts: a broken engine."""

    name = "drops"

    def generate(self, prompts, params, messages=None):
        return []


def test_an_engine_that_drops_replies_fails_the_call_at_once_and_is_named(tiny_tokenizer):
    gateway, _ = make_gateway(tiny_tokenizer, Drops(tiny_tokenizer))
    try:
        key, _ = gateway.open(episode())
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        began = time.monotonic()
        with pytest.raises(openai.InternalServerError, match="answered 1 prompts with 0 replies"):
            client.chat.completions.create(model="m", messages=CHAT)
        assert time.monotonic() - began < 10
        assert "0 replies" in str(gateway.batcher.failure)
    finally:
        gateway.close()


def test_hostile_requests_get_a_400_naming_the_problem(tiny_tokenizer):
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "ok"))
    try:
        key, _ = gateway.open(episode())
        auth = {"Authorization": f"Bearer {key}"}
        url = f"{gateway.base_url}/chat/completions"
        with socket.create_connection(address(gateway)) as conn:  # no client library sends such a header
            conn.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: abc\r\n\r\n{{}}".encode()
            )
            answer = b"".join(iter(lambda: conn.recv(4096), b""))  # until the gateway closes the connection
        assert answer.startswith(b"HTTP/1.1 400") and b"Content-Length is 'abc'" in answer
        seeded = httpx.post(url, json={"messages": CHAT, "seed": 2**70}, headers=auth)  # past what engines take
        assert seeded.status_code == 400 and "seed must be between" in seeded.json()["error"]["message"]
        for depth in (600, 3000):  # JSON that loads but nests past what laying it out can recurse; and past loading
            deep = '{"type": "object", "properties": {"x": ' * depth + "{}" + "}}" * depth
            body = f'{{"messages": {json.dumps(CHAT)}, "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {deep}}}}}]}}'
            nested = httpx.post(url, content=body, headers=auth, timeout=60)
            assert nested.status_code == 400, nested.text
        fmt = httpx.post(
            f"{gateway.base_url}/responses",
            json={"input": "hi", "text": {"format": {"type": "json_schema"}}},
            headers=auth,
        )
        assert fmt.status_code == 400 and "text.format 'json_schema' is not served" in fmt.json()["error"]["message"]
        named = httpx.post(
            f"{gateway.base_url}/responses", json={"input": [{"role": "robot", "content": "x"}]}, headers=auth
        )
        assert "messages[0].role is 'robot'" in named.json()["error"]["message"]
        assert "input's items" in named.json()["error"]["message"]
    finally:
        gateway.close()


def test_an_agents_own_bug_after_a_cut_reply_is_the_agents_failure(tiny_tokenizer, tmp_path):
    """A KeyError after a reply cut at the run's max_new_tokens was scored 0 and trained as the model's doing:
    only an error that names the cut (a framework refusing an incomplete response) is."""
    agent = "agent.callable=tests.gateway.agents:bug_after_one_call"
    ep = play_one(tiny_tokenizer, tmp_path, "42 " * 40, agent, "generation.max_new_tokens=8")
    assert ep.end_reason == "env_error" and ep.error.startswith("the agent raised KeyError: 'answer_key'")
    assert "the error does not name that cut, so it is the agent's failure" in ep.error


@pytest.mark.parametrize("agent", ["agent.callable=tests.gateway.agents:call_then_sleeps", "agent.command=sleep 600"])
def test_a_ctrl_c_while_agents_play_stops_the_run_at_once(tiny_tokenizer, tmp_path, agent):
    """A Ctrl-C under an agent that was waiting on a slow tool ended the run only once agent.timeout_s (300 s)
    had passed: the pool's threads each waited out their agent first."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={questions}", agent, "agent.timeout_s=120"],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    # Python's own Ctrl-C, as in `omrl rollout`: a pytest-xdist worker ignores SIGINT (its controller handles it)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    with RolloutSession.from_config(cfg, backend=ScriptedBackend(tiny_tokenizer, lambda *_: "42")) as session:
        timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                session.play([0, 0], PlaySpec(split="train"))
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, before)
        assert time.monotonic() - started < 60  # not agent.timeout_s
    assert not [t for t in threading.enumerate() if t.name.startswith("omrl-agent_")]  # the pool's workers ended


def test_a_turn_offered_tools_that_made_no_call_counts_in_the_tool_call_rates(tiny_tokenizer, tmp_path):
    """The gateway recorded info["tool_calls"] only where a reply attempted a call: a run whose model never
    called the tools it was offered showed no tool metrics at all, unlike the same run in a native env."""
    from omrl.evaluation import tool_call_health

    ep = play_one(tiny_tokenizer, tmp_path, "42", "agent.callable=tests.gateway.agents:tool_loop")
    assert ep.end_reason == "done" and ep.turns[-1].info["tool_calls"] == []
    health = tool_call_health([ep])
    assert health["valid_call_turn_rate"] == 0.0 and health["tool_call_attempts"] == 0.0


def test_a_reply_cut_at_the_agents_own_cap_says_how_to_have_it_trained(tiny_tokenizer, tmp_path):
    """The Agents SDK raising on a cut at the max_tokens its agent set is the agent's failure (env_error), and
    the error said nothing of what would make it the model's."""
    agent = "agent.callable=tests.gateway.frameworks:openai_agents_capped"
    ep = play_one(tiny_tokenizer, tmp_path, "42 " * 40, agent)
    assert ep.end_reason == "env_error" and "ModelBehaviorError" in ep.error
    assert "the max_tokens the agent's own call set" in ep.error and "generation.max_new_tokens cuts" in ep.error


def test_only_an_errors_own_words_name_a_cut():
    from omrl.gateway.agents import AgentFailure

    traceback = (
        "the agent command exited with 1: Traceback (most recent call last):\n"
        '  File "agent.py", line 4, in <module>\n    reply = client.chat.completions.create(max_tokens=24)\n'
    )
    assert not AgentFailure(traceback + "KeyError: 'answer_key'", ended_itself=True).names_a_cut
    assert AgentFailure(traceback + "agents.exceptions.ModelBehaviorError: incomplete", ended_itself=True).names_a_cut
    assert AgentFailure("the agent raised LengthFinishReasonError: cut", ended_itself=True).names_a_cut
    assert not AgentFailure("the agent did not finish within 3 s (incomplete)").names_a_cut  # the world's


@pytest.mark.parametrize(
    "extra, named",
    [
        ('"temperature": NaN', "temperature must be a finite number, got nan"),
        ('"top_p": NaN', "top_p must be a finite number, got nan"),
        (f'"seed": {10**400}', "seed must be between"),  # past what a float holds
        (
            '"tools": [{"type": "function", "function": {"name": "f"}}], "messages": '
            + json.dumps(
                [
                    *CHAT,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[" * 3000 + "]" * 3000},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "1"},
                ]
            ),
            r"messages\[1\].tool_calls\[0\].function.arguments nests too deeply",
        ),
    ],
)
def test_a_value_no_check_can_compare_gets_a_400_naming_it_and_the_run_goes_on(tiny_tokenizer, extra, named):
    """NaN passes every range check (its comparisons are false) and would fail the engine, so the whole run;
    tool-call arguments nested past Python's recursion limit cannot be read: each is the request's fault."""
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "ok"), honor_sampling=True)
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        body = f'{{"messages": {json.dumps(CHAT)}, {extra}}}'  # as a client that writes NaN (Python's json) sends it
        answer = httpx.post(
            f"{gateway.base_url}/chat/completions", content=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        assert answer.status_code == 400 and re.search(named, answer.json()["error"]["message"]), answer.text
        assert ep.turns == [] and gateway.batcher.failure is None
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        assert client.chat.completions.create(model="m", messages=CHAT).choices[0].message.content == "ok"
    finally:
        gateway.close()


def test_past_its_calls_an_episode_is_answered_length_and_truncated(tiny_tokenizer, tmp_path):
    questions = tmp_path / "qa.jsonl"
    questions.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={questions}", "agent.callable=tests.gateway.agents:tool_loop", "agent.max_calls=2"],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    with RolloutSession.from_config(cfg, backend=ScriptedBackend(tiny_tokenizer, lambda *_: call)) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert len(ep.turns) == 2 and ep.end_reason == "max_turns"  # the third call got "length", nothing recorded


def test_a_framework_that_rejects_the_models_tool_call_is_the_models_failure(tiny_tokenizer, tmp_path):
    """The Agents SDK raises on a call to a tool it does not have: the episode is scored 0 and trained,
    never an env_error (which would hide the model's mistake from training)."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={questions}", "agent.callable=tests.gateway.frameworks:openai_agents"],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    call = '<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 7}}</tool_call>'
    with RolloutSession.from_config(cfg, backend=ScriptedBackend(tiny_tokenizer, lambda *_: call)) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.end_reason == "done" and ep.score == 0.0 and ep.rewards["total"] == [0.0]
    assert ep.turns[-1].info["tool_calls"][0]["status"] == "unknown_tool"
    assert "divide" in ep.turns[-1].info["agent_error"]


@pytest.mark.parametrize(
    "agent, error",
    [
        ("call_then_tool_server_down", "the agent raised URLError: <urlopen error [Errno 111] Connection refused>"),
        pytest.param("call_then_hangs", "the agent did not finish within 3 s", marks=pytest.mark.slow),  # a deadline
    ],
)
def test_a_world_failure_after_a_malformed_tool_call_is_still_an_env_error(tiny_tokenizer, tmp_path, agent, error):
    """Only the agent ending with an error of its own can be its framework refusing the call."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={questions}", f"agent.callable=tests.gateway.agents:{agent}", "agent.timeout_s=3"],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    call = '<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 7}}</tool_call>'
    with RolloutSession.from_config(cfg, backend=ScriptedBackend(tiny_tokenizer, lambda *_: call)) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.turns[-1].info["tool_calls"][0]["status"] == "unknown_tool"
    assert ep.end_reason == "env_error" and ep.error == error


def play_one(tokenizer, tmp_path, reply: str, *overrides: str) -> Episode:
    """The one episode of "What is 6 times 7?" (answer 42) that an agent plays, the model always saying ``reply``."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={questions}", *overrides],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    with RolloutSession.from_config(cfg, backend=ScriptedBackend(tokenizer, lambda *_: reply)) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    return ep


def test_a_framework_that_raises_on_the_budgets_length_answer_is_truncated_and_scored(tiny_tokenizer, tmp_path):
    """docs/agents.md: past agent.max_calls the episode ends max_turns, scored as it stands, also
    where the framework raises on the "length" answer instead of returning."""
    ep = play_one(
        tiny_tokenizer, tmp_path, "42", "agent.callable=tests.gateway.agents:raises_on_length", "agent.max_calls=2"
    )
    assert len(ep.turns) == 2 and ep.end_reason == "max_turns" and ep.error is None
    assert ep.turns[-1].info["ground_truth"] == "42" and ep.won  # the env scored its last reply, "42"
    assert "cut at its length limit" in ep.turns[-1].info["agent_error"]


def test_new_tools_start_a_new_row_even_where_the_template_renders_none(smollm2_tokenizer):
    gateway, _ = make_gateway(smollm2_tokenizer, ScriptedBackend(smollm2_tokenizer, lambda *_: "ok"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        tool = {"type": "function", "function": {"name": "first", "parameters": {"type": "object", "properties": {}}}}
        reply = client.chat.completions.create(model="m", messages=CHAT, tools=[tool])
        chat = [
            *CHAT,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
        other = {"type": "function", "function": {"name": "second", "parameters": {"type": "object", "properties": {}}}}
        client.chat.completions.create(model="m", messages=chat, tools=[other])
        assert len(ep.row_starts) == 1
        assert "second" in smollm2_tokenizer.decode(ep.token_ids[ep.row_starts[0] :])
    finally:
        gateway.close()


def test_a_reply_cut_at_the_runs_max_new_tokens_is_trained_though_the_framework_raises(tiny_tokenizer, tmp_path):
    """The Agents SDK's Responses model raises on a response cut at its length (status incomplete): where the
    cap was the run's generation.max_new_tokens, the agent never asked for it, so the cut is the model's
    doing: the episode is scored and trained as it stands, never an env_error."""
    agent = "agent.callable=tests.gateway.frameworks:openai_agents_default"
    ep = play_one(tiny_tokenizer, tmp_path, "42 " * 40, agent, "generation.max_new_tokens=8")
    assert ep.end_reason == "done" and ep.error is None and len(ep.turns) == 1
    assert ep.turns[-1].info["rollout"] == {**ep.turns[-1].info["rollout"], "truncated": True, "cap": "max_new_tokens"}
    assert "incomplete" in ep.turns[-1].info["agent_error"]
    assert ep.turns[-1].info["ground_truth"] == "42" and sum(ep.loss_mask) == 8  # scored, and its ids trained


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"logit_bias": {"50": 100}}, "logit_bias"),
        ({"presence_penalty": 2.0}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"extra_body": {"top_k": 1}}, "top_k"),
        ({"extra_body": {"min_p": 0.5}}, "min_p"),
        ({"extra_body": {"repetition_penalty": 1.5}}, "repetition_penalty"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"extra_body": {"best_of": 3}}, "best_of=3 is not served .*valid: 1 or leave it out"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json=.* is not served .*valid: leave it out"),
        ({"extra_body": {"echo": True}}, "echo"),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "zzz"}},
            },
            "tool_choice names 'zzz', not one of the tools \\(f\\)",
        ),
    ],
)
def test_an_option_that_would_change_sampling_is_refused_by_name(tiny_tokenizer, extra, named):
    """The policy samples as the run sets (training assumes it): an option that would sample otherwise is
    refused, never silently ignored; its neutral value is accepted."""
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "ok"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        with pytest.raises(openai.BadRequestError, match=named):
            client.chat.completions.create(model="m", messages=CHAT, **extra)
        assert ep.turns == []
        neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}}
        client.chat.completions.create(
            model="m",
            messages=CHAT,
            **neutral,
            modalities=["text"],
            extra_body={"top_k": -1, "min_p": 0, "echo": False},
        )
        for body in [{"top_logprobs": 2}, {"include": ["message.output_text.logprobs"]}]:
            with pytest.raises(openai.BadRequestError, match="logprobs"):
                client.responses.create(model="m", input="hi", **body)
    finally:
        gateway.close()
