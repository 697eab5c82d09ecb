"""The parts of a turn as text: the fixed pieces a template writes around a message, and a turn's text by
full renders. The layer above :mod:`omrl.chat.render` and :mod:`omrl.chat.template_check`, below
:mod:`omrl.chat.increments`, which turns these texts into ids.

Rendering the chat through the jinja template every turn costs time in proportion to
the chat's length, and it was most of the rollout loop's time (issue 16). For most
templates the text added for one more user message is fixed pieces around its content::

    after a reply's content:          end    ('<|im_end|>\\n')
    before a user message's content:  before ('<|im_start|>user\\n')
    after it, plus the generation prompt: after ('<|im_end|>\\n<|im_start|>assistant\\n')

so a turn's increment is the text ``end + before + observation + after``, the very text
full renders give (:func:`rendered_turn_text`). A template gets pieces only when both hold,
else :func:`turn_pieces` answers None and the caller renders in full:

1. its syntax tree shows every message's content written out verbatim, steering
   nothing but emptiness and type tests, no dates, no count above ``MAX_COUNT``
   (:mod:`omrl.chat.template_check`)
   (Llama-3 trims contents, Qwen3 splits off thinking: they render in full);
2. probe chats of 0 to 16 exchanges, with contents that are empty, unicode, whitespace
   at the edges, special-token look-alikes or long, give the same pieces at every
   length and for every content (a template that numbers turns, drops earlier thinking
   or moves the system prompt into the last message fails here).

A template's pieces are also checked against full renders of its first real turn, by the
layer above; a real chat that contradicts them drops them (:func:`contradicted`).
"""

from __future__ import annotations

import json
import warnings
import weakref
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, Sequence

from omrl.chat.render import Message, render
from omrl.chat.replies import after_sampled_end
from omrl.chat.template_check import cacheable_template
from omrl.errors import OmrlError

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
SENTINEL = "\x1fomrl probe\x1f"  # stands for a message's content in the probe renders


class TemplateRewrites(OmrlError):
    """Rendering a longer chat changed the text of a shorter one: the template rewrites history."""


@dataclass(frozen=True)
class TurnPieces:
    """The fixed text a template puts around messages; see the module docstring."""

    end: str  # after a reply's content
    before: str  # before a user message that follows a reply
    after: str  # after that user message, with the generation prompt
    first_before: str  # before the first user message (after the system message, if any)
    first_after: str


class Entry:
    """One template and shape's pieces (None: render in full), and whether a real turn confirmed them."""

    __slots__ = ("pieces", "turn_checked")

    def __init__(self, pieces: TurnPieces | None):
        self.pieces = pieces
        self.turn_checked = False


class _TokenizerCache:
    """The pieces one tokenizer's templates have proven; made anew when its vocabulary or special-token
    parsing changes (the layer above keys its ids by the same state)."""

    __slots__ = ("state", "entries", "__weakref__")

    def __init__(self, state: tuple) -> None:
        self.state = state  # (vocabulary size with added tokens, split_special_tokens)
        self.entries: dict[tuple, Entry] = {}


_CACHES: "weakref.WeakKeyDictionary[Any, _TokenizerCache]" = weakref.WeakKeyDictionary()
_roles = itemgetter("role")
_contents = itemgetter("content")


def tokenizer_state(tokenizer) -> tuple:
    """What cached pieces and ids are valid for: tokens added since, or another special-token parsing,
    make them stale. TypeError for a tokenizer that has no length."""
    return (len(tokenizer), bool(getattr(tokenizer, "split_special_tokens", False)))


def turn_pieces(tokenizer, kwargs: dict | None = None, has_system: bool = True) -> TurnPieces | None:
    """The template's pieces for chats with (or without) a system message; None when they cannot be proven."""
    entry = _lookup(tokenizer, kwargs or {}, has_system)
    return None if entry is None else entry.pieces


def entry_for(tokenizer, messages: Sequence[Message], kwargs: dict, last_role: str) -> Entry | None:
    """The cache entry for this chat's template and shape, when its pieces apply to ``messages``."""
    if not messages:
        return None
    first = messages[0]
    has_system = type(first) is dict and first.get("role") == "system"
    entry = _lookup(tokenizer, kwargs, has_system)
    if entry is None or entry.pieces is None or not _plain_chat(messages, has_system, last_role):
        return None
    return entry


def contradicted(entry: Entry) -> None:
    """A real chat rendered other than the pieces say: never use them again (the checks missed something)."""
    entry.pieces = None
    warnings.warn(
        "omrl.chat.pieces: a chat template passed the piece checks but a real chat rendered differently; "
        "rendering this template in full from now on",
        RuntimeWarning,
        stacklevel=4,  # the caller of omrl.chat.increments' prompt_ids or next_turn_ids
    )


def _lookup(tokenizer, kwargs: dict, has_system: bool) -> Entry | None:
    """The entry for the tokenizer's template, ``kwargs`` and shape, derived at first use; None: not cacheable."""
    try:
        cache = _CACHES.get(tokenizer)
        state = tokenizer_state(tokenizer)
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
        entry = cache.entries[key] = Entry(_derive(tokenizer, kwargs, has_system))
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


def _derive(tokenizer, kwargs: dict, has_system: bool) -> TurnPieces | None:
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
                    tokenizer, [*history, {"role": "user", "content": SENTINEL}], add_generation_prompt=True, **kwargs
                )
                if not probe.startswith(base) or probe.count(SENTINEL) != 1:
                    return None
                before, _, after = probe[len(base) :].partition(SENTINEL)
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


def rendered_turn_text(
    tokenizer, messages: Sequence[Message], user_content: str, sampled_end: str, **kwargs: Any
) -> str:
    """The text a user message adds after ``messages`` (ending with a reply whose sampled end tokens are
    ``sampled_end``), with the next generation prompt: by rendering the chat without and with the message."""
    after = generation_end(tokenizer, messages, **kwargs)
    rest = after_sampled_end(after, sampled_end) if sampled_end else None
    after = after if rest is None else rest  # a reply ended otherwise than the template ends it: all of it is written
    before = render(tokenizer, messages, **kwargs)
    longer = render(
        tokenizer, [*messages, {"role": "user", "content": user_content}], add_generation_prompt=True, **kwargs
    )
    return after + _suffix(longer, before, "adding a user turn")
