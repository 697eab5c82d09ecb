"""Token-exact conversations: chat templates, the two history modes, whole conversations as rows.

The modules are layered, each importing only modules below it (``tests/test_architecture.py`` holds
the order). What an env observation passes through on its way to trained ids, top to bottom:

- :mod:`omrl.chat.history`: ``keep`` and ``as_template``, for templates that rewrite history;
- :mod:`omrl.chat.increments`: the ids a new turn adds (the first prompt, each turn after a reply);
- :mod:`omrl.chat.pieces`: a turn's text, from a template's proven fixed pieces or full renders;
- :mod:`omrl.chat.render`: messages to text through the template;
- :mod:`omrl.chat.encoding`: text to ids, message text never parsed into special tokens.

Beside them: :mod:`omrl.chat.replies` (a sampled reply read as the family's server reads it, above
render), :mod:`omrl.chat.tool_calls` with :mod:`omrl.chat.tool_formats` and
:mod:`omrl.chat.tool_literals` (tool calls read from text, at the bottom), :mod:`omrl.chat.template_check`
(a template's jinja read, at the bottom) and :mod:`omrl.chat.bounded_render` (its probe chats rendered
in a process of their own, under a memory limit); on top, :mod:`omrl.chat.conversation` (whole conversations,
SFT and reward-model data, as the rollout lays them out), :mod:`omrl.chat.probe` and
:mod:`omrl.chat.conformance` (``omrl check-template``). Modules of the package import each other by their
own paths, never this one.
"""

from omrl.chat.conversation import conversation_rows, encode_conversation, reply_text
from omrl.chat.encoding import encode_chat, encode_plain, encode_text, mark_messages
from omrl.chat.history import HISTORY_MODES, check_history, next_prompt
from omrl.chat.increments import next_turn_ids, prompt_ids
from omrl.chat.pieces import TemplateRewrites, generation_end, rendered_turn_text
from omrl.chat.render import Message, render

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
