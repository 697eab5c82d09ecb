"""Parity with real model families' chat templates, as PyPI `trl` ships them (package data): Qwen3,
Qwen3.6, DeepSeek-R1 distills and gpt-oss each rewrite history; omrl used to refuse their second turn.
On the tiny tokenizer (plus each family's special tokens), both history modes now lay out whole
conversations token-exactly: ``keep`` in one append-only row, ``as_template`` in rows that each open
with the template's own render of the chat so far."""

from __future__ import annotations

import importlib.resources

import pytest
from transformers import AutoTokenizer

from omrl.chat import conversation_rows, encode_text, next_prompt, render, reply_text
from omrl.models import TINY_TOKENIZER_DIR

FAMILIES = {  # template -> (special tokens it needs, end-of-turn token, begin-of-text token)
    "qwen3": ([], None, None),
    "qwen3_6": ([], None, None),
    "deepseek_r1_distill": (
        ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
    ),
    "gptoss": (
        ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"],
        "<|return|>",
        None,
    ),
}


def family_tokenizer(name: str):
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    tokenizer.chat_template = (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()
    specials, eos, bos = FAMILIES[name]
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": specials})
    if eos:
        tokenizer.eos_token = eos
    if bos:
        tokenizer.bos_token = bos
    return tokenizer


def episode(reasoning: bool) -> list[dict]:
    chat = [{"role": "system", "content": "Find the key."}, {"role": "user", "content": "A chest stands here."}]
    for i, action in enumerate(["open", "take key", "leave"]):
        reply = f"<think>\nStep {i}: {action} it.\n</think>\n\nAction: {action}" if reasoning else f"Action: {action}"
        chat.append({"role": "assistant", "content": reply})
        if i < 2:
            chat.append({"role": "user", "content": f"You did {action}."})
    return chat


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "plain"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_keep_is_one_append_only_row_holding_every_reply(family, reasoning):
    tokenizer = family_tokenizer(family)
    chat = episode(reasoning)
    [(ids, mask)] = conversation_rows(tokenizer, chat, "keep")
    first = encode_text(tokenizer, render(tokenizer, chat[:2], add_generation_prompt=True))
    assert ids[: len(first)] == first
    replies = [reply_text(tokenizer, chat[:i], m) for i, m in enumerate(chat) if m["role"] == "assistant"]
    trained = [t for t, m in zip(ids, mask) if m]
    assert trained == [t for text in replies for t in encode_text(tokenizer, text)]
    if reasoning:
        assert all(f"Step {i}:" in tokenizer.decode(ids) for i in range(3))  # earlier reasoning kept


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "plain"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_as_template_rows_open_with_the_templates_own_render(family, reasoning):
    tokenizer = family_tokenizer(family)
    chat = episode(reasoning)
    rows = conversation_rows(tokenizer, chat, "as_template")
    assert len(rows) == 3  # each family rewrites (or re-renders) every earlier reply: a row per reply
    for row, at in zip(rows, [i for i, m in enumerate(chat) if m["role"] == "assistant"]):
        prompt = encode_text(tokenizer, render(tokenizer, chat[:at], add_generation_prompt=True))
        ids, mask = row
        assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
        assert ids[len(prompt) :] == encode_text(tokenizer, reply_text(tokenizer, chat[:at], chat[at]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_second_turn_is_no_longer_refused(family):
    tokenizer = family_tokenizer(family)
    chat = episode(True)[:3]
    row = encode_text(tokenizer, render(tokenizer, chat[:2], add_generation_prompt=True) + chat[2]["content"])
    ids, starts_row = next_prompt(
        tokenizer, "keep", row, chat, [{"role": "user", "content": "Next."}], tokenizer.eos_token
    )
    assert not starts_row and "Next." in tokenizer.decode(ids)
    ids, starts_row = next_prompt(
        tokenizer, "as_template", row, chat, [{"role": "user", "content": "Next."}], tokenizer.eos_token
    )
    assert starts_row and ids == encode_text(
        tokenizer, render(tokenizer, [*chat, {"role": "user", "content": "Next."}], add_generation_prompt=True)
    )
