"""Whether omrl lays out a chat template's episodes token-exactly: scripted episodes played through the very
code a rollout runs, each row checked against the template itself.

Each *case* is a three-reply episode; each reply is *sampled* as the model would sample it, the template's own
text for the reply after its generation prompt up to its end token (:func:`omrl.chat.reply_text`), and then
goes the rollout's way: decoded, its end split off (:func:`omrl.chat.replies.sampled_end`), parsed
(:func:`omrl.chat.replies.parse_reply`, and tool calls where the case has them), and followed by the env's
answer through :func:`omrl.chat.next_prompt` in the history mode. Per row it checks:

- the ids trained (loss mask 1) are exactly the ids sampled, in order;
- under ``as_template``, the ids before each reply are the template's own render of the chat so far, the
  replies as the template reads them (reasoning in its field, tool calls structured);
- under ``keep``, each increment is the text the template itself writes after that reply in the longer chat;
- env text never becomes a special or added token (the ``specials`` case against its clean twin).

Cases: ``plain`` answers; ``reasoning`` (where the template reads a reasoning field); ``tools`` (where it
writes structured calls and a tool role); ``specials``, env text holding every special and added token's
string; ``noncanonical``, replies sampled as other ids than their text encodes to.

At the top of :mod:`omrl.chat`, beside :mod:`omrl.chat.probe`: it plays episodes through every layer below.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.conversation import conversation_rows, reply_text
from omrl.chat.encoding import encode_chat, encode_continued, mark, mark_messages
from omrl.chat.history import HISTORY_MODES, native_tool_calls, next_prompt
from omrl.chat.increments import prompt_ids
from omrl.chat.render import Message, render
from omrl.chat.replies import (
    REASONING_FIELDS,
    ParsedReply,
    leading_specials,
    parse_reply,
    reply_shape,
    sampled_end,
    special_strings,
    stop_token_ids,
    template_key,
)
from omrl.chat.template_check import check_render_bounds_once, where_tool
from omrl.chat.tool_calls import FORMATS, parse_tool_calls, template_format
from omrl.errors import OmrlError

CASES = ("plain", "reasoning", "tools", "specials", "noncanonical")
REPLIES = 3
SYSTEM = "You are an agent in a house. Answer with one action."
TASK = "Find the brass key."
TOOL = where_tool("look_inside", "Look inside a container.")
BLOCK = re.compile(r"<think>.*?</think>", re.S)  # a reasoning block
STRUCTURE = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


@dataclass(frozen=True)
class CaseResult:
    """One case in one history mode: ``status`` is ``ok``, ``broken`` (a row would be wrong: ``problem`` says
    where), ``refused`` (omrl refuses it by name: ``problem`` is the refusal) or ``n/a`` (the template has no
    such thing: no reasoning field, no tool role)."""

    case: str
    mode: str
    status: str
    problem: str = ""


def conformance(
    tokenizer: Any, kwargs: dict | None = None, modes: Sequence[str] = HISTORY_MODES, cases: Sequence[str] = CASES
) -> list[CaseResult]:
    """Every case in every mode on ``tokenizer``'s chat template (with ``kwargs``, e.g. ``enable_thinking``)."""
    kwargs = dict(kwargs or {})
    return [_run_case(tokenizer, kwargs, case, mode) for mode in modes for case in cases]


def first_broken(results: Sequence[CaseResult]) -> CaseResult | None:
    """The first case a run would get wrong, or None."""
    return next((r for r in results if r.status == "broken"), None)


def _run_case(tokenizer: Any, kwargs: dict, case: str, mode: str) -> CaseResult:
    shape = reply_shape(tokenizer, kwargs)
    if case == "reasoning" and not shape.field:
        return CaseResult(case, mode, "n/a", "the template writes no reasoning")
    tools = case == "tools"
    if tools:
        refusal = _tool_refusal(tokenizer, kwargs)
        if refusal is not None:
            return CaseResult(case, mode, *refusal)
    try:
        problem = _play(tokenizer, kwargs, case, mode)
        if not problem and case == "specials":
            problem = _specials_problem(tokenizer, kwargs, mode)
    except OmrlError as exc:
        return CaseResult(case, mode, "refused", _line(exc))
    except Exception as exc:  # noqa: BLE001 - a rollout would crash here: the case is broken
        return CaseResult(case, mode, "broken", f"{type(exc).__name__}: {_line(exc)}")
    return CaseResult(case, mode, "broken" if problem else "ok", problem)


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _tool_refusal(tokenizer: Any, kwargs: dict) -> tuple[str, str] | None:
    """Why the ``tools`` case does not apply (``n/a``) or is refused, or None when it is played."""
    with_tools = {**kwargs, "tools": [TOOL]}
    if not native_tool_calls(tokenizer, with_tools):
        return "n/a", "the template renders no structured tool calls and tool results"
    call = {"role": "assistant", "content": "", "tool_calls": [_call(1)]}
    written = render(tokenizer, [*_opening(tokenizer, kwargs), call], **with_tools)
    fmt = template_format(written, "look_inside")
    if fmt not in FORMATS:
        return "refused", (
            "the template writes tool calls in a format omrl does not parse (it parses: "
            f"{', '.join(FORMATS)}); its tool calls are refused, so an env's tools are offered as text"
        )
    return None


