"""Text to ids, with a message's text never parsed into special tokens: the bottom layer of
:mod:`omrl.chat` (it imports nothing of the package).

A chat template's own structure (``<|im_start|>``, ``<|im_end|>``, ...) must become special
tokens, but the same strings inside a message (an env that echoes an invalid action, a web
page, a tool's output, a reply that spells one out) must stay text: else an observation can
close its turn and open a system message of its own, and SFT trains a model on end-of-turn
tokens it never sampled.

So every entry point that renders messages first *marks* them: each special token's string
inside a message's text is replaced by a private-use character that stands for it
(:func:`mark_messages`). The template renders the marked text as it would the original, and
:func:`encode_chat` encodes the result: the special tokens still in it are the template's
own, and the pieces between them are encoded with no special token parsed, the marks turned
back into the strings they stand for. A text with no mark encodes exactly as
:func:`encode_text` encodes it, so chats without such strings are unchanged.
"""

from __future__ import annotations

import re
import weakref
from functools import lru_cache
from typing import Any, Sequence

MARK_BASE = 0xF0000  # Supplementary Private Use Area-A: no tokenizer or text uses it for anything
MEMO_TEXTS = 4096  # marked texts remembered per tokenizer (forgotten all at once when full)


class _Marks:
    """One tokenizer's special-token strings, the mark of each, and how to find them."""

    __slots__ = (
        "size",
        "specials",
        "ids",
        "to_mark",
        "from_mark",
        "find_special",
        "find_mark",
        "only_special",
        "plain",
        "find_plain",
        "marked",
        "marked_reply",
        "anchor",
        "anchor_id",
        "__weakref__",
    )

    def __init__(self, tokenizer: Any) -> None:
        self.size = len(tokenizer)  # tokens added later make these stale
        added = (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
        # every added token, special or not (Qwen's <think> and <tool_response> are added, not special), longest
        # first: one may contain another
        pairs = sorted(((str(t), int(i)) for i, t in added if str(t)), key=lambda pair: -len(pair[0]))
        special = {str(t) for _, t in added if getattr(t, "special", False)}
        self.specials = [s for s, _ in pairs]
        self.ids = dict(pairs)
        self.to_mark = {s: chr(MARK_BASE + i) for i, s in enumerate(self.specials)}
        self.from_mark = {mark: s for s, mark in self.to_mark.items()}
        self.find_special = re.compile("|".join(map(re.escape, self.specials))) if self.specials else None
        self.find_mark = re.compile("[" + "".join(self.from_mark) + "]") if self.specials else None
        # a reply's own text marks special tokens only: a <tool_call> in it was sampled as that added token
        self.only_special = re.compile("|".join(re.escape(s) for s in self.specials if s in special) or "(?!)")
        self.plain = [s for s in self.specials if s not in special]
        self.find_plain = re.compile("|".join(map(re.escape, self.plain))) if self.plain else None
        # text -> marked text (None: nothing to mark): a chat's earlier messages are the same strings every
        # turn (and a str caches its hash), so marking a long history costs a lookup per message, not a scan
        self.marked: dict[str, str | None] = {}
        self.marked_reply: dict[str, str | None] = {}
        # a special token that takes in no text after it: encoded before a text that follows a special token in
        # a longer one, so the text encodes as that span of the whole does (encode_continued)
        clean = (
            (str(t), int(i))
            for i, t in sorted(added, key=lambda pair: int(pair[0]))
            if getattr(t, "special", False)
            and str(t)
            and not getattr(t, "rstrip", False)
            and not getattr(t, "single_word", False)
        )
        self.anchor, self.anchor_id = next(clean, (None, None))


_MARKS: "weakref.WeakKeyDictionary[Any, _Marks]" = weakref.WeakKeyDictionary()


def _marks(tokenizer: Any) -> _Marks:
    try:
        marks = _MARKS.get(tokenizer)
        if marks is None or marks.size != len(tokenizer):
            marks = _MARKS[tokenizer] = _Marks(tokenizer)
        return marks
    except TypeError:  # not weakly referenceable: build each time
        return _Marks(tokenizer)


def mark(tokenizer: Any, text: str) -> str:
    """``text`` with every special token's string replaced by its mark (a no-op on marked text)."""
    return _mark_text(_marks(tokenizer), text)


def _mark_text(marks: _Marks, text: str, reply: bool = False) -> str:
    if marks.find_special is None or not isinstance(text, str):
        return text
    memo, find = (marks.marked_reply, marks.only_special) if reply else (marks.marked, marks.find_special)
    if text not in memo:
        if len(memo) >= MEMO_TEXTS:
            memo.clear()
        found = find.search(text)
        memo[text] = None if found is None else find.sub(lambda m: marks.to_mark[m.group()], text)
    done = memo[text]
    return text if done is None else done  # unchanged: the very string, so callers can tell


def mark_messages(tokenizer: Any, messages: Sequence[dict]) -> list[dict]:
    """The messages with their text marked: content, reasoning, a tool message's name and each tool
    call's name and arguments (the template's roles and keys are structure, not text)."""
    marks = _marks(tokenizer)  # once for all the messages
    if marks.find_special is None:
        return messages
    marked = [_mark_message(marks, m) for m in messages]
    # the common case, no special token's string anywhere: the very messages (no copies each turn)
    return messages if all(a is b for a, b in zip(marked, messages)) else marked


TEXT_KEYS = ("content", "reasoning_content", "thinking", "reasoning", "name")


def _mark_message(marks: _Marks, message: dict) -> dict:
    """``message`` with its text marked; ``message`` itself when there was nothing to mark."""
    out = message
    reply = message.get("role") == "assistant"
    for key in TEXT_KEYS:
        value = message.get(key)
        if value.__class__ is str:
            marked = _mark_text(marks, value, reply)
            if marked is not value:
                out = dict(out) if out is message else out
                out[key] = marked
    if message.get("tool_calls"):
        calls = [_mark_value(marks, call) for call in message["tool_calls"]]
        if calls != message["tool_calls"]:
            out = dict(out) if out is message else out
            out["tool_calls"] = calls
    return out


def mark_value(tokenizer: Any, value: Any) -> Any:
    """``value`` (text, or lists and dicts of it: tool specs) with every string marked."""
    marks = _marks(tokenizer)
    return value if marks.find_special is None else _mark_value(marks, value)


def _mark_value(marks: _Marks, value: Any) -> Any:
    if isinstance(value, str):
        return _mark_text(marks, value)
    if isinstance(value, dict):
        return {key: _mark_value(marks, item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mark_value(marks, item) for item in value]
    return value


def unmark(tokenizer: Any, text: str) -> str:
    """``text`` with its marks turned back into the special-token strings they stand for."""
    marks = _marks(tokenizer)
    if marks.find_mark is None:
        return text
    return marks.find_mark.sub(lambda m: marks.from_mark[m.group()], text)


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


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` with no added token parsed (a special or added token's string is encoded as text: an
    added one's first character apart from the rest, since the tokenizer parses those strings whole)."""
    if not text:
        return []
    marks = _marks(tokenizer)
    if marks.find_plain is None or not marks.find_plain.search(text):
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    ids: list[int] = []
    start = 0
    for found in marks.find_plain.finditer(text):
        for piece in (text[start : found.start()], found.group()[:1], found.group()[1:]):
            ids += tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True) if piece else []
        start = found.end()
    rest = text[start:]
    return ids + (tokenizer.encode(rest, add_special_tokens=False, split_special_tokens=True) if rest else [])


def encode_chat(tokenizer: Any, text: str) -> list[int]:
    """Ids of a rendered chat whose message text was marked (:func:`mark_messages`): the special tokens in
    ``text`` are the template's and become their ids; the text between them is encoded with none parsed, its
    marks restored. A text without marks is encoded by :func:`encode_text`, exactly as before marks existed."""
    marks = _marks(tokenizer)
    if marks.find_mark is None or not marks.find_mark.search(text):
        return encode_text(tokenizer, text)
    ids: list[int] = []
    start = 0
    for special in marks.find_special.finditer(text):  # type: ignore[union-attr]
        ids += _encode_piece(tokenizer, marks, text[start : special.start()], continued=start > 0)
        ids.append(marks.ids[special.group()])
        start = special.end()
    return ids + _encode_piece(tokenizer, marks, text[start:], continued=start > 0)


def _encode_piece(tokenizer: Any, marks: _Marks, piece: str, continued: bool) -> list[int]:
    """Ids of the text between two of a rendered chat's special tokens (after one where ``continued``): a piece
    with no mark as the tokenizer encodes that span of the whole; one holding marks with none parsed."""
    if continued and piece and not marks.find_mark.search(piece):  # type: ignore[union-attr]
        return _after_anchor(tokenizer, marks, piece, encode_text)
    return encode_plain(tokenizer, unmark(tokenizer, piece))


def encode_continued(tokenizer: Any, text: str) -> list[int]:
    """Ids of a chat's ``text`` where it follows a special token in a longer text (a turn's increment after the
    reply's end token, a reply after its generation prompt): the tokenizer's ids for that span of the whole, as
    :func:`encode_chat` gives them. A tokenizer that marks a text's start encodes it alone otherwise (Metaspace
    with ``prepend_scheme='first'``, as Llama's and Mistral's SentencePiece tokenizers convert, opens it with
    '▁'), so the text is encoded after a special token that takes in no text, whose id is then dropped."""
    if not text:
        return []
    return _after_anchor(tokenizer, _marks(tokenizer), text, encode_chat)


def _after_anchor(tokenizer: Any, marks: _Marks, text: str, encode: Any) -> list[int]:
    if marks.anchor is None:
        return encode(tokenizer, text)
    ids = encode(tokenizer, marks.anchor + text)
    return ids[1:] if ids and ids[0] == marks.anchor_id else encode(tokenizer, text)


def encode_reply(tokenizer: Any, text: str) -> list[int]:
    """Ids of a model's reply that came back as text (an endpoint that sends no ids): a special token's
    string in it is text, since the server's detokenizer drops the real ones; an added token's (``<think>``,
    ``<tool_call>``) is that token, as the model samples it; encoded as it follows the prompt
    (:func:`encode_continued`). Not memoised: a reply is seen once."""
    marks = _marks(tokenizer)
    if marks.find_special is not None and marks.only_special.search(text):
        text = marks.only_special.sub(lambda m: marks.to_mark[m.group()], text)
    return encode_continued(tokenizer, text)
