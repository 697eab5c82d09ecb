"""A sampled reply read the way the family's server reads it: reasoning, answer and the tokens that end it.

A serving engine's reasoning parser splits a reply into its reasoning channel and its answer
(Qwen3's ``<think>`` block, gpt-oss's ``analysis`` channel, Gemma 4's ``thought`` channel,
DeepSeek-R1's text before ``</think>``), and the chat template reads them back from a
message's fields (``reasoning_content``, ``thinking``, ``reasoning``). omrl learns both ends
of that contract from the template itself (:func:`reply_shape`): it renders a reply whose
reasoning and answer are sentinels, once per template and options, and reads off the text the
template writes around them. :func:`parse_reply` then splits a sampled reply at the same text,
so the message a history holds is the one the template expects back, and the template, not
omrl, decides what an earlier reply shows.

The end of a reply is the run of special tokens its ids end with that the template itself closes
a reply with (Cohere2 samples ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``, ChatML ``<|im_end|>``,
gpt-oss ``<|return|>``): :func:`sampled_end`. Those ids were sampled, so the history's increment
starts after them (:func:`omrl.chat.history.kept_increment`), never writing them again.

The layer above :mod:`omrl.chat.render`, through which it renders its probes; history and conversations
read its shapes.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Sequence

from omrl.chat.render import render

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # Qwen3/GLM/Nemotron, gpt-oss, others
ANSWER = "omrl answer sentinel"
REASONING = "omrl reasoning sentinel"
QUESTION = "omrl question sentinel"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_SHAPES: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], ReplyShape]]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ReplyShape:
    """The text a chat template writes around a reply's parts, after its generation prompt.

    ``field`` is the message field the template reads reasoning from (None: it writes none);
    ``opens``/``closes`` the text before and after the reasoning (``opens`` is empty where the
    generation prompt itself opens the block, as DeepSeek-R1's does); ``answer_opens`` what stands
    before an answer that has no reasoning (gpt-oss's ``<|channel|>final<|message|>``, Qwen3's empty
    block); ``closing`` the special tokens the template ends a last reply with; ``stops`` the tokens
    a reply ends at (:func:`stop_token_ids`). ``inline``: where the generation prompt opens the block and the
    template was seen to read no field (DeepSeek-R1), the opening the prompt wrote (``'<think>\\n'``): ``field``
    is then only where a server's parser returns the reasoning, and a reply read back keeps it in its content,
    where the template keeps it (or drops it) itself."""

    field: str | None = None
    opens: str = ""
    closes: str = ""
    answer_opens: str = ""
    closing: tuple[str, ...] = ()
    specials: frozenset[str] = dataclass_field(default_factory=frozenset)
    stops: tuple[str, ...] = ()  # the special tokens a reply ends at (see stop_token_ids)
    call_end: str = ""  # the one a reply holding a tool call ends at, where the template writes none itself
    inline: str = ""


@dataclass(frozen=True)
class ParsedReply:
    """A reply's text split: its ``reasoning`` (None: it has none), its ``answer`` (the text after any
    reasoning and channel header), ``message``: the assistant message the template is given back, and
    ``answer_from``: where the answer starts in the text (it is always the text's end)."""

    reasoning: str | None
    answer: str
    message: dict[str, Any]
    answer_from: int = 0


def template_key(tokenizer: Any, kwargs: dict) -> tuple[str, str]:
    """What a per-tokenizer cache of a template's behaviour is keyed by: the template and its options."""
    options = json.dumps(kwargs, sort_keys=True, default=repr) if kwargs else "{}"  # (every turn: mostly none)
    return str(getattr(tokenizer, "chat_template", "")), options


def special_strings(tokenizer: Any) -> list[str]:
    """The tokenizer's special tokens as strings, longest first (one may contain another)."""
    added = (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
    return sorted({str(t) for t in added if getattr(t, "special", False) and str(t)}, key=len, reverse=True)


def leading_specials(text: str, specials: Sequence[str]) -> list[str]:
    """The special tokens ``text`` opens with, one after another with nothing between them."""
    found: list[str] = []
    at = 0
    while True:
        token = next((s for s in specials if text.startswith(s, at)), None)
        if token is None:
            return found
        found.append(token)
        at += len(token)


def trailing_specials(text: str, specials: Sequence[str]) -> list[str]:
    """The special tokens ``text`` ends with, one after another with nothing between them (in order)."""
    found: list[str] = []
    end = len(text)
    while True:
        token = next((s for s in specials if text.endswith(s, 0, end)), None)
        if token is None:
            return found[::-1]
        found.append(token)
        end -= len(token)


def reply_shape(tokenizer: Any, kwargs: dict | None = None) -> ReplyShape:
    """The :class:`ReplyShape` of ``tokenizer``'s chat template under ``kwargs`` (rendered once, then cached)."""
    kwargs = dict(kwargs or {})
    try:
        known = _SHAPES.setdefault(tokenizer, {})
    except TypeError:
        known = {}
    key = (*template_key(tokenizer, kwargs), str(getattr(tokenizer, "eos_token", "")))
    if key not in known:
        known[key] = _learn_shape(tokenizer, kwargs)
    return known[key]


def _render(tokenizer: Any, messages: list[dict], generation: bool, kwargs: dict) -> str | None:
    try:
        return render(tokenizer, messages, add_generation_prompt=generation, **kwargs)
    except Exception:  # noqa: BLE001 - a template that refuses the probe tells nothing here
        return None


def _learn_shape(tokenizer: Any, kwargs: dict) -> ReplyShape:
    specials = special_strings(tokenizer)
    opening = [{"role": "user", "content": QUESTION}]
    prompt = _render(tokenizer, opening, True, kwargs)
    plain = _render(tokenizer, [*opening, {"role": "assistant", "content": ANSWER}], False, kwargs)
    if prompt is None or plain is None:
        return ReplyShape(specials=frozenset(specials))
    answer_opens, closing = "", ()
    if ANSWER in plain:  # the closing is read from the reply's own end, wherever its prompt stands
        closing = tuple(leading_specials(plain[plain.rindex(ANSWER) + len(ANSWER) :], specials))
    if plain.startswith(prompt) and ANSWER in plain[len(prompt) :]:
        body = plain[len(prompt) :]
        answer_opens = body[: body.index(ANSWER)]
    call = {"type": "function", "function": {"name": "omrl_probe_tool", "arguments": {}}}
    stops, call_end = _stops(tokenizer, opening, closing, call, specials, kwargs)
    shape = dict(
        answer_opens=answer_opens, closing=closing, specials=frozenset(specials), stops=stops, call_end=call_end
    )
    for name in REASONING_FIELDS:
        reply = {"role": "assistant", "content": ANSWER, name: REASONING}
        called = {
            "role": "assistant",
            "content": "",
            name: REASONING,
            "tool_calls": [call],
        }  # Gemma 4 writes it only so
        for chat in ([*opening, reply], [*opening, reply, {"role": "user", "content": QUESTION}], [*opening, called]):
            text = _render(tokenizer, chat, False, kwargs)
            if text is None or not text.startswith(prompt):
                continue
            body = text[len(prompt) :]
            at, answer = body.find(REASONING), body.find(ANSWER)
            if at < 0:
                continue
            after = body[at + len(REASONING) :]
            if answer > at:
                return ReplyShape(name, body[:at], body[at + len(REASONING) : answer], **shape)
            first = min((after.find(s) + len(s) for s in specials if s in after), default=-1)
            if first > 0:  # no answer written: the reasoning closes at its first special token
                return ReplyShape(name, body[:at], after[:first], **shape)
    if prompt.rstrip().endswith(THINK_OPEN):  # the prompt opens the block and no field is written: DeepSeek-R1
        opened = prompt[prompt.rstrip().rindex(THINK_OPEN) :]
        return ReplyShape("reasoning_content", "", THINK_CLOSE, inline=opened, **shape)
    return ReplyShape(**shape)


PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "omrl_probe_tool",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def _stops(tokenizer: Any, opening: list, closing: tuple, call: dict, specials: list, kwargs: dict) -> tuple:
    """The special tokens a reply ends at: the eos token, the last of the template's closing of an answer
    and of a tool call (gpt-oss ends a call with ``<|call|>``), and where the template closes no reply (GLM)
    the token that opens the next turn after an answer and after a call (``<|user|>``, ``<|observation|>``);
    and the one a call ends at where the template does not write it after the call (GLM's), else ''."""
    stops = [str(tokenizer.eos_token)] if getattr(tokenizer, "eos_token", None) else []
    stops += list(closing[-1:])
    call_end = ""
    with_tools = {**kwargs, "tools": [PROBE_TOOL]}
    called = [*opening, {"role": "assistant", "content": "", "tool_calls": [call]}]
    call_text = _render(tokenizer, called, False, with_tools)
    if call_text and "omrl_probe_tool" in call_text:
        stops += trailing_specials(call_text.rstrip(), specials)[-1:]
    if not closing:
        followed = _render(tokenizer, [*opening, {"role": "assistant", "content": ANSWER}, opening[0]], False, kwargs)
        if followed and ANSWER in followed:
            stops += leading_specials(followed[followed.rindex(ANSWER) + len(ANSWER) :].lstrip(), specials)[:1]
        answered = _render(
            tokenizer, [*called, {"role": "tool", "content": ANSWER, "name": "omrl_probe_tool"}], False, with_tools
        )
        if call_text and answered and answered.startswith(call_text):
            opener = leading_specials(answered[len(call_text) :].lstrip(), specials)[:1]
            stops += opener
            call_end = "".join(opener)
    return tuple(dict.fromkeys(s for s in stops if s)), call_end


def stop_token_ids(tokenizer: Any, kwargs: dict | None = None) -> tuple[int, ...]:
    """The ids a reply ends at, the eos token's first: what a server stops at (a model's generation config
    lists them; omrl reads them off the chat template, so a turn ends where the template ends one)."""
    ids = [int(tokenizer.eos_token_id)] if getattr(tokenizer, "eos_token_id", None) is not None else []
    for token in reply_shape(tokenizer, kwargs).stops:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id not in ids and token_id != getattr(tokenizer, "unk_token_id", None):
            ids.append(token_id)
    return tuple(ids)


def sampled_end(tokenizer: Any, text: str, kwargs: dict | None = None) -> str:
    """The special tokens a reply's decoded text ends with that close a reply in the template: a stop token
    and the run of the template's closing tokens and stop tokens just before it (``''``: the reply was cut,
    or ends otherwise)."""
    shape = reply_shape(tokenizer, kwargs)
    stops = shape.stops or ((tokenizer.eos_token,) if getattr(tokenizer, "eos_token", None) else ())
    stop = next((token for token in stops if text.endswith(token)), None)
    if stop is None:
        return ""
    ending = (*shape.closing, *stops)  # a run such as Cohere2's <|END_RESPONSE|><|END_OF_TURN_TOKEN|>
    start = len(text) - len(stop)
    while (before := next((token for token in ending if text.endswith(token, 0, start)), None)) is not None:
        start -= len(before)
    return text[start:]


def after_sampled_end(end: str, sampled: str) -> str | None:
    """What of ``end``, the text a template writes after a reply, the model did not sample, where the reply ended
    with ``sampled`` (its :func:`sampled_end`): ``end`` after ``sampled`` where that starts it, else after the part
    of ``end`` that ``sampled`` ends with (Cohere2 may sample ``<|END_RESPONSE|>`` twice before
    ``<|END_OF_TURN_TOKEN|>``: its template's closing is in the ids, never written again); None where the reply
    ended otherwise (gpt-oss samples ``<|return|>`` where a longer chat writes ``<|end|>``)."""
    if end.startswith(sampled):
        return end[len(sampled) :]
    cut = next((k for k in range(min(len(end), len(sampled)), 0, -1) if sampled.endswith(end[:k])), 0)
    return end[cut:] if cut else None


def parse_reply(tokenizer: Any, text: str, kwargs: dict | None = None, sampled: bool = True) -> ParsedReply:
    """``text`` (a reply's decoded text without its :func:`sampled_end`) split the way the template writes a
    reply: the reasoning between the template's reasoning markers, the answer after them (less the header
    the template puts before an answer), and the message holding both: the reasoning in the field the template
    reads, or, where it reads none (``inline``), in the content as the model wrote it, its block opened.

    A reply that never closes its reasoning (cut at the token limit) is read as the family's server reads it
    (:func:`_unclosed_reasoning`): all reasoning where the generation prompt opened the block or a channel header
    opened it, its answer empty. ``sampled`` False: ``text`` is a message's content from a dataset, which leaves
    out a block the prompt opened when it has no reasoning (DeepSeek-R1's ``"Act: up"``): it is then the answer."""
    shape = reply_shape(tokenizer, kwargs)
    reasoning, answer, closed = None, text, False
    if shape.field and shape.closes.strip():
        for opens, closes in ((shape.opens, shape.closes), (shape.opens.strip(), shape.closes.strip())):
            if not opens and closes.strip() == THINK_CLOSE:
                opens = THINK_OPEN if text.lstrip().startswith(THINK_OPEN) else ""  # a block the prompt opened
            body = text.lstrip() if opens != shape.opens else text
            if body.startswith(opens) and closes in body[len(opens) :]:
                reasoning, answer = body[len(opens) :].split(closes, 1)
                closed = True
                break
    if not closed and shape.field and (sampled or not shape.inline):
        reasoning = _unclosed_reasoning(shape, text)
        answer = text if reasoning is None else ""
    for header in (shape.answer_opens, shape.answer_opens.strip()):
        if reasoning is None and header and answer.startswith(header):
            answer = answer[len(header) :]
            break
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    if closed and shape.field and shape.inline:
        message["content"] = text if text.lstrip().startswith(THINK_OPEN) else shape.inline + text
    elif reasoning is not None and shape.field:
        message[shape.field] = reasoning
    return ParsedReply(reasoning, answer, message, len(text) - len(answer))


def _unclosed_reasoning(shape: ReplyShape, text: str) -> str | None:
    """The reasoning of a reply whose reasoning block never closes, as the family's server parses it, or None where
    it reads such a reply as the answer. DeepSeek-R1's generation prompt opens ``<think>``: its parser (vLLM's)
    reads a reply without ``</think>`` as reasoning. gpt-oss's (harmony's) ``analysis`` channel is reasoning, and
    Gemma 4's ``thought`` channel, however it ends. An unclosed ``<think>`` the reply opened itself (Qwen3) is left
    to the answer, as Qwen3's parser leaves it."""
    if not text.strip():
        return None
    if shape.inline:  # the prompt opened the block: the reply starts inside it
        body = text.lstrip()
        return body[len(THINK_OPEN) :] if body.startswith(THINK_OPEN) else text
    if shape.opens.strip() and THINK_OPEN not in shape.opens and text.startswith(shape.opens):  # a channel header
        return text[len(shape.opens) :]
    return None
