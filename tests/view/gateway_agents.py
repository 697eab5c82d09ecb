"""An agent program and a reward function for the viewer's real gateway run (each as a user would write it)."""

from __future__ import annotations

import openai


def two_prompts(task, base_url, api_key):
    """Answers, then asks again with a prompt of its own (not the first chat continued): two rows."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = _ask(client, task["prompt"])
    return _ask(client, f"Is this the answer to '{task['prompt']}'? {first}")


def _ask(client, text):
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}], max_tokens=8)
    return reply.choices[0].message.content


def answered(task, result):
    """Named components: whether the agent answered at all, and a constant."""
    return {"answered": float(bool(result)), "bonus": 0.5}
