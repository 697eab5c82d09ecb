"""verifiers' chat messages as omrl lays out a chat: their text (text parts only), a prompt split into system
text, worked example and first observation, a reply as verifiers' assistant message, and a verifiers ``Tool``
as omrl's tool spec."""

from __future__ import annotations

import json
from typing import Any, Sequence

from omrl.chat.tool_calls import parse_tool_calls
from omrl.envs import DemoTurn


class NotText(Exception):
    """A message holds a part omrl cannot lay out as text (an image, audio)."""


def text_of(message: Any) -> str:
    """A message's content as text; NotText for a part that is not text."""
    content = message.get("content") if hasattr(message, "get") else None
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type") if hasattr(part, "get") else getattr(part, "type", None)
        if kind != "text":
            raise NotText(f"a part of type {kind or type(part).__name__!r}")
        texts.append(part.get("text") or "")
    return "\n".join(texts)


def role_of(message: Any) -> str:
    return str(message.get("role") if hasattr(message, "get") else "")


def layout(prompt: Sequence[Any]) -> tuple[str, tuple[DemoTurn, ...], str]:
    """A verifiers prompt as omrl lays out a chat: (its system text, its few-shot user/assistant pairs as a
    worked example, its remaining messages as the first observation)."""
    messages = list(prompt)
    system = []
    while messages and role_of(messages[0]) == "system":
        system.append(text_of(messages.pop(0)))
    demo = []
    while len(messages) >= 3 and [role_of(m) for m in messages[:2]] == ["user", "assistant"]:
        if messages[1].get("tool_calls"):
            break
        demo.append(DemoTurn(text_of(messages[0]), "", text_of(messages[1])))
        messages = messages[2:]
    return "\n\n".join(system), tuple(demo), "\n\n".join(text_of(m) for m in messages)


def same_messages(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two message lists hold the same roles and texts."""
    try:
        return [(role_of(m), text_of(m)) for m in a] == [(role_of(m), text_of(m)) for m in b]
    except NotText:
        return len(a) == len(b)


def tool_spec(tool: Any) -> dict[str, Any]:
    """A verifiers ``Tool`` as omrl's tool spec ``{name, description, parameters}``."""
    return {"name": tool.name, "description": tool.description or "", "parameters": dict(tool.parameters)}


def reply_content(reply: str, tools: list[dict[str, Any]], tool_format: str) -> str:
    """The reply's content: with tools offered and calls in it, the text before its calls."""
    if not tools:
        return reply
    read = parse_tool_calls(reply, tools, tool_format)
    return read.content if read.calls else reply


def reply_message(
    vf: Any, action: str, tools: list[dict[str, Any]], tool_format: str, turn: int
) -> tuple[Any, dict[str, Any]]:
    """The reply as verifiers' assistant message, its tool calls read as ``tool_format`` writes them (ids
    ``call_<turn>_<i>``), and the step's info about them."""
    if not tools:
        return vf.ResponseMessage(content=action, finish_reason="stop", is_truncated=False), {}
    read = parse_tool_calls(action, tools, tool_format)
    info: dict[str, Any] = {"tool_calls": [attempt.record() for attempt in read.attempts]}
    calls = [
        vf.ToolCall(id=f"call_{turn}_{i}", name=call.name, arguments=json.dumps(call.arguments))
        for i, call in enumerate(read.calls)
    ]
    if calls:
        info["tool"] = read.calls[0].name
        info["tool_error"] = any(call.status != "ok" for call in read.calls)
    message = vf.ResponseMessage(
        content=read.content if calls else action,
        tool_calls=calls or None,
        finish_reason="tool_calls" if calls else "stop",
        is_truncated=False,
    )
    return message, info
