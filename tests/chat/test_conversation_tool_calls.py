"""A dataset reply made of tool calls trains the calls as the chat template writes them, or is an error: a template
that writes no tool calls must not turn the reply into an empty one."""

from __future__ import annotations

import pytest

from omrl.chat import conversation_rows
from omrl.errors import OmrlError

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]


def test_a_tool_call_the_template_does_not_write_is_an_error(builtin_tokenizer):
    with pytest.raises(OmrlError) as info:
        conversation_rows(builtin_tokenizer, CHAT)
    assert str(info.value) == (
        "message 1 calls get_weather, but the chat template does not write tool calls (it wrote '<|im_end|>'), "
        "so SFT would learn the reply without them; write the call into the reply's content, or use a model "
        "whose template writes tool calls (`omrl check-template MODEL` shows)"
    )


def test_a_reply_with_text_and_a_dropped_call_is_an_error_too(builtin_tokenizer):
    chat = [CHAT[0], {**CHAT[1], "content": "Let me look."}, *CHAT[2:]]
    with pytest.raises(OmrlError, match=r"message 1 calls get_weather, but the chat template does not write"):
        conversation_rows(builtin_tokenizer, chat)
