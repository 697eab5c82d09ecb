"""Agent programs and reward functions the gateway tests run (each as a user would write it)."""

from __future__ import annotations

import time

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


def truth_reward(task, result):
    """1 when the answer holds the env's ground truth (which the reward function is given)."""
    return float(str(task["ground_truth"]) in str(result))
