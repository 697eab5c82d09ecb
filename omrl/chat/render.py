"""Token-exact conversations: a chat is built by appending chat-template increments.

The rollout never decodes and re-encodes a model turn. It keeps the sampled ids
as they are and appends, after each turn, only the ids of the text the chat
template adds for the next message (closing newline, the user's observation,
the next generation prompt). SFT builds its sequences the same way, so a model
is trained on the token layout it will later generate in.

Works for any chat template whose rendering of a longer chat starts with the
rendering of the shorter one (ChatML, Llama-3, SmolLM2, Qwen2.5); others raise.

The increments are defined by full renders of the chat (:func:`rendered_turn_text`);
for templates whose pieces :mod:`omrl.chat.pieces` can prove fixed, the same text is
built from cached pieces, and a shared opening's ids are encoded once.
"""

from __future__ import annotations

import weakref
from functools import lru_cache
from typing import Any, Sequence

from omrl.chat import pieces
from omrl.chat.specials import encode_marked, mark, mark_messages, mark_value
from omrl.errors import OmrlError

Message = dict[str, Any]


class TemplateRewrites(OmrlError):
    """Rendering a longer chat changed the text of a shorter one: the template rewrites history."""


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
    """``kwargs`` with the text of its tool specs and documents marked (:mod:`omrl.chat.specials`), as the
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


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of a template fragment (special tokens in the text are parsed as such).

    The ids of ``tokenizer.encode(text, add_special_tokens=False)``. A fast tokenizer
    whose encoding transformers does not customise is asked directly (about half the
    time: no offsets, no Python wrapping) while its Rust tokenizer is in the state
    transformers would put it in (no truncation, no padding, special tokens parsed
    as ``split_special_tokens`` says); otherwise transformers encodes (and resets that state).
    """
    if not text:
        return []
    backend = tokenizer.backend_tokenizer if _plain_fast(type(tokenizer)) else None
    if (
        backend is not None
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
    return tokenizer.encode(text, add_special_tokens=False)


@lru_cache(maxsize=None)
def _plain_fast(cls: type) -> bool:
    """Whether ``cls`` encodes as transformers' fast tokenizers do: straight through its Rust tokenizer."""
    try:
        from tokenizers import Tokenizer
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return (
        issubclass(cls, TokenizersBackend)
        and cls.encode is PreTrainedTokenizerBase.encode
        and cls._encode_plus is TokenizersBackend._encode_plus
        and hasattr(Tokenizer, "encode_batch_fast")
    )


def prompt_ids(tokenizer, messages: Sequence[Message], **kwargs: Any) -> list[int]:
    """Ids of the opening messages (system, first user) plus the first generation prompt.

    Exactly the ids of the rendered text, no message's text parsed into special tokens
    (:mod:`omrl.chat.specials`); the messages before the last are encoded once per tokenizer
    where :mod:`omrl.chat.pieces` proves that splitting there is exact.
    """
    messages = mark_messages(tokenizer, messages)
    ids = pieces.opening_ids(tokenizer, messages, kwargs, render, encode_chat)
    if ids is None:
        ids = encode_chat(tokenizer, render(tokenizer, messages, add_generation_prompt=True, **kwargs))
    return ids


def encode_chat(tokenizer, text: str) -> list[int]:
    """Ids of a rendered chat whose message text was marked (:func:`omrl.chat.specials.mark_messages`):
    the template's special tokens parsed, the messages' never."""
    return encode_marked(tokenizer, text, encode_text)


def _suffix(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise TemplateRewrites(
            f"the chat template is not prefix-stable ({what}): rendering a longer chat "
            "changed earlier text, so turns cannot be appended token-exactly; "
            "`omrl check-template MODEL` shows where"
        )
    return longer[len(shorter) :]


def generation_end(tokenizer, messages: Sequence[Message], **kwargs: Any) -> str:
    """The text the template puts after the last assistant message's content (e.g. '<|im_end|>\\n')."""
    content = messages[-1]["content"]
    text = render(tokenizer, messages, **kwargs)
    # locate the content from the front: a short reply such as "end" also occurs inside "<|im_end|>"
    before = render(tokenizer, messages[:-1], add_generation_prompt=True, **kwargs) + content
    if not text.startswith(before):
        raise TemplateRewrites(
            "the chat template rewrites assistant messages; cannot append turns token-exactly; "
            "`omrl check-template MODEL` shows where"
        )
    return text[len(before) :]


def next_turn_ids(
    tokenizer, messages: Sequence[Message], user_content: str, sampled_end: str, **kwargs: Any
) -> list[int]:
    """Ids to append after a model turn so the chat continues with ``user_content``.

    ``messages`` ends with the assistant turn just generated (its decoded text
    without the tokens that end it); ``sampled_end`` is the text of those tokens
    (:func:`omrl.chat.replies.sampled_end`, e.g. ``'<|im_end|>'``). When it is empty
    (the turn was cut at the token limit), the template's closing is part of the
    increment, so it carries loss_mask 0 like every template token.

    Exactly the ids of :func:`rendered_turn_text`'s text; built from the template's
    cached pieces where :mod:`omrl.chat.pieces` can prove them (a full render per turn
    costs time in proportion to the chat's length).
    """
    user_content = mark(tokenizer, user_content)
    # the pieces read only the history's roles, so its text is marked (a pass over every message) only
    # where the chat is rendered in full
    ids = pieces.next_turn_ids(
        tokenizer,
        messages,
        user_content,
        sampled_end,
        kwargs,
        render,
        encode_chat,
        rendered=lambda: rendered_turn_text(
            tokenizer, mark_messages(tokenizer, messages), user_content, sampled_end, **kwargs
        ),
    )
    if ids is None:
        ids = encode_chat(
            tokenizer,
            rendered_turn_text(tokenizer, mark_messages(tokenizer, messages), user_content, sampled_end, **kwargs),
        )
    return ids


def rendered_turn_text(
    tokenizer, messages: Sequence[Message], user_content: str, sampled_end: str, **kwargs: Any
) -> str:
    """The text of :func:`next_turn_ids`' increment, by rendering the chat without and with the new message."""
    after = generation_end(tokenizer, messages, **kwargs)
    if sampled_end and after.startswith(sampled_end):
        after = after[len(sampled_end) :]
    before = render(tokenizer, messages, **kwargs)
    longer = render(
        tokenizer, [*messages, {"role": "user", "content": user_content}], add_generation_prompt=True, **kwargs
    )
    return after + _suffix(longer, before, "adding a user turn")
