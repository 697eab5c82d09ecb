"""How a sampled reply's end is read back: a reply cut at the token limit inside its reasoning is reasoning
where the family's server reads it so (DeepSeek-R1, gpt-oss), never the answer a later prompt shows; and a
reply that samples a closing token twice (Cohere2) gets nothing of the closing written again."""

from __future__ import annotations

import pytest

from omrl.chat import render
from omrl.chat.history import kept_increment
from omrl.chat.replies import after_sampled_end, parse_reply, sampled_end

from .families import family_tokenizer

QUESTION = {"role": "user", "content": "Where is the key?"}
NEXT = {"role": "user", "content": "Go on."}


@pytest.mark.parametrize(
    "family, cut, reasoning",
    [
        ("deepseek_r1_distill", "Step 0: the drawer", "Step 0: the drawer"),  # the prompt opened <think>
        ("deepseek_r1_distill", "<think>\nStep 0: the drawer", "\nStep 0: the drawer"),  # opened once more
        ("gptoss", "<|channel|>analysis<|message|>Step 0: the drawer", "Step 0: the drawer"),
    ],
)
def test_a_reply_cut_inside_its_reasoning_is_reasoning_as_the_familys_server_reads_it(family, cut, reasoning):
    tokenizer = family_tokenizer(family)
    parsed = parse_reply(tokenizer, cut)
    assert (parsed.reasoning, parsed.answer) == (reasoning, "")
    assert parsed.message == {"role": "assistant", "content": "", "reasoning_content": reasoning}
    # the next prompt (as_template's) shows an empty answer, as a server's history would: never the half-thought
    prompt = render(tokenizer, [QUESTION, parsed.message, NEXT], add_generation_prompt=True)
    assert "Step 0" not in prompt and "<|channel|>analysis" not in prompt


def test_a_dataset_reply_without_reasoning_stays_the_answer_where_the_prompt_opened_the_block():
    tokenizer = family_tokenizer("deepseek_r1_distill")  # "Act: up" in a dataset: no reasoning, not a cut reply
    parsed = parse_reply(tokenizer, "Act: up", sampled=False)
    assert (parsed.reasoning, parsed.message) == (None, {"role": "assistant", "content": "Act: up"})


def test_a_qwen3_reply_cut_inside_its_block_is_read_as_before():
    tokenizer = family_tokenizer("qwen3")  # Qwen3's parser leaves a <think> the reply never closed in the answer
    parsed = parse_reply(tokenizer, "<think>\nStep 0: the drawer")
    assert (parsed.reasoning, parsed.message) == (None, {"role": "assistant", "content": "<think>\nStep 0: the drawer"})


def test_a_closing_token_sampled_twice_is_not_written_again():
    tokenizer = family_tokenizer("cohere2")  # it closes a reply with <|END_RESPONSE|><|END_OF_TURN_TOKEN|>
    text = "Act: down<|END_RESPONSE|><|END_RESPONSE|><|END_OF_TURN_TOKEN|>"  # as decoded from the ids sampled
    end = sampled_end(tokenizer, text)
    reply = parse_reply(tokenizer, text[: len(text) - len(end)]).message
    increment = kept_increment(tokenizer, [QUESTION, reply], [NEXT], end)
    written = tokenizer.decode(increment, skip_special_tokens=False)
    assert written.startswith("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Go on."), written


@pytest.mark.parametrize(
    "end, sampled, rest",
    [
        ("<|im_end|>\n", "<|im_end|>", "\n"),
        ("<|END_RESPONSE|><|END_OF_TURN_TOKEN|>", "<|END_RESPONSE|><|END_RESPONSE|><|END_OF_TURN_TOKEN|>", ""),
        ("<|END_RESPONSE|><|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", None),  # a closing the model skipped
        ("<|end|><|start|>user", "<|return|>", None),  # gpt-oss: the history writes <|end|> for it
    ],
)
def test_what_a_template_writes_after_a_reply_less_what_was_sampled(end, sampled, rest):
    assert after_sampled_end(end, sampled) == rest
