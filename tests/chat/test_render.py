"""Token-exact chat layout, for both built-in tokenizers."""

from __future__ import annotations

import pytest

from omrl.chat import encode_conversation, next_turn_ids, prompt_ids, render
from omrl.errors import OmrlError

CHAT = [
    {"role": "system", "content": "You act in a maze."},
    {"role": "user", "content": "goal: 2 up"},
    {"role": "assistant", "content": "Think: go up\nAct: up"},
    {"role": "user", "content": "goal: 1 up"},
    {"role": "assistant", "content": "Act: up"},
]


@pytest.fixture
def tokenizer(builtin_tokenizer):
    return builtin_tokenizer


def test_conversation_decodes_to_the_rendered_chat(tokenizer):
    ids, mask = encode_conversation(tokenizer, CHAT)
    # the sequence ends at the model's end-of-turn token; the template's trailing newline is not generated
    assert tokenizer.decode(ids) == render(tokenizer, CHAT).rstrip("\n")
    learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "Think: go up\nAct: up<|im_end|>Act: up<|im_end|>"


def test_no_template_or_user_token_is_learned(tokenizer):
    ids, mask = encode_conversation(tokenizer, CHAT)
    masked_out = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    for message in CHAT:
        if message["role"] != "assistant":
            assert message["content"] in masked_out


def test_increment_after_a_cut_turn_carries_the_end_token_unlearned(tokenizer):
    history = CHAT[:3]
    with_eos = next_turn_ids(tokenizer, history, "next", sampled_end=tokenizer.eos_token)
    without = next_turn_ids(tokenizer, history, "next", sampled_end="")
    assert tokenizer.decode(without).startswith("<|im_end|>")
    assert tokenizer.decode(without)[len("<|im_end|>") :] == tokenizer.decode(with_eos)
    assert (
        prompt_ids(tokenizer, CHAT[:2])[-3:]
        == tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:]
    )


def test_bad_role_order_is_named(tokenizer):
    with pytest.raises(OmrlError, match="message 3 has role 'assistant' right after reply 2"):
        encode_conversation(tokenizer, CHAT[:3] + [{"role": "assistant", "content": "again"}])
    with pytest.raises(OmrlError, match="no assistant message"):
        encode_conversation(tokenizer, CHAT[:2])
