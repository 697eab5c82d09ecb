"""An agent's Chat Completions messages: checked, put in one shape, and laid out for the model's template.

Frameworks write the same chat in several ways (content as a string or a list of text parts, ``None``
or ``""`` beside tool calls, arguments as a JSON string re-serialised with other spacing, ``developer``
for ``system``). :func:`normalize` turns each request's messages into one shape, so the gateway can
tell whether a request continues the episode's chat (its messages start with the last request's and
the reply the gateway gave) by comparing values, never text.

:func:`for_template` lays the chat out for the model's chat template: as it is where the template
renders structured tool calls and ``tool`` messages, else with the calls written as text and the tool
results as a user message (:mod:`omrl.chat.tool_calls`), and the tools in the system message where
the template does not render ``tools`` either. :func:`tool_layout` reads how a template takes tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.history import native_tool_calls
from omrl.chat.render import render
from omrl.chat.tool_calls import call_text, result_text, template_format, tools_system_text
from omrl.errors import OmrlError

ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(OmrlError):
    """A request the gateway cannot serve (HTTP 400): the message names the field and what is valid."""


@dataclass(frozen=True)
class ToolLayout:
    """How a chat template takes tools: ``native`` (it renders a reply's ``tool_calls`` and ``tool``
    messages), ``renders_tools`` (it writes the ``tools=`` specs itself), ``format``, how a reply
    writes a call (:data:`omrl.chat.tool_calls.FORMATS`; None: a native format the gateway cannot read),
    and ``parallel``, whether it renders a reply holding several calls (Llama 3.1's raises on one)."""

    native: bool
    renders_tools: bool
    format: str | None = "hermes"
    parallel: bool = True


PROBE_NAME = "omrl_probe_tool"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}
PROBE_QUESTION = "omrl probe question"


def tool_layout(tokenizer: Any) -> ToolLayout:
    """How the tokenizer's chat template takes tools (see :class:`~omrl.gateway.messages.ToolLayout`):
    where it renders calls itself, the format is read from its render of one."""
    question = {"role": "user", "content": PROBE_QUESTION}
    try:
        renders = PROBE_NAME in render(tokenizer, [question], add_generation_prompt=True, tools=[PROBE_TOOL])
    except Exception:  # noqa: BLE001 - a template that refuses tools renders none
        renders = False
    native = native_tool_calls(tokenizer, {})
    if not native:
        return ToolLayout(False, renders, "hermes")  # the gateway writes the calls, in its own format
    texts = []
    for count in (1, 2):  # one call, then two: a template may render at most one a reply
        calls = [{"type": "function", "function": {"name": PROBE_NAME, "arguments": {"x": x}}} for x in range(count)]
        try:
            text = render(
                tokenizer, [question, {"role": "assistant", "content": "", "tool_calls": calls}], tools=[PROBE_TOOL]
            )
        except Exception:  # noqa: BLE001 - a template that cannot render the calls
            break
        texts.append(text[text.rfind(PROBE_QUESTION) :])
    fmt = template_format(texts[0], PROBE_NAME) if texts else None  # no call rendered: no format to read
    return ToolLayout(True, renders, fmt, parallel=len(texts) == 2 and texts[1].count(PROBE_NAME) >= 2)


