"""Templates whose generation prompt opens ``<think>`` (DeepSeek-R1 and V3, Nemotron 3): a reply without
reasoning closes the block it was given before its answer, as the template writes it; a reply read back keeps
its reasoning in the content where the template reads no reasoning field (and keeps it inline itself)."""

from __future__ import annotations

import pytest

from omrl.chat import conformance as conformance_module
from omrl.chat import conversation_rows, encode_chat, render
from omrl.chat.conformance import conformance
from omrl.chat.replies import parse_reply

from .families import family_tokenizer

CHAT = [{"role": "user", "content": "Where is the key?"}, {"role": "assistant", "content": "In the drawer."}]


def trained_text(tokenizer, chat):
    [(ids, mask)] = conversation_rows(tokenizer, chat, "keep")
    return tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("deepseek_r1_distill", "</think>\n\nIn the drawer.<｜end▁of▁sentence｜>"),
        ("deepseekv3", "</think>\n\nIn the drawer.<｜end▁of▁sentence｜>"),
        ("nemotron_3_nano", "</think>In the drawer.<|im_end|>"),  # the template writes <think></think>In ...
    ],
)
def test_a_plain_reply_closes_the_block_the_prompt_opened(name, want):
    tokenizer = family_tokenizer(name)
    assert render(tokenizer, CHAT[:1], add_generation_prompt=True).rstrip().endswith("<think>")
    assert trained_text(tokenizer, CHAT) == want


def test_a_reply_with_reasoning_still_continues_the_opened_block():
    tokenizer = family_tokenizer("deepseek_r1_distill")
    chat = [CHAT[0], {"role": "assistant", "content": "<think>\nIt is small.\n</think>\n\nIn the drawer."}]
    assert trained_text(tokenizer, chat) == "It is small.\n</think>\n\nIn the drawer.<｜end▁of▁sentence｜>"


def test_conformance_checks_a_reply_against_the_templates_own_render(monkeypatch):
    tokenizer = family_tokenizer("deepseek_r1_distill")
    assert not [r for r in conformance(tokenizer, cases=("plain",)) if r.status != "ok"]

    def unclosed(tokenizer, before, reply, **kwargs):  # the reply as omrl used to sample it: the block left open
        return reply["content"] + tokenizer.eos_token

    monkeypatch.setattr(conformance_module, "reply_text", unclosed)
    results = conformance(family_tokenizer("deepseek_r1_distill"), cases=("plain",))
    assert {r.status for r in results} == {"broken"}
    assert all("where the template writes" in r.problem for r in results)


THINK = [
    {"role": "user", "content": "A chest stands here."},
    {"role": "assistant", "content": "<think>\nStep 0: open it.\n</think>\n\nAction: open"},
    {"role": "user", "content": "You did open."},
    {"role": "assistant", "content": "<think>\nStep 1: leave.\n</think>\n\nAction: leave"},
]


def test_as_template_keeps_reasoning_the_template_keeps_inline():
    tokenizer = family_tokenizer("deepseek_r1_distill_training")  # writes a reply's content whole, no field read
    rows = conversation_rows(tokenizer, THINK, "as_template")
    prompt = encode_chat(tokenizer, render(tokenizer, THINK[:3], add_generation_prompt=True))
    ids, mask = rows[-1]
    last = max(k for k, bit in enumerate(mask) if bit and not mask[k - 1])  # where the last reply starts
    assert ids[:last] == prompt  # the template's own render of the dataset's chat, earlier reasoning in it
    assert "Step 0: open it." in tokenizer.decode(ids[:last])
    message = parse_reply(tokenizer, "Step 0: open it.\n</think>\n\nAction: open").message
    assert message == {"role": "assistant", "content": "<think>\nStep 0: open it.\n</think>\n\nAction: open"}


def test_a_template_that_reads_the_field_still_gets_it():
    tokenizer = family_tokenizer("qwen3")
    message = parse_reply(tokenizer, "<think>\nStep 0.\n</think>\n\nAction: open").message
    assert message["reasoning_content"].strip() == "Step 0." and message["content"].strip() == "Action: open"


def test_a_sampled_reply_that_never_closes_the_opened_block_gave_no_answer():
    """DeepSeek-R1's reply without ``</think>`` is reasoning alone, as its chat layer reads it back: its action
    is not taken (it was once stepped, then shown to the model as an empty reply)."""
    from omrl import registry
    from omrl.rollout import EnvPool, collect
    from omrl.rollout.live import UNANSWERED
    from tests.fakes import KeyEnv, ScriptedBackend

    tokenizer = family_tokenizer("deepseek_r1_distill")
    replies = ["Act: open", "</think>\n\nAct: open"]  # the first leaves the block open, the second closes it
    backend = ScriptedBackend(tokenizer, lambda call, i, prompt: replies[call % 2])
    react = registry.templates.get("react")()
    (episode,) = collect(EnvPool(KeyEnv, name="keys"), react, tokenizer, [0], backend=backend)
    first, second = episode.turns[:2]
    assert first.action is None and not first.format_ok and first.parse_error == UNANSWERED
    assert second.action == "open" and second.format_ok
    assert episode.messages[2]["content"] == "" and "Act: open" in str(episode.messages[2])  # read as reasoning
