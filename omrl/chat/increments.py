"""The ids a new turn adds to a running conversation: the first prompt, and what follows each reply. The
layer above :mod:`omrl.chat.pieces` (the turn's text) and below :mod:`omrl.chat.history` (which chooses
between these increments and full renders).

A row's ids are never re-encoded: after the model's reply, the ids appended are the template's text
for the new user message and the next generation prompt, exactly the difference between full renders
of the chat without and with it (:func:`omrl.chat.pieces.rendered_turn_text`). That holds while the
template renders the longer chat as an extension of the shorter one (ChatML, Llama-3, SmolLM2,
Qwen2.5); others raise :class:`omrl.chat.pieces.TemplateRewrites`.

Where a template's pieces are proven (:mod:`omrl.chat.pieces`), the text is built from them instead,
and encoding is where BPE could differ: ids of separately encoded strings can differ from the ids of
the joined string when a merge would cross the join. So a text is only split where a special token
stands at the join (``<|im_start|>``: the tokenizer splits there itself), and each split is checked
against encoding the joined text: the increment's fixed ends on the probe contents, a shared opening
(system prompt and worked example, the same in every episode of an env, encoded once) the first time
it is used, and a template's first real turn against its full renders.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.encoding import encode_chat, encode_continued, mark, mark_messages
from omrl.chat.pieces import (
    PROBE_CONTENTS,
    SENTINEL,
    contradicted,
    entry_for,
    rendered_turn_text,
    tokenizer_state,
)
from omrl.chat.render import Message, render
from omrl.chat.replies import after_sampled_end

MAX_OPENINGS = 64  # cached opening ids per tokenizer (one per env and template in a run)


@dataclass(frozen=True)
class _Split:
    """How ``head + content + tail`` is encoded: ``head_ids + encode(inner_head + content + inner_tail) + tail_ids``.

    ``head_ids`` end and ``tail_ids`` start at a special token; all empty ids when no split is proven.
    ``continued``: ``head`` follows a special token in the row (a turn's increment after the reply's end), so
    it is encoded as that span of the whole (:func:`~omrl.chat.encoding.encode_continued`), not as a text's start.
    """

    head_ids: list[int]
    inner_head: str
    inner_tail: str
    tail_ids: list[int]
    continued: bool = True

    def ids(self, tokenizer, content: str) -> list[int]:
        encode = encode_continued if self.head_ids or self.continued else encode_chat
        return [*self.head_ids, *encode(tokenizer, self.inner_head + content + self.inner_tail), *self.tail_ids]


class _IdsCache:
    """What one tokenizer's chats have proven about ids, kept while :func:`~omrl.chat.pieces.tokenizer_state` holds."""

    __slots__ = ("state", "splits", "openings", "__weakref__")

    def __init__(self, state: tuple) -> None:
        self.state = state
        self.splits: dict[tuple[str, str, bool], _Split] = {}  # (head, tail, continued) -> how to encode around it
        self.openings: dict[tuple, list[int] | None] = {}  # shared messages -> their ids (None: not splittable)


_CACHES: "weakref.WeakKeyDictionary[Any, _IdsCache]" = weakref.WeakKeyDictionary()


def prompt_ids(tokenizer, messages: Sequence[Message], **kwargs: Any) -> list[int]:
    """Ids of the opening messages (system, first user) plus the first generation prompt.

    Exactly the ids of the rendered text, no message's text parsed into special tokens
    (:mod:`omrl.chat.encoding`); the messages before the last are encoded once per tokenizer
    where splitting there is proven exact.
    """
    messages = mark_messages(tokenizer, messages)
    ids = _opening_ids(tokenizer, messages, kwargs)
    if ids is None:
        ids = encode_chat(tokenizer, render(tokenizer, messages, add_generation_prompt=True, **kwargs))
    return ids


