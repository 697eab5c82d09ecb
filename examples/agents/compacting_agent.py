"""An agent that compacts its own history, trained as it is: ``omrl train --agent compacting_agent:run``.

It answers a question, then asks itself to check and improve the answer for a few rounds. When the chat
passes ``COMPACT_AT`` prompt tokens (as the endpoint's ``usage`` reports them), it asks the model for a
summary and goes on from a fresh chat holding only the task and that summary, as coding harnesses do
when their context fills up.

Each compaction rewrites the history, so the next call does not extend the episode's row: omrl starts
a new row there (``rows_per_episode`` counts them) and trains every row with the episode's reward.

Run it from this folder (so ``compacting_agent`` imports), on any JSONL of questions and answers:

    omrl train --algo grpo --env dataset --model tiny --agent compacting_agent:run \
        plugins.dataset.path=qa.jsonl plugins.dataset.test_fraction=0.2 --steps 5
"""

from __future__ import annotations

import os

import openai

COMPACT_AT = int(os.environ.get("COMPACT_AT", "400"))  # prompt tokens past which the chat is summarised
ROUNDS = int(os.environ.get("ROUNDS", "4"))  # answer, then this many rounds of checking it, at most
SYSTEM = "You answer questions with a number. Be brief."


def run(task: dict, base_url: str, api_key: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
    answer = ""
    for _ in range(ROUNDS):
        reply = client.chat.completions.create(model="policy", messages=chat, max_tokens=32)
        answer = reply.choices[0].message.content or ""
        chat.append({"role": "assistant", "content": answer})
        if reply.usage.prompt_tokens + reply.usage.completion_tokens > COMPACT_AT:
            chat = compacted(client, chat, task["prompt"])
        chat.append({"role": "user", "content": "Check your answer. Reply with the corrected number alone."})
    return answer


def compacted(client: openai.OpenAI, chat: list[dict], question: str) -> list[dict]:
    """A fresh chat: the question and the model's own summary of the work so far."""
    ask = [*chat, {"role": "user", "content": "Summarise the work so far in one sentence."}]
    summary = client.chat.completions.create(model="policy", messages=ask, max_tokens=32).choices[0].message.content
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{question}\n\nSummary of earlier work: {summary}"},
    ]
