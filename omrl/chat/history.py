"""How a conversation's earlier turns reach the next prompt: two history modes, the top of the layers a
turn's ids pass through (:mod:`omrl.chat.increments` below it, then pieces, render and encoding).

The ids the model sampled are never decoded and re-encoded inside a row: a row is the
ids the backend was given for its first turn, then what was sampled and what the chat
template adds after it (loss_mask 0). Templates of thinking models rewrite earlier
turns (Qwen3 drops the ``<think>`` of every reply before the last user message,
DeepSeek-R1 keeps only the text after ``</think>``, gpt-oss writes ``<|return|>`` as
``<|end|>``), so the next prompt as the template renders it no longer starts with the
ids sampled. The two modes answer that differently:

``keep``
    One row per episode. After a reply, the ids appended are the template's text for
    the new messages and the next generation prompt, as it renders them after the real
    history when the template only appends, else after placeholder messages
    (:func:`anchored_increment`): the row stays append-only under any template, at the
    price that the model sees its own earlier reasoning, which the stock template
    would hide in deployment.

``as_template``
    Every turn's prompt is the template's own full render of the chat so far, exactly
    what the model would be given in deployment. While that render's ids extend the
    current row, the row grows by the difference; where they do not (a reply whose
    reasoning was dropped, a reply that re-encodes to other ids), a new row starts with
    the whole prompt. An episode of ``n`` turns is at most ``n`` rows; the rows are
    trained together (:mod:`omrl.training.rl_data` packs them with restarting
    positions), so the episode's advantage reaches every row.

Which mode a template needs, and what each costs, is reported by ``omrl check-template``.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Sequence

from jinja2 import TemplateError

from omrl.chat.encoding import encode_chat, encode_continued, mark_messages
from omrl.chat.increments import next_turn_ids
from omrl.chat.pieces import TemplateRewrites
from omrl.chat.render import Message, render
from omrl.chat.replies import after_sampled_end, leading_specials, special_strings, template_key, trailing_specials
from omrl.chat.tool_calls import template_format
from omrl.errors import OmrlError

HISTORY_MODES = ("keep", "as_template")
PLACEHOLDER_QUESTION = "omrl placeholder question"
PLACEHOLDER_REPLY = "omrl placeholder reply"
CHECK_HINT = "run `omrl check-template MODEL` to see where the template rewrites a chat"

PROBE_TOOL = "omrl_probe_tool"
PROBE_RESULT = "omrl probe result"

# per tokenizer: (template, kwargs) -> False once the template was seen rewriting a chat
_APPENDS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], bool]]" = weakref.WeakKeyDictionary()
# per tokenizer: (template, kwargs) -> whether it renders structured tool calls and tool results
_NATIVE_TOOLS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], str | None]]" = weakref.WeakKeyDictionary()


def check_history(mode: str) -> str:
    """``mode`` when it is a history mode; else an error listing them."""
    if mode not in HISTORY_MODES:
        raise OmrlError(f"unknown chat history mode {mode!r}; valid: {', '.join(HISTORY_MODES)}")
    return mode


def next_prompt(
    tokenizer,
    history: str,
    row: Sequence[int],
    messages: Sequence[Message],
    new: Sequence[Message],
    sampled_end: str,
    **kwargs: Any,
) -> tuple[list[int], bool]:
    """The ids that lead from a reply to the next turn: ``(ids, starts_row)``.

    ``messages`` ends with the reply just sampled (its decoded text, less ``sampled_end``: the
    tokens that ended it, :func:`omrl.chat.replies.sampled_end`), ``new`` are the
    messages that answer it (a user observation, or tool results), ``row`` is the current
    row's ids (its prompt, replies and increments so far). With ``starts_row`` False the
    ids extend ``row``; with True they are a whole new row's prompt (``as_template`` only).
    """
    if history == "keep":  # (marks what it renders)
        return kept_increment(tokenizer, messages, new, sampled_end, **kwargs), False
    messages, new = mark_messages(tokenizer, messages), mark_messages(tokenizer, new)  # their text is never special
    text = _render_or_explain(tokenizer, [*messages, *new], "the chat so far", kwargs)
    prompt = encode_chat(tokenizer, text)
    if len(prompt) > len(row) and prompt[: len(row)] == list(row):
        return prompt[len(row) :], False
    return prompt, True


def native_tool_calls(tokenizer, kwargs: dict) -> bool:
    """Whether the chat template renders a reply's structured ``tool_calls`` and a ``tool`` message's
    content: then a parsed tool call is recorded as such and the env's answer goes back as a ``tool``
    message. A template that renders neither (SmolLM2's, ChatML without tools) keeps text replies and
    user-message answers."""
    return native_call_format(tokenizer, kwargs) is not None


def native_call_format(tokenizer, kwargs: dict) -> str | None:
    """The format the chat template writes structured tool calls in (:data:`omrl.chat.tool_calls.FORMATS`;
    ``''`` for one omrl does not parse), or None where it renders no tool calls and tool results."""
    try:
        known = _NATIVE_TOOLS.setdefault(tokenizer, {})
    except TypeError:
        known = {}
    key = template_key(tokenizer, kwargs)
    if key not in known:
        call = {"type": "function", "function": {"name": PROBE_TOOL, "arguments": {}}}
        chat = [
            {"role": "user", "content": PLACEHOLDER_QUESTION},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": PROBE_RESULT, "name": PROBE_TOOL},
        ]
        try:
            text = render(tokenizer, chat, add_generation_prompt=True, **kwargs)
            native = PROBE_TOOL in text and PROBE_RESULT in text
            known[key] = (template_format(text, PROBE_TOOL) or "") if native else None
        except Exception:  # noqa: BLE001 - a template that refuses tool calls has none
            known[key] = None
    return known[key]


def warn_foreign_call_format(template: Any, tokenizer: Any, kwargs: dict) -> None:
    """Warn where ``template`` asks for tool calls in a format (its ``call_format()``) other than the one the
    model's chat template writes them in: the model is asked for, and its SFT data teaches, a foreign one."""
    asked = template.call_format()
    native = native_call_format(tokenizer, kwargs) if asked else None
    if native and native != asked:
        warnings.warn(
            f"the action template asks for tool calls written as {asked}, but the model's chat template writes "
            f"them as {native}: its replies, and SFT data of them, are in a format the model was not trained on; "
            f"a template or option that writes {native} calls (or a model whose own format is {asked}) avoids it",
            stacklevel=2,
        )


def kept_increment(
    tokenizer, messages: Sequence[Message], new: Sequence[Message], sampled_end: str, **kwargs: Any
) -> list[int]:
    """``keep`` mode's ids after a reply: the real-history increment while the template renders the longer
    chat as an extension (:func:`omrl.chat.increments.next_turn_ids`), else :func:`anchored_increment`'s.

    A template seen rewriting once is rendered after placeholders from then on (per tokenizer and kwargs).
    """
    try:
        known = _APPENDS.setdefault(tokenizer, {})
    except TypeError:  # cannot be weakly referenced: try the real history every time
        known = {}
    key = template_key(tokenizer, kwargs)
    if known.get(key, True) and len(new) == 1 and new[0]["role"] == "user":
        try:
            return next_turn_ids(tokenizer, messages, new[0]["content"], sampled_end, **kwargs)
        except (TemplateRewrites, TemplateError):  # it rewrites, or refuses sampled text (gpt-oss: channel tags)
            known[key] = False
    # the increment follows the reply's end token: its ids are that span of the whole render's
    return encode_continued(tokenizer, anchored_increment(tokenizer, messages, new, sampled_end, **kwargs))


def anchored_increment(
    tokenizer, messages: Sequence[Message], new: Sequence[Message], sampled_end: str, **kwargs: Any
) -> str:
    """The text the template writes after a reply for ``new`` and the next generation prompt, rendered after
    placeholder messages (the real system message, a placeholder question and reply) instead of the real
    history, so a template that rewrites earlier replies cannot change it.

    The tokens that ended the reply (``sampled_end``) were sampled, so the increment starts after the template's
    closing: the very text where the template writes it so (Cohere2's two tokens, ChatML's one), else as many
    special tokens as were sampled (gpt-oss samples ``<|return|>`` where its history writes ``<|end|>``).

    After a reply holding tool calls the placeholder reply holds the same calls, since what follows a call
    differs from what follows an answer (Gemma 4 writes the result inside the model's turn).
    """
    reply = messages[-1]
    messages, new = mark_messages(tokenizer, messages[:1]), mark_messages(tokenizer, new)
    system = [dict(m) for m in messages[:1] if m.get("role") == "system"]
    if reply.get("tool_calls") and sampled_end:
        after_call = _after_call(tokenizer, system, mark_messages(tokenizer, [reply])[0], new, sampled_end, kwargs)
        if after_call is not None:
            return after_call
    anchor = [
        *system,
        {"role": "user", "content": PLACEHOLDER_QUESTION},
        {"role": "assistant", "content": PLACEHOLDER_REPLY},
    ]
    text = _render_or_explain(tokenizer, [*anchor, *new], f"a {new[0]['role']!r} message after a reply", kwargs)
    at = text.rfind(PLACEHOLDER_REPLY)
    if at < 0:  # dropped, or rewritten (upper-cased, trimmed): either way not the text the model sampled
        how = "rewrites" if PLACEHOLDER_REPLY.lower() in text.lower() else "drops"
        raise OmrlError(
            f"the chat template {how} an assistant reply's text when a message follows it, so the history cannot "
            f"be kept; chat.history=as_template may lay it out ({CHECK_HINT}, and whether that mode works)"
        )
    increment = text[at + len(PLACEHOLDER_REPLY) :]
    rest = after_sampled_end(increment, sampled_end)
    if rest is not None:
        return rest
    specials = special_strings(tokenizer)
    closing, sampled = leading_specials(increment, specials), trailing_specials(sampled_end, specials)
    if len(closing) < len(sampled) or not sampled:
        raise OmrlError(
            f"the chat template does not close a reply with special tokens (it writes {increment[:40]!r} "
            f"after one), so the sampled {sampled_end!r} has no place in the history; use "
            f"chat.history=as_template ({CHECK_HINT})"
        )
    return increment[len("".join(closing[: len(sampled)])) :]


def _after_call(
    tokenizer, system: list[Message], reply: Message, new: Sequence[Message], sampled_end: str, kwargs: dict
) -> str | None:
    """The text after a tool-calling reply's ``sampled_end``, rendered after the system message, a placeholder
    question and the reply itself; None where the longer chat rewrites the reply's own render."""
    anchor = [*system, {"role": "user", "content": PLACEHOLDER_QUESTION}, dict(reply)]
    last = _render_or_explain(tokenizer, anchor, "a reply holding tool calls", kwargs, generation=False)
    text = _render_or_explain(tokenizer, [*anchor, *new], f"a {new[0]['role']!r} message after a tool call", kwargs)
    end = last.rfind(sampled_end)
    if not text.startswith(last) or end < 0:
        return None
    return text[end + len(sampled_end) :]


def _render_or_explain(tokenizer, messages: Sequence[Message], what: str, kwargs: dict, generation: bool = True) -> str:
    """The chat rendered (with its generation prompt unless not ``generation``); a template that raises (its
    own ``raise_exception``, a jinja error) is an OmrlError saying what it could not render."""
    try:
        return render(tokenizer, messages, add_generation_prompt=generation, **kwargs)
    except OmrlError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the template raises
        raise OmrlError(f"the chat template cannot render {what} ({type(exc).__name__}: {exc}); {CHECK_HINT}") from exc