def next_turn_ids(
    tokenizer, messages: Sequence[Message], user_content: str, sampled_end: str, **kwargs: Any
) -> list[int]:
    """Ids to append after a model turn so the chat continues with ``user_content``.

    ``messages`` ends with the assistant turn just generated (its decoded text
    without the tokens that end it); ``sampled_end`` is the text of those tokens
    (:func:`omrl.chat.replies.sampled_end`, e.g. ``'<|im_end|>'``). When it is empty
    (the turn was cut at the token limit), the template's closing is part of the
    increment, so it carries loss_mask 0 like every template token.

    Exactly the ids of :func:`omrl.chat.pieces.rendered_turn_text`'s text; built from the
    template's cached pieces where they are proven (a full render per turn costs time in
    proportion to the chat's length).
    """
    user_content = mark(tokenizer, user_content)
    # the pieces read only the history's roles, so its text is marked (a pass over every message) only
    # where the chat is rendered in full
    ids = _turn_ids(tokenizer, messages, user_content, sampled_end, kwargs)
    if ids is None:
        ids = encode_continued(  # the increment follows the reply's end token
            tokenizer,
            rendered_turn_text(tokenizer, mark_messages(tokenizer, messages), user_content, sampled_end, **kwargs),
        )
    return ids


def _turn_ids(
    tokenizer, messages: Sequence[Message], user_content: str, sampled_end: str, kwargs: dict
) -> list[int] | None:
    """The increment's ids after ``messages`` (ending with a reply) for a new user message, built from the
    pieces; None: render in full. The first turn of each template and shape is checked against full renders."""
    entry = entry_for(tokenizer, messages, kwargs, "assistant")
    if entry is None or type(user_content) is not str:
        return None
    pieces = entry.pieces
    end = pieces.end
    if sampled_end:
        end = after_sampled_end(end, sampled_end)
        if end is None:
            return None  # the template closes a reply otherwise than it was sampled: render in full
    ids = _split(tokenizer, end + pieces.before, pieces.after, True).ids(tokenizer, user_content)
    if not entry.turn_checked:
        text = rendered_turn_text(tokenizer, mark_messages(tokenizer, messages), user_content, sampled_end, **kwargs)
        if end + pieces.before + user_content + pieces.after != text or ids != encode_continued(tokenizer, text):
            contradicted(entry)
            return None
        entry.turn_checked = True
    return ids


def _opening_ids(tokenizer, messages: Sequence[Message], kwargs: dict) -> list[int] | None:
    """Ids of the opening ``messages`` (ending with a user message) plus the generation prompt, built from the
    pieces; None: render in full. The messages before the last are encoded once and their ids reused."""
    entry = entry_for(tokenizer, messages, kwargs, "user")
    if entry is None:
        return None
    pieces = entry.pieces
    shared = messages[:-1]
    first = len(shared) == (1 if shared and shared[0]["role"] == "system" else 0)
    head, tail = (pieces.first_before, pieces.first_after) if first else (pieces.before, pieces.after)
    split = _split(tokenizer, head, tail, bool(shared))  # the first message's head starts the text
    content = messages[-1]["content"]
    openings = _cache(tokenizer).openings
    key = (entry, *(message["content"] for message in shared))
    if key in openings:
        shared_ids = openings[key]
        return None if shared_ids is None else [*shared_ids, *split.ids(tokenizer, content)]
    shared_ids, ids, pieces_held = _shared_ids(tokenizer, messages, head, tail, split, kwargs)
    if not pieces_held:
        contradicted(entry)
    if len(openings) >= MAX_OPENINGS:
        del openings[next(iter(openings))]
    openings[key] = shared_ids
    return ids


def _cache(tokenizer) -> _IdsCache:
    """The tokenizer's ids cache (only asked for tokenizers :func:`~omrl.chat.pieces.entry_for` found pieces for: weakly
    referenceable, with a length)."""
    cache = _CACHES.get(tokenizer)
    state = tokenizer_state(tokenizer)
    if cache is None or cache.state != state:  # new, or tokens added since: cached ids may be stale
        cache = _CACHES[tokenizer] = _IdsCache(state)
    return cache


