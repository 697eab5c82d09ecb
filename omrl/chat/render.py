"""Messages to text: a chat template applied, the layer above :mod:`omrl.chat.encoding` (the only part of
the package it imports).

:func:`render` is ``apply_chat_template`` with the text of tool specs and documents marked as the
messages' is, a string content given as one text part to a template that reads only parts (VLMs), and a
system message folded into the first user message for a template that refuses the role (Gemma 1 and 2).
Every layer above renders through it.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from omrl.chat.encoding import mark_value
from omrl.errors import OmrlError

Message = dict[str, Any]


def render(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """The chat template applied to ``messages`` as text."""
    if not getattr(tokenizer, "chat_template", None):
        raise OmrlError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "use a chat/instruct model or set tokenizer.chat_template"
        )
    from jinja2 import TemplateError

    messages = list(messages)
    kwargs = _marked_specs(tokenizer, kwargs)
    if _wants_parts(tokenizer):
        messages = [_as_parts(m) for m in messages]
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except TemplateError:
        folded = _system_folded(messages)
        if folded is None:
            raise
        return tokenizer.apply_chat_template(
            folded, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )


SPEC_KWARGS = ("tools", "documents")  # text the template is given beside the messages (an MCP server's tools)


def _marked_specs(tokenizer, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the text of its tool specs and documents marked (:mod:`omrl.chat.encoding`), as the
    messages' is: a tool described as ``<|im_end|><|im_start|>system ...`` must not open a system turn."""
    if not any(kwargs.get(key) for key in SPEC_KWARGS):
        return kwargs
    return {key: mark_value(tokenizer, value) if key in SPEC_KWARGS else value for key, value in kwargs.items()}


_PARTS: "weakref.WeakKeyDictionary[Any, dict[str, bool]]" = weakref.WeakKeyDictionary()
_PART_PROBE = "omrl text probe"


def _wants_parts(tokenizer) -> bool:
    """Whether the template writes a message's text only from content parts (SmolVLM, Idefics3 and LLaVA-NeXT
    templates write nothing, or raise, for a string): then every string content is given as one text part."""
    try:
        known = _PARTS.setdefault(tokenizer, {})
    except TypeError:
        known = {}
    key = str(tokenizer.chat_template)
    if key not in known:
        known[key] = not _renders(tokenizer, _PART_PROBE) and _renders(
            tokenizer, [{"type": "text", "text": _PART_PROBE}]
        )
    return known[key]


def _renders(tokenizer, content: Any) -> bool:
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses this form of content
        return False
    return _PART_PROBE in text


def _as_parts(message: Message) -> Message:
    content = message.get("content")
    return {**message, "content": [{"type": "text", "text": content}]} if isinstance(content, str) else message


def _system_folded(messages: list[Message]) -> list[Message] | None:
    """A chat whose system message opens its first user message, for templates that refuse a system role
    (Gemma 1 and 2 raise on one; their model cards fold it so); None where there is none to fold."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    return [{**messages[1], "content": f"{system}\n\n{user}"}, *messages[2:]]
