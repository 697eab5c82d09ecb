"""Token-exact conversations: chat templates, the two history modes, whole conversations as rows.

- :mod:`omrl.chat.render`: rendering and encoding, the first prompt, append-only increments;
- :mod:`omrl.chat.pieces`: a template's fixed pieces, so a turn costs no full re-render;
- :mod:`omrl.chat.history`: ``keep`` and ``as_template``, for templates that rewrite history;
- :mod:`omrl.chat.specials`: message text never becomes special tokens, only the template's structure;
- :mod:`omrl.chat.conversation`: whole conversations (SFT, reward-model data) as the rollout lays them out;
- :mod:`omrl.chat.probe`: what a template does to a chat (``omrl check-template``).
"""

from omrl.chat.conversation import conversation_rows, encode_conversation, reply_text
from omrl.chat.history import HISTORY_MODES, check_history, next_prompt
from omrl.chat.render import (
    Message,
    TemplateRewrites,
    encode_chat,
    encode_text,
    generation_end,
    next_turn_ids,
    prompt_ids,
    render,
    rendered_turn_text,
)
from omrl.chat.specials import encode_plain, mark_messages

__all__ = [
    "HISTORY_MODES",
    "Message",
    "TemplateRewrites",
    "check_history",
    "conversation_rows",
    "encode_chat",
    "encode_conversation",
    "encode_plain",
    "encode_text",
    "generation_end",
    "mark_messages",
    "next_prompt",
    "next_turn_ids",
    "prompt_ids",
    "render",
    "rendered_turn_text",
    "reply_text",
]