def _split(tokenizer, head: str, tail: str, continued: bool) -> _Split:
    """How to encode ``head + content + tail`` (following a special token where ``continued``, else at the row's
    start) with the fewest characters encoded per content (cached).

    ``head`` is cut after its last special token and ``tail`` before its first, where
    :func:`_hard_boundary` proves it for any content; kept only if the probe contents
    encode the same cut and joined.
    """
    splits = _cache(tokenizer).splits
    split = splits.get((head, tail, continued))
    if split is not None:
        return split
    added = _added_tokens(tokenizer)
    cut_head = next(
        (i for i in range(len(head), 0, -1) if _hard_boundary(tokenizer, added, head[:i], head[i:], open_right=True)), 0
    )
    cut_tail = next(
        (i for i in range(len(tail)) if _hard_boundary(tokenizer, added, tail[:i], tail[i:], open_left=True)), len(tail)
    )
    encode = encode_continued if continued else encode_chat
    split = _Split(
        encode(tokenizer, head[:cut_head]),
        head[cut_head:],
        tail[:cut_tail],
        encode_continued(tokenizer, tail[cut_tail:]),
        continued,
    )
    if any(
        split.ids(tokenizer, content) != encode(tokenizer, head + content + tail)
        for content in (*PROBE_CONTENTS, SENTINEL)
    ):
        split = _Split([], head, tail, [], continued)  # encode it all together
    splits[(head, tail, continued)] = split
    return split


def _shared_ids(
    tokenizer, messages: Sequence[Message], head: str, tail: str, split: _Split, kwargs: dict
) -> tuple[list[int] | None, list[int], bool]:
    """The ids of the rendered ``messages[:-1]`` when the opening's ids can be built on them exactly (else None),
    the opening's ids, and whether the pieces gave the rendered text."""
    shared = render(tokenizer, messages[:-1], **kwargs) if len(messages) > 1 else ""
    whole = render(tokenizer, messages, add_generation_prompt=True, **kwargs)
    exact = encode_chat(tokenizer, whole)
    content = messages[-1]["content"]
    if whole != shared + head + content + tail:
        return None, exact, False
    if not _hard_boundary(tokenizer, _added_tokens(tokenizer), shared, head, open_right=True):
        return None, exact, True
    shared_ids = encode_chat(tokenizer, shared)
    return (shared_ids if [*shared_ids, *split.ids(tokenizer, content)] == exact else None), exact, True


def _added_tokens(tokenizer) -> list[Any]:
    """The tokenizer's added tokens (AddedToken objects: content and flags)."""
    return list((getattr(tokenizer, "added_tokens_decoder", None) or {}).values())


def _hard_boundary(
    tokenizer, added: list[Any], left: str, right: str, open_left: bool = False, open_right: bool = False
) -> bool:
    """Whether encoding ``left + right`` must split between them, so the two encode apart exactly:
    a special token that takes in no neighbouring text ends ``left`` or opens ``right``, and no
    added token can span the boundary. ``open_left`` (``open_right``): any text may come
    before ``left`` (after ``right``)."""
    if not left and not open_left or not right and not open_right:
        return True  # the text's own start or end
    if getattr(tokenizer, "split_special_tokens", False):
        return False
    for token in map(str, added):
        for k in range(1, len(token)):
            start, rest = token[:k], token[k:]
            if (left.endswith(start) or open_left and start.endswith(left)) and (
                right.startswith(rest) or open_right and rest.startswith(right)
            ):
                return False
    ends = max((t for t in added if left.endswith(str(t))), key=lambda t: len(str(t)), default=None)
    opens = max((t for t in added if right.startswith(str(t))), key=lambda t: len(str(t)), default=None)
    return _clean_special(ends, "rstrip") or _clean_special(opens, "lstrip")


def _clean_special(token: Any, strip_side: str) -> bool:
    """Whether ``token`` is a special token that takes in no text beside it on the boundary's side."""
    return (
        token is not None
        and bool(getattr(token, "special", False))
        and not getattr(token, strip_side, False)
        and not getattr(token, "single_word", False)
    )
