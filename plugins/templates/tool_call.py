"""The tool-call template: the chat model's own function-calling format.

Two families' formats (option ``format``):

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- ``llama3`` (Llama 3.1-3.3): the bare object ``{"name": ..., "parameters": {...}}``.

The env's ``tools`` go to the tokenizer's chat template (``tools=``) in the OpenAI
function format ``{"type": "function", "function": {...}}`` that Qwen2.5,
Llama 3 and Mistral templates expect; an env without tools gets one generic
``act`` tool whose ``action`` argument is the action text. A parsed call is returned
as a structured ``tool_call`` too, so the rollout answers it with a ``tool`` message
where the chat template has that role.
"""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.chat.tool_calls import JSON_TYPES
from omrl.env_examples import example_action, example_arguments
from omrl.errors import short_repr
from omrl.templates import ParsedAction, Template
from omrl_plugins.templates.common import (
    EXAMPLE_THOUGHT,
    TemplateError,
    action_help,
    first_block,
    tool_signature,
    without_reasoning,
)

OPEN_TAG = "<tool_call>"
OPENING, CLOSING = re.compile(re.escape(OPEN_TAG)), re.compile(re.escape("</tool_call>"))
SURROGATE = re.compile("[\ud800-\udfff]")  # from JSON escapes such as \ud800; not writable as UTF-8
GENERIC_TOOL = "act"
_TYPES = JSON_TYPES  # what each JSON-schema type admits


def generic_tool(env: Any) -> dict[str, Any]:
    """The one tool of an env without tools: ``act(action: string)``."""
    return {
        "name": GENERIC_TOOL,
        "description": f"Take one action in the environment. {action_help(env)}".strip(),
        "parameters": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]},
    }


def _coerce(value: Any, kind: str | None) -> tuple[Any, bool] | None:
    """``value`` as JSON-schema type ``kind``: (value, unchanged?), or None when it does not fit."""
    if kind is None or kind not in _TYPES:
        return value, True
    if isinstance(value, _TYPES[kind]) and not (isinstance(value, bool) and kind in ("integer", "number")):
        return value, True
    # lossless conversions small models need: 3 -> "3", "3" -> 3, "true" -> True
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value), False
    if isinstance(value, str):
        return _from_text(value.strip(), kind)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value), False
    return None


def _from_text(text: str, kind: str) -> tuple[Any, bool] | None:
    """``text`` read as JSON-schema type ``kind`` ("3" -> 3, "true" -> True), or None when it does not fit."""
    try:
        if kind == "integer" and re.fullmatch(r"-?\d+", text):
            return int(text), False
        if kind == "number" and re.fullmatch(r"-?\d+(?:\.\d+)?", text):
            return float(text), False
    except ValueError:  # int() refuses thousands of digits
        return None
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true", False
    return None


def check_arguments(tool: dict[str, Any], args: dict[str, Any]) -> tuple[dict[str, Any], bool, str | None]:
    """(arguments coerced to the tool's schema, exactly right?, error or None)."""
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    signature = tool_signature(tool)
    missing = [key for key in params.get("required") or [] if key not in args]
    if missing:
        return args, False, f"Tool {tool['name']!r} needs argument {', '.join(map(repr, missing))}: {signature}."
    unknown = [key for key in args if key not in props]
    if unknown and params.get("additionalProperties") is not True:
        return args, False, f"Tool {tool['name']!r} has no argument {', '.join(map(repr, unknown))}: {signature}."
    out, exact = {}, True
    for key, value in args.items():
        spec = props.get(key, {})
        fitted = _coerce(value, spec.get("type"))
        if fitted is None:
            return (
                args,
                False,
                (f"Argument {key!r} of tool {tool['name']!r} must be of type {spec['type']}, got {short_repr(value)}."),
            )
        out[key], unchanged = fitted
        exact &= unchanged
        if spec.get("enum") and out[key] not in spec["enum"]:
            return (
                args,
                False,
                (
                    f"Argument {key!r} of tool {tool['name']!r} must be one of "
                    f"{', '.join(map(repr, spec['enum']))}, got {short_repr(value)}."
                ),
            )
    return out, exact, None


