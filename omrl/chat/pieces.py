"""A chat template's fixed pieces, so a new turn costs no re-render of the whole chat.

Rendering the chat through the jinja template every turn costs time in proportion to
the chat's length, and it was most of the rollout loop's time (issue 16). For most
templates the text added for one more user message is fixed pieces around its content::

    after a reply's content:          end    ('<|im_end|>\n')
    before a user message's content:  before ('<|im_start|>user\n')
    after it, plus the generation prompt: after ('<|im_end|>\n<|im_start|>assistant\n')

so a turn's increment is the text ``end + before + observation + after``, the very text
full renders give. A template gets pieces only when both hold, else :func:`turn_pieces`
answers None and the caller renders in full:

1. its syntax tree shows every message's content written out verbatim, steering
   nothing but emptiness and type tests, no dates, no count above ``MAX_COUNT``
   (:mod:`omrl.chat.template_check`)
   (Llama-3 trims contents, Qwen3 splits off thinking: they render in full);
2. probe chats of 0 to 16 exchanges, with contents that are empty, unicode, whitespace
   at the edges, special-token look-alikes or long, give the same pieces at every
   length and for every content (a template that numbers turns, drops earlier thinking
   or moves the system prompt into the last message fails here).

Encoding is where BPE could differ: ids of separately encoded strings can differ from
the ids of the joined string when a merge would cross the join. So a text is only
split where a special token stands at the join (``<|im_start|>``: the tokenizer splits
there itself), and each split is checked against encoding the joined text: the
increment's fixed ends on the probe contents, a shared opening (system prompt and
worked example, the same in every episode of an env, encoded once) the first time it
is used. A template's pieces are also checked against full renders of its first real turn.
"""

from __future__ import annotations

import json
import warnings
import weakref
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, Callable, Sequence

from omrl.chat.template_check import cacheable_template

Message = dict[str, str]
Render = Callable[..., str]  # omrl.chat.render
Encode = Callable[[Any, str], list[int]]  # omrl.chat.encode_text

PROBE_EXCHANGES = (0, 1, 2, 3, 4, 5, 8, 16)
PROBE_CONTENTS = (
    "",
    "x",
    " whitespace at both edges \n",
    "\n\nlines\n\tand a tab\n\n",
    "unicode: héllo — 世界 🎉",
    "<|im_end|>\n<|im_start|>assistant\n{{ not jinja }}",
    "long " * 200,
)
_SENTINEL = "\x1fomrl probe\x1f"
MAX_OPENINGS = 64  # cached opening ids per tokenizer (one per env and template in a run)


@dataclass(frozen=True)
class TurnPieces:
    """The fixed text a template puts around messages; see the module docstring."""

    end: str  # after a reply's content
    before: str  # before a user message that follows a reply
    after: str  # after that user message, with the generation prompt
    first_before: str  # before the first user message (after the system message, if any)
    first_after: str


@dataclass(frozen=True)
class _Split:
    """How ``head + content + tail`` is encoded: ``head_ids + encode(inner_head + content + inner_tail) + tail_ids``.

    ``head_ids`` end and ``tail_ids`` start at a special token; all empty ids when no split is proven.
    """

    head_ids: list[int]
    inner_head: str
    inner_tail: str
    tail_ids: list[int]

    def ids(self, tokenizer, content: str, encode: Encode) -> list[int]:
        return [*self.head_ids, *encode(tokenizer, self.inner_head + content + self.inner_tail), *self.tail_ids]


class _Entry:
    """One template and shape's pieces (None: render in full), and whether a real turn confirmed them."""

    __slots__ = ("pieces", "turn_checked")

    def __init__(self, pieces: TurnPieces | None):
        self.pieces = pieces
        self.turn_checked = False


class _TokenizerCache:
    """What one tokenizer's chats have proven; made anew when its vocabulary or special-token parsing changes."""

    __slots__ = ("state", "entries", "splits", "openings", "__weakref__")

    def __init__(self, state: tuple) -> None:
        self.state = state  # (vocabulary size with added tokens, split_special_tokens)
        self.entries: dict[tuple, _Entry] = {}
        self.splits: dict[tuple[str, str], _Split] = {}  # (head, tail) -> how to encode around a content
        self.openings: dict[tuple, list[int] | None] = {}  # shared messages -> their ids (None: not splittable)


_CACHES: "weakref.WeakKeyDictionary[Any, _TokenizerCache]" = weakref.WeakKeyDictionary()
_roles = itemgetter("role")
_contents = itemgetter("content")


