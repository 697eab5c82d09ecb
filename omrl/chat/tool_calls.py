"""Tool calls in a model's reply, read the way a serving engine's parser for the family reads them, and
every attempt classified.

The formats (:data:`FORMATS`), by the vLLM parser of the same name where there is one:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes,
  and any model told so);
- ``json``: a reply that is the call's JSON object itself, ``{"name": ..., "parameters": {...}}``
  (Llama 3.1-3.3; several joined by ``;``);
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``
  (Qwen3.5 and later, Qwen3-Coder, Nemotron 3);
- ``glm45``: ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>`` (GLM-4.5);
- ``harmony``: a commentary-channel message to ``functions.NAME`` holding JSON, ended by ``<|call|>`` (gpt-oss);
- ``deepseek``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and a fenced JSON block (DeepSeek-V3);
- ``gemma4``: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`` (Gemma 4);
- ``pythonic``: ``<|tool_call_start|>[NAME(key='text', n=1)]<|tool_call_end|>`` (LFM2, LFM2.5).

The formats after ``json`` are read by :mod:`omrl.chat.tool_formats` (the tagged ones) and
:mod:`omrl.chat.tool_literals` (``gemma4``, ``pythonic``), which say how each writes its values. :func:`template_format` reads a chat template's own from how it writes a call. Each block, object
or message holding a call is one *attempt*, and each attempt gets a status:

- ``ok``: a call naming an offered tool, its arguments fitting the tool's schema;
- ``invalid_json``: the block cannot be read (not a JSON object; in the other formats, its structure or
  its arguments do not parse);
- ``unclosed``: an opening tag with no closing tag (a reply cut at its token limit, say);
- ``missing_name``: a call without a name (a JSON object without a string ``name``);
- ``unknown_tool``: a name no offered tool has;
- ``bad_arguments``: arguments that are not an object, lack a required key, name a key the schema
  does not have, or hold a value of another JSON type;
- ``unsupported_parallel``: a call past the first in a reply, where the model's chat template renders one
  call a reply (Llama 3.1's raises on more: :func:`one_call_only`).

The first three and ``unsupported_parallel`` lose the call: a call that parsed (``ok``, ``unknown_tool``,
``bad_arguments``) is handed to the agent, as an engine's parser would, and the agent's framework answers
it; the status says what the model got wrong, so a run can count it (a run whose tool calls all fail to
parse must never look like a run that chose not to call tools).

For chat templates that do not render tools themselves, :func:`tools_system_text`,
:func:`call_text` and :func:`result_text` write ``hermes`` calls as text.

Text in, text out: with its two readers' modules it sits at the bottom of :mod:`omrl.chat`, importing
no template or tokenizer code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.tool_formats import (
    MAX_JSON_DEPTH,
    Reader,
    json_depth,
    load_json,
    read_deepseek,
    read_glm45,
    read_harmony,
    read_qwen3_coder,
)
from omrl.chat.tool_literals import read_gemma4, read_pythonic

READERS: dict[str, Reader] = {
    "qwen3_coder": read_qwen3_coder,
    "glm45": read_glm45,
    "harmony": read_harmony,
    "deepseek": read_deepseek,
    "gemma4": read_gemma4,
    "pythonic": read_pythonic,
}
SIGNS = {  # how each format writes a call to NAME, as a pattern (NAME: the escaped name)
    "qwen3_coder": r"<tool_call>\s*<function=NAME>",
    "glm45": r"<tool_call>\s*NAME\s*(?:<arg_key>|</tool_call>)",
    "harmony": r"to=functions\.NAME(?=[\s<])",
    "deepseek": r"<｜tool▁sep｜>NAME\n",
    "gemma4": r"<\|tool_call>call:NAME\{",
    "pythonic": r"<\|tool_call_start\|>\[(?:.*?\),\s*)?NAME\(",
}
FORMATS = ("hermes", "json", *READERS)
STATUSES = ("ok", "invalid_json", "unclosed", "missing_name", "unknown_tool", "bad_arguments", "unsupported_parallel")
PARSED = ("ok", "unknown_tool", "bad_arguments")  # statuses whose call reaches the agent
OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class CallAttempt:
    """One ``<tool_call>`` block of a reply: its status, and the call when it parsed."""

    status: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None

    @property
    def parsed(self) -> bool:
        """Whether the call reaches the agent (it has a name and object arguments)."""
        return self.status in PARSED

    def record(self) -> dict[str, Any]:
        """What an episode keeps of the attempt (``Turn.info["tool_calls"]``)."""
        out: dict[str, Any] = {"status": self.status, "name": self.name}
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text and its tool-call attempts."""

    content: str  # the text the agent gets: before the first call when a call parsed (Gemma 4: and after
    # the last, where its template writes a reply's text), else the whole reply
    attempts: tuple[CallAttempt, ...] = ()

    @property
    def calls(self) -> list[CallAttempt]:
        return [a for a in self.attempts if a.parsed]