def normalize(raw: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` in one shape: ``{role, content: str}`` plus ``tool_calls`` (each
    ``{id, name, arguments}``, arguments parsed from JSON where they are JSON) or ``tool_call_id``."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role is {role!r}; valid: {', '.join(ROLES)}")
        item: dict[str, Any] = {"role": "system" if role == "developer" else role}
        item["content"] = _text(message.get("content"), f"{where}.content")
        if role == "assistant" and message.get("tool_calls"):
            item["tool_calls"] = [
                _call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(message["tool_calls"])
            ]
        if role == "tool":
            item["tool_call_id"] = str(message.get("tool_call_id") or "")
        out.append(item)
    if out[-1]["role"] == "assistant":
        raise RequestError(
            "the last message is an assistant message; the gateway answers a chat that ends with a "
            "user, tool or system message"
        )
    return out


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"{where}[{i}] is a {kind or type(part).__name__!s} part; the gateway takes text parts only"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string, a list of text parts or null, got {type(content).__name__}")


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where} must be {{id, type: function, function: {{name, arguments}}}}")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # kept as the text it is: compared and rendered as such
        except RecursionError as exc:  # JSON this deep could not be compared or rendered either
            raise RequestError(f"{where}.function.arguments nests too deeply to read; send flatter JSON") from exc
    return {"id": str(call.get("id") or ""), "name": function["name"], "arguments": arguments}


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two normalized messages say the same: role, content (edge whitespace aside), and each
    tool call's name and arguments (their ids aside: some frameworks renumber them)."""
    if a["role"] != b["role"] or a["content"].strip() != b["content"].strip():
        return False
    calls_a, calls_b = a.get("tool_calls") or [], b.get("tool_calls") or []
    return len(calls_a) == len(calls_b) and all(
        x["name"] == y["name"] and x["arguments"] == y["arguments"] for x, y in zip(calls_a, calls_b)
    )


def continues(messages: Sequence[dict[str, Any]], seen: Sequence[dict[str, Any]]) -> bool:
    """Whether ``messages`` start with ``seen`` (the last request's messages and the reply given)."""
    return len(messages) > len(seen) and all(same_message(m, s) for m, s in zip(messages, seen))


MIN_PROMPT_CHARS = 12  # a task prompt shorter than this is too common a text to tell whose chat it is in


def of_another_episode(
    messages: Sequence[dict[str, Any]],
    own: str,
    others: Sequence[tuple[str, Sequence[dict[str, Any]], Sequence[dict[str, Any]]]],
    given: Sequence[dict[str, Any]] = (),
) -> bool:
    """Whether a call whose ``messages`` do not continue its own episode's chat belongs to another episode
    of ``others`` (task prompt, chat seen, replies the model gave there): it continues that chat once the chat
    holds a reply the model gave there (not a prompt many chats open with), or it holds that episode's task
    prompt and not its own task prompt ``own``. Of a same-task sibling's chat, which a history rewrite may
    repeat, only one holding a reply the model gave there and never here (``given``) counts: siblings sampled
    apart differ, and identical replies cannot be told apart."""
    text = "\n".join(str(message["content"]) for message in messages)
    for theirs, seen, replies in others:
        if any(message["role"] == "assistant" for message in seen) and continues(messages, seen):
            if theirs != own or any(_among(m, replies) and not _among(m, given) for m in seen):
                return True
        if theirs == own:
            continue
        if min(len(own), len(theirs)) >= MIN_PROMPT_CHARS and theirs in text and own not in text:
            return True
    return False


def _among(message: dict[str, Any], replies: Sequence[dict[str, Any]]) -> bool:
    return message["role"] == "assistant" and any(same_message(message, reply) for reply in replies)


def for_template(messages: Sequence[dict[str, Any]], layout: ToolLayout, names: dict[str, str]) -> list[dict[str, Any]]:
    """``messages`` as the chat template takes them (see the module docstring). ``names`` maps tool-call
    ids to tool names, for templates that name a ``tool`` message's tool; it grows with the calls seen."""
    out: list[dict[str, Any]] = []
    merged = False  # whether out[-1] is tool results written as a user message
    for message in messages:
        role, content = message["role"], message["content"]
        calls = message.get("tool_calls") or []
        if role == "assistant":
            names.update({call["id"]: call["name"] for call in calls if call["id"]})
        if role == "assistant" and calls and layout.native:
            structured = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
            ]
            out.append({"role": "assistant", "content": content, "tool_calls": structured})
        elif role == "assistant" and calls:
            text = "\n".join([*([content] if content else []), *(call_text(c["name"], c["arguments"]) for c in calls)])
            out.append({"role": "assistant", "content": text})
        elif role == "tool" and layout.native:
            out.append({"role": "tool", "content": content, "name": names.get(message["tool_call_id"], "")})
        elif role == "tool" and merged:  # several results answer one reply: one user message
            out[-1]["content"] += "\n" + result_text(content)
        elif role == "tool":
            out.append({"role": "user", "content": result_text(content)})
        else:
            out.append({"role": role, "content": content})
        merged = role == "tool" and not layout.native
    return out


def describe_tools(
    messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], layout: ToolLayout
) -> list[dict[str, Any]]:
    """A whole chat laid out by :func:`for_template`, with the tools described in its system message
    where the template does not render ``tools`` itself."""
    if not tools or layout.renders_tools:
        return messages
    described = tools_system_text(tools)
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{described}" if first else described}, *messages[1:]]
    return [{"role": "system", "content": described}, *messages]