def _load_object(payload: str) -> tuple[Any, bool, str | None]:
    """(JSON value, parsed cleanly?, error): junk after a complete object is tolerated, not clean."""
    try:
        return json.loads(payload), True, None
    except (ValueError, RecursionError) as exc:
        start = payload.find("{")
        if start >= 0:
            try:
                return json.JSONDecoder().raw_decode(payload[start:])[0], False, None
            except (ValueError, RecursionError):
                pass
        return None, False, f"The tool call is not valid JSON ({_json_problem(exc)})."


def _json_problem(exc: Exception) -> str:
    """Why a reply's JSON did not load: nesting too deep and numbers too long fail outside the JSON grammar."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(";")[0]  # int() refusing thousands of digits


FORMATS = {"hermes": "arguments", "llama3": "parameters"}  # format -> the key that holds the arguments


class ToolCallTemplate(Template):
    """Function calling: one call per reply, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (``format=hermes``) or ``{"name": ..., "parameters": {...}}`` (``format=llama3``).

    ``format_ok`` needs exactly one tool call in the format, clean JSON with ``name`` and
    the arguments key, a known tool, arguments of the right types, and nothing after
    the call (reasoning before it is fine). Tolerated with ``format_ok`` False:
    a missing closing tag or tags where the format has none, extra text after
    the JSON, the other format's arguments key, arguments as a JSON string, and
    lossless type conversions ("3" for 3).
    """

    reply_tags: tuple[str, ...] = (re.escape(OPEN_TAG), re.escape("</tool_call>"))  # llama3's bare JSON has none

    def __init__(self, format: str = "hermes"):
        if format not in FORMATS:
            raise TemplateError(f"unknown tool-call format {format!r}; valid: {', '.join(FORMATS)}")
        self.format = format
        self.arguments_key = FORMATS[format]
        if format != "hermes":
            self.reply_tags = ()

    def call_format(self) -> str:
        return "hermes" if self.format == "hermes" else "json"  # omrl.chat.tool_calls's names

    def tools(self, env: Any) -> list[dict[str, Any]]:
        """The env's tools, or the generic ``act`` tool when it has none."""
        return list(getattr(env, "tools", None) or []) or [generic_tool(env)]

    @staticmethod
    def _generic(env: Any) -> bool:
        """Whether ``env`` has no tools of its own, so replies call the generic ``act`` tool."""
        return not getattr(env, "tools", None)

    def chat_template_kwargs(self, env: Any) -> dict:
        return {"tools": [{"type": "function", "function": tool} for tool in self.tools(env)]}

    def system_prompt(self, env: Any) -> str:
        shape = f'{{"name": <tool name>, "{self.arguments_key}": {{<argument>: <value>}}}}'
        lines = [
            str(getattr(env, "tool_help", "") or "") or action_help(env),  # the calls' words, not a text syntax
            "Call exactly one tool per reply, written as:",
            f"<tool_call>\n{shape}\n</tool_call>" if self.format == "hermes" else shape,
            # listed here too: many chat templates (SmolLM2's) do not render `tools`
            "Tools: " + "; ".join(tool_signature(t) for t in self.tools(env)),
            "Example:",
            self._render_call(*self._example_call(env), EXAMPLE_THOUGHT),
        ]
        return "\n".join(line for line in lines if line)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        """``action`` written as a well-formatted tool call (raises TemplateError if no tool can express it)."""
        return self._render_call(*self.call_for_action(action, env), thought)

    def _render_call(self, name: str, arguments: dict[str, Any], thought: str = "") -> str:
        call = json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)
        block = f"<tool_call>\n{call}\n</tool_call>" if self.format == "hermes" else call
        return (f"{thought}\n" if thought else "") + block

    def call_for_action(self, action: str, env: Any) -> tuple[str, dict[str, Any]]:
        """The tool call that the env turns into ``action`` (the inverse of ``env.action_from_tool_call``).

        Tries ``name[arg, ...]`` (the default conversion), then the whole action,
        or one of its enum values, as the one argument of a one-argument tool;
        the first call that ``env.action_from_tool_call`` turns back into
        ``action`` wins.
        """
        if self._generic(env):
            return GENERIC_TOOL, {"action": action}
        tools = self.tools(env)
        for name, args in self._candidate_calls(action, tools):
            tool = next(t for t in tools if t["name"] == name)
            fitted, _, error = check_arguments(tool, args)
            try:
                if error is None and env.action_from_tool_call(name, fitted) == action:
                    return name, fitted
            except Exception:  # a converter that rejects a guess: try the next one
                continue
        raise TemplateError(
            f"action {action!r} cannot be written as a call to the tools of {type(env).__name__} "
            f"({'; '.join(tool_signature(t) for t in tools)})"
        )

    @staticmethod
    def _candidate_calls(action: str, tools: list[dict[str, Any]]):
        """Guesses (tool name, arguments) for the tool call behind ``action``."""
        match = re.fullmatch(r"([\w\-]+)(?:\[(.*)\])?", action.strip(), re.S)
        for tool in tools:
            props = (tool.get("parameters") or {}).get("properties") or {}
            keys = list(props)
            if match and match.group(1) == tool["name"]:
                inner = match.group(2)
                values = [] if inner is None else [inner] if len(keys) == 1 else inner.split(", ")
                if len(values) == len(keys):
                    yield tool["name"], dict(zip(keys, values))
                if inner is not None and inner.strip().startswith("{"):  # name[{"a": 2}]: ToolEnv's JSON arguments
                    try:
                        arguments = json.loads(inner)
                    except ValueError:
                        arguments = None
                    if isinstance(arguments, dict):
                        yield tool["name"], arguments
            if len(keys) == 1:
                yield tool["name"], {keys[0]: action}
                for value in props[keys[0]].get("enum") or []:
                    yield tool["name"], {keys[0]: value}

    def answer(self, response: str) -> str:
        # a thinking model's reasoning may weigh a call it then does not make: the call is the one after it
        return without_reasoning(response)

    def parse(self, response: str, env: Any) -> ParsedAction:
        response = self.answer(response)
        block = first_block(response, OPENING, CLOSING)
        start = response.find(OPEN_TAG)
        thought = response[:start].strip() if start >= 0 else None
        hermes = self.format == "hermes"
        if block:
            payload = response[block[0].end() : block[1].start()]
            exact = hermes and not response[block[1].end() :].strip()  # also false when a second call follows
        elif start >= 0:
            payload, exact = response[start + len(OPEN_TAG) :], False
        elif "{" in response:
            payload, exact = response[response.find("{") :], not hermes
            thought = response[: response.find("{")].strip()
        else:
            return self._failed("No <tool_call> found.", env, response.strip() or None)
        thought = thought or None
        call, clean, error = _load_object(payload.strip())
        if error:
            return self._failed(error, env, thought)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return self._failed('The tool call must be a JSON object with "name" and "arguments".', env, thought)
        exact &= clean and set(call) == {"name", self.arguments_key}
        args = call.get(self.arguments_key, call.get("parameters" if hermes else "arguments", {}))
        if isinstance(args, str):
            args, _, error = _load_object(args)
            exact = False
            if error:
                return self._failed(f"The arguments are a string that is not JSON: {error}", env, thought)
        if not isinstance(args, dict):
            return self._failed(f'"arguments" must be a JSON object, got {short_repr(args)}.', env, thought)
        tools = {t.get("name"): t for t in self.tools(env)}
        tool = tools.get(call["name"])
        if tool is None:
            return self._failed(
                f"Unknown tool {short_repr(call['name'])}; valid tools: {', '.join(tools)}.", env, thought
            )
        args, args_exact, error = check_arguments(tool, args)
        if error:
            return self._failed(error, env, thought)
        if self._generic(env):
            action = args["action"].strip()
        else:
            try:
                action = env.action_from_tool_call(call["name"], args)
            except Exception as exc:  # the env's converter must not make parse raise
                return self._failed(f"The env rejected the call: {type(exc).__name__}: {exc}", env, thought)
        if not isinstance(action, str) or not action.strip():
            return self._failed("The tool call gave an empty action.", env, thought)
        structured = {"type": "function", "function": {"name": call["name"], "arguments": args}}
        return ParsedAction(
            SURROGATE.sub("\ufffd", action.strip()), exact and args_exact, thought, tool_call=structured
        )

    def _failed(self, problem: str, env: Any, thought: str | None) -> ParsedAction:
        try:
            example = self._render_call(*self._example_call(env))
        except Exception:  # a malformed env must not make parse raise
            example = self._render_call(GENERIC_TOOL, {"action": "..."})
        return ParsedAction(None, False, thought, error=f"{problem} Reply with one tool call, e.g.\n{example}")

    def _example_call(self, env: Any) -> tuple[str, dict[str, Any]]:
        if self._generic(env):
            return GENERIC_TOOL, {"action": example_action(env) or "..."}
        tool = self.tools(env)[0]
        return tool["name"], example_arguments(tool)