def parse_tool_calls(text: str, tools: Sequence[dict[str, Any]], fmt: str = "hermes") -> ParsedReply:
    """``text``'s tool-call attempts in format ``fmt`` against ``tools`` (OpenAI function specs,
    ``{"type": "function", "function": {name, parameters}}`` or the bare function); see the module docstring.

    >>> tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    ...     "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    >>> reply = parse_tool_calls('Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', tools)
    >>> reply.content, [a.status for a in reply.attempts], reply.calls[0].arguments
    ('Sure.', ['ok'], {'a': 1})
    >>> [a.status for a in parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": "x"}}', tools).attempts]
    ['unclosed']
    """
    specs = {spec["name"]: spec for spec in map(function_of, tools) if isinstance(spec.get("name"), str)}
    if fmt == "json":
        return _json_calls(text, specs)
    if fmt in READERS:
        content, reads = READERS[fmt](text, specs)
        attempts = [
            _classify(r.name, r.arguments, specs)
            if r.failure is None
            else CallAttempt(r.failure, r.name, None, r.error)
            for r in reads
        ]
        parsed = any(a.parsed for a in attempts)
        return ParsedReply(content if parsed else text, tuple(attempts))
    attempts: list[CallAttempt] = []
    at = text.find(OPEN)
    first = at
    while at >= 0:
        end = text.find(CLOSE, at + len(OPEN))
        if end < 0:
            attempts.append(CallAttempt("unclosed", error="the <tool_call> block is never closed"))
            break
        attempts.append(_attempt(text[at + len(OPEN) : end], specs))
        at = text.find(OPEN, end + len(CLOSE))
    parsed = any(a.parsed for a in attempts)
    content = text[:first].strip() if parsed else text
    return ParsedReply(content, tuple(attempts))


def _json_calls(text: str, specs: dict[str, dict[str, Any]]) -> ParsedReply:
    """A reply that is one JSON call object or several joined by ``;`` (Llama 3's custom tools); a reply
    that does not open with ``{`` is text, with no attempt."""
    body = text.strip()
    if not body.startswith("{"):
        return ParsedReply(text)
    attempts, at = [], 0
    while at < len(body):
        if json_depth(body[at:]) > MAX_JSON_DEPTH:
            attempts.append(CallAttempt("invalid_json", error="the call nests too deeply"))
            break
        try:
            _, end = json.JSONDecoder().raw_decode(body, at)
        except (ValueError, RecursionError):
            attempts.append(CallAttempt("invalid_json", error="the reply opens a JSON object that does not parse"))
            break
        attempts.append(_attempt(body[at:end], specs))
        at = end
        while at < len(body) and body[at] in " \t\n;":
            at += 1
    parsed = any(a.parsed for a in attempts)
    return ParsedReply("" if parsed else text, tuple(attempts))


def one_call_only(reply: ParsedReply) -> ParsedReply:
    """``reply`` with each call that parsed after its first marked ``unsupported_parallel``, and so lost: for a
    chat template that renders one call a reply, which could not render the agent's chat holding more."""
    attempts: list[CallAttempt] = []
    for attempt in reply.attempts:
        if attempt.parsed and any(a.parsed for a in attempts):
            error = "the chat template renders one tool call a reply; this one came after the first"
            attempt = CallAttempt("unsupported_parallel", attempt.name, attempt.arguments, error)
        attempts.append(attempt)
    return ParsedReply(reply.content, tuple(attempts))