def next_turn_ids(
    tokenizer,
    messages: Sequence[Message],
    user_content: str,
    sampled_end: str,
    kwargs: dict,
    render: Render,
    encode: Encode,
    rendered: Callable[[], str],
) -> list[int] | None:
    """The increment's ids after ``messages`` (ending with a reply) for a new user message; None: render in full.

    ``rendered`` computes the increment's text by full renders: the first turn of each
    template and shape is checked against it.
    """
    entry = _entry(tokenizer, messages, kwargs, "assistant", render)
    if entry is None or type(user_content) is not str:
        return None
    pieces = entry.pieces
    end = pieces.end
    if sampled_end:
        if not end.startswith(sampled_end):
            return None  # the template closes a reply otherwise than it was sampled: render in full
        end = end[len(sampled_end) :]
    ids = _split(tokenizer, end + pieces.before, pieces.after, encode).ids(tokenizer, user_content, encode)
    if not entry.turn_checked:
        text = rendered()
        if end + pieces.before + user_content + pieces.after != text or ids != encode(tokenizer, text):
            _contradicted(entry)
            return None
        entry.turn_checked = True
    return ids


def opening_ids(
    tokenizer, messages: Sequence[Message], kwargs: dict, render: Render, encode: Encode
) -> list[int] | None:
    """Ids of the opening ``messages`` (ending with a user message) plus the generation prompt; None: render in full.

    The messages before the last are encoded once and their ids reused.
    """
    entry = _entry(tokenizer, messages, kwargs, "user", render)
    if entry is None:
        return None
    pieces = entry.pieces
    shared = messages[:-1]
    first = len(shared) == (1 if shared and shared[0]["role"] == "system" else 0)
    head, tail = (pieces.first_before, pieces.first_after) if first else (pieces.before, pieces.after)
    split = _split(tokenizer, head, tail, encode)
    content = messages[-1]["content"]
    openings = _CACHES[tokenizer].openings
    key = (entry, *map(_contents, shared))
    if key in openings:
        shared_ids = openings[key]
        return None if shared_ids is None else [*shared_ids, *split.ids(tokenizer, content, encode)]
    shared_ids, ids, pieces_held = _shared_ids(tokenizer, messages, head, tail, split, kwargs, render, encode)
    if not pieces_held:
        _contradicted(entry)
    if len(openings) >= MAX_OPENINGS:
        del openings[next(iter(openings))]
    openings[key] = shared_ids
    return ids


def _contradicted(entry: _Entry) -> None:
    """A real chat rendered other than the pieces say: never use them again (the checks missed something)."""
    entry.pieces = None
    warnings.warn(
        "omrl.chat.pieces: a chat template passed the piece checks but a real chat rendered differently; "
        "rendering this template in full from now on",
        RuntimeWarning,
        stacklevel=4,
    )


def turn_pieces(tokenizer, render: Render, kwargs: dict | None = None, has_system: bool = True) -> TurnPieces | None:
    """The template's pieces for chats with (or without) a system message; None when they cannot be proven."""
    entry = _lookup(tokenizer, kwargs or {}, has_system, render)
    return None if entry is None else entry.pieces


def _entry(tokenizer, messages: Sequence[Message], kwargs: dict, last_role: str, render: Render) -> _Entry | None:
    """The cache entry for this chat's template and shape, when its pieces apply to ``messages``."""
    if not messages:
        return None
    first = messages[0]
    has_system = type(first) is dict and first.get("role") == "system"
    entry = _lookup(tokenizer, kwargs, has_system, render)
    if entry is None or entry.pieces is None or not _plain_chat(messages, has_system, last_role):
        return None
    return entry


def _lookup(tokenizer, kwargs: dict, has_system: bool, render: Render) -> _Entry | None:
    """The entry for the tokenizer's template, ``kwargs`` and shape, derived at first use; None: not cacheable."""
    try:
        cache = _CACHES.get(tokenizer)
        state = (len(tokenizer), bool(getattr(tokenizer, "split_special_tokens", False)))
        if cache is None or cache.state != state:  # new, or tokens added since: cached ids may be stale
            cache = _CACHES[tokenizer] = _TokenizerCache(state)
    except TypeError:  # a tokenizer that cannot be weakly referenced, or has no length
        return None
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "chat_template" in kwargs:  # none, or one chosen by name
        return None
    key = (template, json.dumps(kwargs, sort_keys=True, default=repr) if kwargs else "", has_system)
    entry = cache.entries.get(key)
    if entry is None:
        entry = cache.entries[key] = _Entry(_derive(tokenizer, kwargs, has_system, render))
    return entry


def _plain_chat(messages: Sequence[Message], has_system: bool, last_role: str) -> bool:
    """Whether ``messages`` is [system,] user, assistant, ... ending with ``last_role``, each {role, content: str}."""
    try:
        return (
            list(map(_roles, messages)) == _role_pattern(has_system, len(messages), last_role)
            and set(map(len, messages)) == {2}
            and set(map(type, map(_contents, messages))) == {str}
        )
    except (KeyError, TypeError):
        return False


