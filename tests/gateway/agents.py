"""Agent programs and reward functions the gateway tests run (each as a user would write it)."""

from __future__ import annotations

import socket
import time
import urllib.request

import openai

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "unit": {"enum": ["m", "s"]}},
            "required": ["a", "b"],
        },
    },
}


def tool_loop(task, base_url, api_key, max_calls=3):
    """A plain `openai` agent: calls the model with a multiply tool until it answers in text."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": task["prompt"]}]
    for _ in range(max_calls):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[MULTIPLY], max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    return None


def one_call(task, base_url, api_key):
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8
    )
    return reply.choices[0].message.content


def raises(task, base_url, api_key):
    one_call(task, base_url, api_key)
    raise ValueError("the agent's own bug")


def hangs(task, base_url, api_key):
    one_call(task, base_url, api_key)
    time.sleep(120)


def never_calls(task):
    return "42"


def length_reward(task, result, transcript):
    """Named components: a reply's length in words (so a group's rewards differ) and a constant."""
    return {"words": len(str(result or "").split()) / 10, "bonus": 0.5}


def reward_raises(task, result):
    raise RuntimeError("the reward function's own bug")


def result_only_reward(result):
    """Takes the result alone: it is given the result, by name, never the task in its place."""
    return {"is_text": float(isinstance(result, str)), "words": len(str(result).split()) / 10}


def unnamed_reward(t, r):
    return 1.0


def truth_reward(task, result):
    """1 when the answer holds the env's ground truth (which the reward function is given)."""
    return float(str(task["ground_truth"]) in str(result))


def _with_tools_once(task, base_url, api_key):
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    client.chat.completions.create(model="policy", messages=messages, tools=[MULTIPLY], max_tokens=48)


def call_then_tool_server_down(task, base_url, api_key):
    """Calls the model with a tool once, then its own tool server is down (a port no one listens on)."""
    _with_tools_once(task, base_url, api_key)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    urllib.request.urlopen(f"http://127.0.0.1:{port}/multiply", timeout=5)


def raises_on_length(task, base_url, api_key):
    """As openai's ``.parse()`` and pydantic-ai do: a reply cut by ``length`` is raised as an error."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    while True:
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        if reply.choices[0].finish_reason == "length":
            raise RuntimeError("the model's reply was cut at its length limit")
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "go on"},
        ]


def bug_after_one_call(task, base_url, api_key):
    """One call, then a bug of the agent's own that has nothing to do with the reply."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}])
    return {}["answer_key"]


def call_then_sleeps(task, base_url, api_key):
    """One call, then a long wait (a slow tool): the agent is still running when the run is stopped."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}])
    time.sleep(600)


def call_then_hangs(task, base_url, api_key):
    _with_tools_once(task, base_url, api_key)
    time.sleep(120)


def answers_a_number(task, base_url, api_key):
    one_call(task, base_url, api_key)
    return 42