def template_format(rendered_call: str, probe_name: str) -> str | None:
    """The format a chat template writes a call to ``probe_name`` in (``rendered_call``: its render of a
    reply holding that call), or None when it is none of :data:`FORMATS` (Mistral's ``[TOOL_CALLS]``,
    Muse Glimmer's ``<atem:function_calls>``)."""
    name = re.escape(json.dumps(probe_name))
    if re.search(rf'{re.escape(OPEN)}\s*\{{\s*"name"\s*:\s*{name}', rendered_call):
        return "hermes"
    for fmt, sign in SIGNS.items():
        if re.search(sign.replace("NAME", re.escape(probe_name)), rendered_call):
            return fmt
    if re.search(rf'\{{\s*"name"\s*:\s*{name}\s*,\s*"(?:parameters|arguments)"', rendered_call):
        return "json"
    return None


def function_of(tool: Any) -> dict[str, Any]:
    """The function spec inside an OpenAI tool (``{"type": "function", "function": {...}}``), or the tool."""
    if not isinstance(tool, dict):
        return {}
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def _attempt(payload: str, specs: dict[str, dict[str, Any]]) -> CallAttempt:
    call = load_json(payload.strip())  # UNREAD, as any value but an object, is no call
    if not isinstance(call, dict):
        return CallAttempt("invalid_json", error="the block is not a JSON object")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return CallAttempt("missing_name", error='the call has no string "name"')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # arguments written as a JSON string: what the OpenAI API itself sends
        arguments = load_json(arguments) if arguments.strip() else {}  # UNREAD: bad arguments
    return _classify(name, arguments, specs)


def _classify(name: str, arguments: Any, specs: dict[str, dict[str, Any]]) -> CallAttempt:
    """The status of a call that named a tool: unknown, arguments off the schema, or ok."""
    if not isinstance(arguments, dict):
        return CallAttempt("bad_arguments", name, None, "the arguments are not a JSON object")
    spec = specs.get(name)
    if spec is None:
        valid = ", ".join(sorted(specs)) or "none were offered"
        return CallAttempt("unknown_tool", name, arguments, f"no tool is named {name!r} (valid: {valid})")
    problem = schema_problem(spec.get("parameters") or {}, arguments)
    if problem:
        return CallAttempt("bad_arguments", name, arguments, problem)
    return CallAttempt("ok", name, arguments)


def schema_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with ``arguments`` under a tool's JSON schema (top-level keys: required, known,
    of the declared type or enum), or None."""
    properties = schema.get("properties") or {}
    missing = [key for key in schema.get("required") or [] if key not in arguments]
    if missing:
        return f"missing required argument {', '.join(map(repr, missing))}"
    unknown = [key for key in arguments if key not in properties]
    if unknown and properties and schema.get("additionalProperties") is not True:
        return f"unknown argument {', '.join(map(repr, unknown))} (valid: {', '.join(properties)})"
    for key, value in arguments.items():
        spec = properties.get(key) or {}
        kinds = spec.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if kinds and not any(_is_type(value, kind) for kind in kinds):
            return f"argument {key!r} must be of type {' or '.join(kinds)}, got {type(value).__name__}"
        if spec.get("enum") and value not in spec["enum"]:
            return f"argument {key!r} must be one of {spec['enum']}, got {value!r}"
    return None


def _is_type(value: Any, kind: str) -> bool:
    types = JSON_TYPES.get(kind)
    if types is None:
        return True  # a type this check does not know: not ours to refuse
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, types)


def call_text(name: str, arguments: Any) -> str:
    """One call as the format writes it."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def result_text(content: str) -> str:
    """A tool's result as the format writes it (in a user message, for templates without a tool role)."""
    return f"{RESULT_OPEN}\n{content}\n{RESULT_CLOSE}"


def tools_system_text(tools: Sequence[dict[str, Any]]) -> str:
    """The tools and how to call them, for a system message (templates that do not render ``tools``)."""
    lines = [
        "You may call these tools. To call one, reply with",
        f'{OPEN}\n{{"name": <tool name>, "arguments": {{<argument>: <value>}}}}\n{CLOSE}',
        "Tools:",
        *(json.dumps(function_of(tool), ensure_ascii=False) for tool in tools),
    ]
    return "\n".join(lines)