def _call(turn: int) -> dict:
    return {"type": "function", "function": {"name": "look_inside", "arguments": {"where": f"drawer {turn}"}}}


def _opening(tokenizer: Any, kwargs: dict) -> list[Message]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]


def _replies(tokenizer: Any, kwargs: dict, case: str) -> list[Message]:
    field = reply_shape(tokenizer, kwargs).field
    out = []
    for turn in range(1, REPLIES + 1):
        reply: Message = {"role": "assistant", "content": f"open drawer {turn}"}
        if case == "reasoning":
            reply[field] = f"The key may be in drawer {turn}."
        if case == "tools":
            reply = {"role": "assistant", "content": "", "tool_calls": [_call(turn)]}
        out.append(reply)
    return out


def _answer(tokenizer: Any, case: str, turn: int) -> Message:
    text = f"Drawer {turn} is empty."
    if case == "specials":
        text += " " + " ".join([*special_strings(tokenizer), *STRUCTURE])
    role = "tool" if case == "tools" else "user"
    return {"role": role, "content": text, **({"name": "look_inside"} if role == "tool" else {})}


def _sample(tokenizer: Any, said: list[Message], reply: Message, kwargs: dict, case: str) -> list[int]:
    """The ids the model samples for ``reply``: the template's text for it, up to its end token, as that span of
    the render encodes; under ``noncanonical`` the same text as other ids (each character encoded apart, as it
    encodes inside the text: a tokenizer that marks a text's start would mark each character alone)."""
    text = reply_text(tokenizer, said, reply, **kwargs)
    ids = encode_continued(tokenizer, text)
    if case != "noncanonical":
        return ids
    specials = {tokenizer.convert_tokens_to_ids(s) for s in special_strings(tokenizer)}
    out: list[int] = []
    run: list[int] = []
    for token in [*ids, None]:
        if token is None or token in specials:
            piece = tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out += [i for ch in piece for i in encode_continued(tokenizer, mark(tokenizer, ch))]
            run = []
            if token is not None:
                out.append(token)
        else:
            run.append(token)
    return out


def _play(tokenizer: Any, kwargs: dict, case: str, mode: str, rows_out: list | None = None) -> str:
    """Play ``case`` in ``mode`` the rollout's way; the first problem found, '' when every check holds."""
    kwargs = {**kwargs, "tools": [TOOL]} if case == "tools" else kwargs
    replies = _replies(tokenizer, kwargs, case)
    expected: list[Message] = _opening(tokenizer, kwargs)  # the chat as the template should be given it
    said: list[Message] = [dict(m) for m in expected]  # the chat as the rollout gives it
    row = prompt_ids(tokenizer, said, **kwargs)
    rows: list[tuple[list[int], list[int]]] = []
    all_sampled: list[int] = []
    mask = [0] * len(row)
    problem = _prompt_problem(tokenizer, row, expected, kwargs, mode, 0)
    for turn, reply in enumerate(replies, start=1):
        sampled = _sample(tokenizer, expected, reply, kwargs, case)
        all_sampled += sampled
        row, mask = row + sampled, mask + [1] * len(sampled)
        text = tokenizer.decode(sampled, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        stopped = bool(sampled) and sampled[-1] in stop_token_ids(tokenizer, kwargs)
        end = sampled_end(tokenizer, text, kwargs) if stopped else ""
        parsed = parse_reply(tokenizer, text[: len(text) - len(end)], kwargs)
        message = parsed.message
        problem = problem or _reply_problem(tokenizer, expected, reply, text, kwargs, turn)
        if case == "tools":
            fmt = template_format(render(tokenizer, [*expected, reply], **kwargs), "look_inside") or "hermes"
            calls = parse_tool_calls(message["content"], [TOOL], fmt).calls
            if not calls:
                return problem or f"reply {turn}: the tool call the template wrote was not parsed back"
            message = {
                **message,
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
                ],
            }
        problem = problem or _parse_problem(reply, message, parsed, turn)
        said.append(message)
        expected.append(message)  # the reply as the family's server returns it: what a deployment's history holds
        if turn == REPLIES:
            break
        new = [_answer(tokenizer, case, turn)]
        increment, starts_row = next_prompt(tokenizer, mode, row, said, new, end, **kwargs)
        problem = problem or _increment_problem(tokenizer, expected, new, text, end, increment, kwargs, mode, turn)
        if starts_row:
            rows.append((row, mask))
            row, mask = [], []
        row, mask = row + increment, mask + [0] * len(increment)
        said += new
        expected += new
        problem = problem or _prompt_problem(tokenizer, row, expected, kwargs, mode, turn)
    rows.append((row, mask))
    if rows_out is not None:
        rows_out += rows
    trained = [t for ids, m in rows for t, bit in zip(ids, m) if bit]
    if trained != all_sampled:
        return problem or "the ids trained are not the ids sampled"
    if not problem and case != "noncanonical":  # SFT on the episode's chat must train the rows it was played in
        sft = conversation_rows(tokenizer, said, mode, **kwargs)
        if sft != rows:
            return _sft_problem(tokenizer, sft, rows)
    return problem


