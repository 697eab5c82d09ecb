"""Readers for the tool-call formats written as tagged blocks or messages, each reading a reply as the
serving engine's parser for the family does (vLLM's ``--tool-call-parser`` of the same name where there is
one), and what every reader shares: the :class:`Read` it returns, JSON read within a depth bound, blocks
found between tags, values typed by the tool's schema. :mod:`omrl.chat.tool_literals` reads the formats
that write arguments as literals; :func:`omrl.chat.tool_calls.parse_tool_calls` calls both and classifies
what they read:

- ``qwen3_coder`` (Qwen3.5 and later, Qwen3-Coder, Nemotron 3): ``<tool_call>\\n<function=NAME>\\n``
  ``<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``;
- ``glm45`` (GLM-4.5 and later): ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>``
  ``\\n</tool_call>``;
- ``harmony`` (gpt-oss): a message to ``functions.NAME`` on the commentary channel,
  ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`` (the recipient may
  stand before the channel, as the chat template writes it);
- ``deepseek`` (DeepSeek-V3): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json``
  ``\\n{...}\\n```<｜tool▁call▁end｜>`` per call, then ``<｜tool▁calls▁end｜>``.

The two XML formats write every value as text: where the tool's schema types the key as something other
than a string, the value is read as JSON (or as the ``True``/``False``/``None`` a template's ``string``
filter writes); a value that does not read stays text, as vLLM hands it on, and the schema check then
finds the call's arguments bad.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

MAX_JSON_DEPTH = 64  # deeper replies are junk, and json's recursion must not be the limit
UNREAD = object()  # what a value that does not parse reads as
WORDS = {"true": True, "false": False, "null": None, "none": None}  # bare words, in any case


@dataclass(frozen=True)
class Read:
    """One call as its format's reader found it: ``name`` and ``arguments`` when they could be read, else
    ``failure`` (``unclosed``, ``invalid_json`` or ``missing_name``) and why."""

    name: str | None = None
    arguments: Any = None
    failure: str | None = None
    error: str | None = None


Specs = dict[str, dict[str, Any]]  # offered tools' function specs by name
Reader = Callable[[str, Specs], tuple[str, list[Read]]]  # a reply -> its text outside its calls, and its calls


def json_depth(text: str, opens: str = "[{", closes: str = "]}") -> int:
    """An upper bound on the nesting of brackets in ``text`` (strings' brackets counted too)."""
    depth = deepest = 0
    for char in text:
        if char in opens:
            depth += 1
            deepest = max(deepest, depth)
        elif char in closes:
            depth -= 1
    return deepest


def load_json(text: str) -> Any:
    """``text``'s JSON value, or :data:`UNREAD` when it is not JSON or nests past :data:`MAX_JSON_DEPTH`."""
    if json_depth(text) > MAX_JSON_DEPTH:
        return UNREAD
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return UNREAD


def invalid(why: str, name: str | None = None) -> Read:
    """A call that could not be read: ``invalid_json``, for ``why``."""
    return Read(name, failure="invalid_json", error=why)


def _blocks(text: str, opener: str, closer: str) -> list[tuple[int, int, str | None]]:
    """Each ``opener ... closer`` block of ``text``: where it opens, where it ends and its inside (None:
    never closed, the block running to the reply's end)."""
    out: list[tuple[int, int, str | None]] = []
    at = text.find(opener)
    while at >= 0:
        end = text.find(closer, at + len(opener))
        if end < 0:
            out.append((at, len(text), None))
            break
        out.append((at, end + len(closer), text[at + len(opener) : end]))
        at = text.find(opener, end + len(closer))
    return out


def read_blocks(
    text: str, specs: Specs, opener: str, closer: str, read: Callable, after: bool = False
) -> tuple[str, list[Read]]:
    """The calls in ``text``'s blocks (``read(inside, specs)``: a block's calls) and the text before the
    first block (with ``after``, and the text after the last: a family that writes its text after its calls)."""
    blocks = _blocks(text, opener, closer)
    reads: list[Read] = []
    for _, _, inside in blocks:
        if inside is None:
            reads.append(Read(failure="unclosed", error=f"the {opener} block is never closed"))
        else:
            reads += read(inside, specs)
    if not blocks:
        return text, reads
    content = text[: blocks[0][0]].strip()
    if after and text[blocks[-1][1] :].strip():
        content = f"{content}\n\n{text[blocks[-1][1] :].strip()}".strip()
    return content, reads


def _properties(specs: Specs, name: str) -> dict[str, Any]:
    parameters = (specs.get(name) or {}).get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return properties if isinstance(properties, dict) else {}


def _typed(text: str, properties: dict[str, Any], key: str) -> Any:
    """A value written as text, read as its key's schema type says (see the module docstring)."""
    spec = properties.get(key)
    kinds = spec.get("type") if isinstance(spec, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if not kinds or "string" in kinds:
        return text
    value = load_json(text.strip())
    if value is UNREAD:
        value = WORDS.get(text.strip().lower(), UNREAD)
    return text if value is UNREAD else value


def _matched_call(
    match: re.Match | None, unmatched: str, unnamed: str, arguments_of: Callable[[str], Any], unread: str
) -> list[Read]:
    """The call a format's pattern matched, its tool's name as the group ``name`` (None: the call is not of
    the format's shape, ``unmatched`` says how; a blank name is ``unnamed``) and its arguments as
    ``arguments_of(name)`` reads them (UNREAD: ``unread``)."""
    if not match:
        return [invalid(unmatched)]
    name = match["name"].strip()
    if not name:
        return [Read(failure="missing_name", error=unnamed)]
    arguments = arguments_of(name)
    return [invalid(unread, name) if arguments is UNREAD else Read(name, arguments)]


# qwen3_coder ---------------------------------------------------------------------------------------------

_FUNCTION = re.compile(r"\s*<function=(?P<name>[^>\n]*)>(.*)</function>\s*", re.S)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>\n?((?:(?!<parameter=).)*?)\n?</parameter>", re.S)


def _qwen3_coder_call(inside: str, specs: Specs) -> list[Read]:
    function = _FUNCTION.fullmatch(inside)
    return _matched_call(
        function,
        "the block is not one <function=NAME>...</function> element",
        "the <function=...> element names no tool",
        lambda name: _pairs(function[2], _PARAMETER, _properties(specs, name)),  # type: ignore[index]
        "the function holds something other than <parameter=KEY>...</parameter> elements",
    )


def _pairs(body: str, pattern: re.Pattern, properties: dict[str, Any]) -> Any:
    """The key-value elements ``body`` consists of (``pattern``: one, key and value as groups), each value
    typed by the schema; UNREAD when ``body`` holds anything else."""
    arguments: dict[str, Any] = {}
    at = 0
    while match := pattern.match(body, at):
        key = match[1].strip()
        arguments[key] = _typed(match[2], properties, key)
        at = match.end()
    return arguments if not body[at:].strip() else UNREAD


def read_qwen3_coder(text: str, specs: Specs) -> tuple[str, list[Read]]:
    return read_blocks(text, specs, "<tool_call>", "</tool_call>", _qwen3_coder_call)


# glm45 ---------------------------------------------------------------------------------------------------

_ARG = re.compile(r"\s*<arg_key>([^<]*)</arg_key>\s*<arg_value>((?:(?!<arg_key>).)*?)</arg_value>", re.S)


def _glm45_call(inside: str, specs: Specs) -> list[Read]:
    head, _, _ = inside.partition("<arg_key>")
    name = head.strip()
    if not name:
        return [Read(failure="missing_name", error="the block does not open with a tool name")]
    if re.search(r"\s|[<>{}]", name):
        return [invalid("the block does not open with a tool name and <arg_key>/<arg_value> pairs")]
    arguments = _pairs(inside[len(head) :], _ARG, _properties(specs, name))
    if arguments is UNREAD:
        return [invalid("the call holds something other than <arg_key>/<arg_value> pairs", name)]
    return [Read(name, arguments)]


def read_glm45(text: str, specs: Specs) -> tuple[str, list[Read]]:
    return read_blocks(text, specs, "<tool_call>", "</tool_call>", _glm45_call)


# harmony -------------------------------------------------------------------------------------------------

_RECIPIENT = "to=functions."
_BOUNDARY = re.compile(r"<\|(start|end|call|return|message)\|>")
_NAME = re.compile(r"[^\s<]*")
_LEAD = re.compile(r"\s*(?:<\|start\|>\s*assistant\s*)?(?:<\|channel\|>\s*\w+\s*)?")  # what a header holds before to=


def read_harmony(text: str, specs: Specs) -> tuple[str, list[Read]]:
    """Each message addressed to ``functions.NAME``: its header runs from the message's start (``<|start|>``,
    the end of the message before, or the reply's start) to ``<|message|>``, its arguments to ``<|call|>``
    (or ``<|end|>``/``<|return|>``, which end any message, or the text's end: a server hands its parser the
    reply without the stop token it ended at). ``to=functions.`` in a message's text is text."""
    bounds = list(_BOUNDARY.finditer(text))
    starts = [bound.start() for bound in bounds]
    reads: list[Read] = []
    first = -1
    at = 0
    while (to := text.find(_RECIPIENT, at)) >= 0:
        at = to + len(_RECIPIENT)
        k = bisect.bisect_left(starts, to)  # bounds[k - 1]: the last before the recipient, bounds[k]: the next
        last = bounds[k - 1] if k else None
        start = 0 if last is None else last.start() if last[1] == "start" else last.end()
        if (last is not None and last[1] == "message") or not _LEAD.fullmatch(text, start, to):
            continue  # inside a message's text, or not a header
        first = start if first < 0 else first
        name = _NAME.match(text, at)[0] or None
        header_end = bounds[k] if k < len(bounds) else None
        body_end = bounds[k + 1] if header_end and header_end[1] == "message" and k + 1 < len(bounds) else None
        if header_end is None:
            reads.append(Read(name, failure="unclosed", error="the call's header never reaches <|message|>"))
            break
        if header_end[1] == "message" and body_end is None:  # the reply ends with this message
            arguments = load_json(text[header_end.end() :].strip())
            reads.append(invalid("the message is not JSON", name) if arguments is UNREAD else Read(name, arguments))
            break
        if header_end[1] != "message":
            reads.append(invalid("the call's header is not followed by <|message|>", name))
        elif body_end[1] not in ("call", "end", "return"):
            reads.append(Read(name, failure="unclosed", error="the call's message is never ended"))
        elif name is None:
            reads.append(Read(failure="missing_name", error="the recipient functions. names no tool"))
        else:
            arguments = load_json(text[header_end.end() : body_end.start()].strip())
            reads.append(invalid("the message is not JSON", name) if arguments is UNREAD else Read(name, arguments))
        if header_end[1] == "message" and body_end[1] in ("call", "end", "return"):
            at = body_end.end()
    return (text[:first].strip() if reads else text), reads


# deepseek ------------------------------------------------------------------------------------------------

_CALLS_BEGIN, _CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_CALL_BEGIN, _CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
_DEEPSEEK_CALL = re.compile(r"\s*(\w*)<｜tool▁sep｜>(?P<name>[^\n]*)\n```(?:json)?\n(.*)\n```\s*", re.S)


def _deepseek_call(inside: str, specs: Specs) -> list[Read]:
    call = _DEEPSEEK_CALL.fullmatch(inside)
    return _matched_call(
        call,
        "the call is not TYPE<｜tool▁sep｜>NAME and a ```json block",
        "the call names no tool",
        lambda name: load_json(call[3].strip()),  # type: ignore[index]
        "the ```json block is not JSON",
    )


def read_deepseek(text: str, specs: Specs) -> tuple[str, list[Read]]:
    """Each call block is an attempt; the list's closing ``<｜tool▁calls▁end｜>`` may be missing (a reply
    that stops after its last call is read whole, as vLLM reads it)."""
    content, reads = read_blocks(text, specs, _CALL_BEGIN, _CALL_END, _deepseek_call)
    opened = text.find(_CALLS_BEGIN)
    if opened >= 0 and (not reads or opened < text.find(_CALL_BEGIN)):
        if not reads and _CALLS_END not in text[opened:]:
            reads = [Read(failure="unclosed", error=f"the {_CALLS_BEGIN} block is never closed")]
        content = text[:opened].strip()
    return content, reads