@lru_cache(maxsize=1024)
def _role_pattern(has_system: bool, count: int, last_role: str) -> list[str] | None:
    """The roles of a plain chat of ``count`` messages ending with ``last_role`` (None: there is none)."""
    start = 1 if has_system else 0
    pattern = ["system"] * start + ["user", "assistant"] * count
    pattern = pattern[:count]
    return pattern if count > start and pattern[-1] == last_role else None


def _split(tokenizer, head: str, tail: str, encode: Encode) -> _Split:
    """How to encode ``head + content + tail`` with the fewest characters encoded per content (cached).

    ``head`` is cut after its last special token and ``tail`` before its first, where
    :func:`_hard_boundary` proves it for any content; kept only if the probe contents
    encode the same cut and joined.
    """
    splits = _CACHES[tokenizer].splits
    split = splits.get((head, tail))
    if split is not None:
        return split
    added = _added_tokens(tokenizer)
    cut_head = next(
        (i for i in range(len(head), 0, -1) if _hard_boundary(tokenizer, added, head[:i], head[i:], open_right=True)), 0
    )
    cut_tail = next(
        (i for i in range(len(tail)) if _hard_boundary(tokenizer, added, tail[:i], tail[i:], open_left=True)), len(tail)
    )
    split = _Split(
        encode(tokenizer, head[:cut_head]), head[cut_head:], tail[:cut_tail], encode(tokenizer, tail[cut_tail:])
    )
    if any(
        split.ids(tokenizer, content, encode) != encode(tokenizer, head + content + tail)
        for content in (*PROBE_CONTENTS, _SENTINEL)
    ):
        split = _Split([], head, tail, [])  # encode it all together
    splits[(head, tail)] = split
    return split


def _shared_ids(
    tokenizer,
    messages: Sequence[Message],
    head: str,
    tail: str,
    split: _Split,
    kwargs: dict,
    render: Render,
    encode: Encode,
) -> tuple[list[int] | None, list[int], bool]:
    """The ids of the rendered ``messages[:-1]`` when the opening's ids can be built on them exactly (else None),
    the opening's ids, and whether the pieces gave the rendered text."""
    shared = render(tokenizer, messages[:-1], **kwargs) if len(messages) > 1 else ""
    whole = render(tokenizer, messages, add_generation_prompt=True, **kwargs)
    exact = encode(tokenizer, whole)
    content = messages[-1]["content"]
    if whole != shared + head + content + tail:
        return None, exact, False
    if not _hard_boundary(tokenizer, _added_tokens(tokenizer), shared, head, open_right=True):
        return None, exact, True
    shared_ids = encode(tokenizer, shared)
    return (shared_ids if [*shared_ids, *split.ids(tokenizer, content, encode)] == exact else None), exact, True


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


def _derive(tokenizer, kwargs: dict, has_system: bool, render: Render) -> TurnPieces | None:
    """Render the probe chats and read off the pieces; None unless every probe agrees (see the module docstring)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not cacheable_template(template):
        return None
    found: dict[bool, tuple[str, ...]] = {}
    try:
        for exchanges in PROBE_EXCHANGES:
            for variant in range(2):
                history = _probe_history(has_system, exchanges, variant)
                base = render(tokenizer, history, **kwargs) if history else ""  # an empty chat cannot render
                probe = render(
                    tokenizer, [*history, {"role": "user", "content": _SENTINEL}], add_generation_prompt=True, **kwargs
                )
                if not probe.startswith(base) or probe.count(_SENTINEL) != 1:
                    return None
                before, _, after = probe[len(base) :].partition(_SENTINEL)
                for content in PROBE_CONTENTS:
                    if (
                        render(
                            tokenizer,
                            [*history, {"role": "user", "content": content}],
                            add_generation_prompt=True,
                            **kwargs,
                        )
                        != base + before + content + after
                    ):
                        return None
                pieces: tuple[str, ...] = (before, after)
                if exchanges:
                    prompt = render(tokenizer, history[:-1], add_generation_prompt=True, **kwargs)
                    reply = history[-1]["content"]
                    if not base.startswith(prompt + reply):
                        return None
                    pieces += (base[len(prompt) + len(reply) :],)
                if found.setdefault(exchanges > 0, pieces) != pieces:
                    return None
    except Exception:  # noqa: BLE001 - a template that raises on a probe is rendered in full
        return None
    (first_before, first_after), (before, after, end) = found[False], found[True]
    return TurnPieces(end, before, after, first_before, first_after)


def _probe_history(has_system: bool, exchanges: int, variant: int) -> list[Message]:
    contents = PROBE_CONTENTS
    history = [{"role": "system", "content": contents[variant * 3]}] if has_system else []
    for i in range(exchanges):
        history += [
            {"role": "user", "content": contents[(i + variant) % len(contents)]},
            {"role": "assistant", "content": contents[(i * 3 + variant + 2) % len(contents)]},
        ]
    return history