def _sft_problem(tokenizer: Any, sft: list, rows: list) -> str:
    """Where SFT's rows of an episode's chat part from the rows the episode was played in."""
    if len(sft) != len(rows):
        return f"SFT on the episode's chat lays it out in {len(sft)} rows, the rollout in {len(rows)}"
    for (ids, mask), (want, want_mask) in zip(sft, rows):
        cut = next((k for k, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        if ids != want or mask != want_mask:
            got = tokenizer.decode(ids[cut : cut + 12], skip_special_tokens=False)
            played = tokenizer.decode(want[cut : cut + 12], skip_special_tokens=False)
            return f"SFT on the episode's chat trains {got!r} where the rollout sampled {played!r}"
    return ""


def _reply_problem(tokenizer: Any, chat: list[Message], reply: Message, text: str, kwargs: dict, turn: int) -> str:
    """Where the template's own render of a reply does not follow its generation prompt (DeepSeek-R1's and
    Nemotron 3's open ``<think>``), whether the reply sampled after the prompt is that render, reasoning blocks
    aside: a block the prompt opened must be closed before the answer (so a check is not the sample's own)."""
    opened = render(tokenizer, chat, add_generation_prompt=True, **kwargs)
    whole = render(tokenizer, [*chat, reply], **kwargs)
    if whole.startswith(opened) or _bare(whole).startswith(_bare(opened + text)):
        return ""
    parted = len(os.path.commonprefix([opened, whole]))  # shown from the line they part on (a token cut is no help)
    start = max(whole.rfind("\n", 0, parted) + 1, parted - 40)
    return f"reply {turn} is sampled as {text[:60]!r} where the template writes {whole[start:][:80]!r}"


def _bare(text: str) -> str:
    """``text`` without reasoning blocks and whitespace: what a reply's render and its sample must share."""
    return "".join(BLOCK.sub("", text).split())


def _parse_problem(reply: Message, message: Message, parsed: ParsedReply, turn: int) -> str:
    """Whether the parsed reply holds the reply's answer, reasoning and calls (whitespace at their edges aside):
    as the parse reads them, where the message keeps reasoning inline (the template reads no field)."""
    read = {} if "tool_calls" in message else {"content": parsed.answer}
    for key, value in reply.items():
        got = message.get(key, parsed.reasoning) if key in REASONING_FIELDS else read.get(key, message.get(key))
        if isinstance(value, str) and (got or "").strip() != value.strip() or key == "tool_calls" and got != value:
            return f"reply {turn} parsed back with {key} {str(got)[:60]!r}, not {str(value)[:60]!r}"
    return ""


def _prompt_problem(tokenizer: Any, row: list[int], chat: list[Message], kwargs: dict, mode: str, turn: int) -> str:
    """Whether the chat's render writes a generation prompt and the text of every message but the replies (whose
    reasoning it may drop); under ``as_template``, whether the row's ids up to the next reply are that render."""
    said = mark_messages(tokenizer, chat)
    text = render(tokenizer, said, add_generation_prompt=True, **kwargs)
    lost = next((m for m in said if m["role"] != "assistant" and m["content"].strip() not in text), None)
    if lost is not None:
        text = f"{lost['role']} message's text ({lost['content'][:40]!r})"
        return f"the template drops a {text}; a VLM's template may want content as parts"
    header = reply_shape(tokenizer, kwargs).answer_opens.strip()  # Mistral's [/INST] needs no prompt: it has none
    if turn == 0 and header and text == render(tokenizer, said, **kwargs):
        return f"the template writes no generation prompt: the model would have to sample {header!r} itself"
    if mode != "as_template":
        return ""
    if row != encode_chat(tokenizer, text):
        return f"the prompt of reply {turn + 1} is not the template's own render of the chat"
    return ""


def _increment_problem(
    tokenizer: Any,
    expected: list[Message],
    new: list[Message],
    text: str,
    end: str,
    increment: list[int],
    kwargs: dict,
    mode: str,
    turn: int,
) -> str:
    """Under ``keep``, whether the increment is what the template writes after the reply in the longer chat
    (found after the reply's last characters; a template that rewrites them is not checked here): the ids of
    that span of the longer chat's whole render, where the render's ids split there."""
    if mode != "keep":
        return ""
    full = render(tokenizer, mark_messages(tokenizer, [*expected, *new]), add_generation_prompt=True, **kwargs)
    body = text[: len(text) - len(end)]
    anchor = body[-12:]
    at = full.rfind(anchor) if anchor else -1
    if at < 0:
        return ""
    cut = at + len(anchor)
    if end and full.startswith(end, cut):
        cut += len(end)
    elif end:
        specials = special_strings(tokenizer)
        closing = leading_specials(full[cut:], specials)
        cut += len("".join(closing[: len(leading_specials(end, specials))]))
    whole, before = encode_chat(tokenizer, full), encode_chat(tokenizer, full[:cut])
    want_ids = whole[len(before) :] if whole[: len(before)] == before else encode_continued(tokenizer, full[cut:])
    if increment != want_ids:
        got = tokenizer.decode(increment, skip_special_tokens=False)
        want = tokenizer.decode(want_ids, skip_special_tokens=False)
        return f"after reply {turn} keep appends {got[:60]!r} where the template writes {want[:60]!r}"
    return ""


def _specials_problem(tokenizer: Any, kwargs: dict, mode: str) -> str:
    """Whether env text became special or added tokens: the ``specials`` episode's rows against its clean twin's."""
    added = set((getattr(tokenizer, "added_tokens_decoder", None) or {}).keys())
    counts: list[int] = []
    for case in ("specials", "specials-clean"):
        rows: list = []
        _play(tokenizer, kwargs, case, mode, rows)
        counts.append(sum(1 for ids, _ in rows for t in ids if t in added))
    if counts[0] != counts[1]:
        return f"env text became {counts[0] - counts[1]} special or added tokens"
    return ""


_CHECKED: "weakref.WeakKeyDictionary[Any, dict[tuple, str]]" = weakref.WeakKeyDictionary()
RUN_CASES = ("plain", "reasoning", "specials", "noncanonical")
_CHECKING = threading.Lock()


def check_run_template(tokenizer: Any, mode: str, kwargs: dict | None = None) -> None:
    """Refuse, before a row is laid out, a chat template whose episodes ``mode`` would lay out wrongly (a
    ``broken`` case of :func:`conformance`), naming the case; once per tokenizer, template, options and mode.
    A refused case is left to the point that refuses it, where its message names the way out. First, a
    template that does not render within bounds (it loops, or builds huge text) is refused before this
    process renders anything through it (:func:`~omrl.chat.template_check.check_render_bounds_once`)."""
    kwargs = dict(kwargs or {})
    try:
        known = _CHECKED.setdefault(tokenizer, {})
    except TypeError:
        known = {}
    key = (*template_key(tokenizer, kwargs), mode)
    with _CHECKING:  # rollouts on several threads share a tokenizer: one plays the cases, the others wait
        if key not in known:  # (a rollout step passes here: the bounds are checked on a miss only)
            check_render_bounds_once(tokenizer, kwargs)
            _check_first_prompt(tokenizer, kwargs)
            broken = first_broken(conformance(tokenizer, kwargs, (mode,), RUN_CASES))
            known[key] = "" if broken is None else f"{broken.case} episodes: {broken.problem}"
    if known[key]:
        raise OmrlError(
            f"omrl would lay out this chat template's episodes wrongly under chat.history={mode} ({known[key]}); "
            f"`omrl check-template MODEL` shows every case and which mode works"
        )


def _check_first_prompt(tokenizer: Any, kwargs: dict) -> None:
    """Refuse a template that cannot render a first user message, the way a run gives its options: most
    often one that raises for an option the run did not set (not a layout problem)."""
    try:
        render(tokenizer, [{"role": "user", "content": TASK}], add_generation_prompt=True, **kwargs)
    except OmrlError:
        raise
    except Exception as exc:  # noqa: BLE001 - the template's own refusal
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "none"
        raise OmrlError(
            f"the chat template cannot render a first user message ({type(exc).__name__}: {_line(exc)}), so no "
            "episode can start; where it asks for an option, set it with chat.template_kwargs.NAME=VALUE "
            f"(options given: {given})"
        ) from exc
