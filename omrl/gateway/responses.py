"""The Responses API (``POST /v1/responses``), served as Chat Completions underneath.

The OpenAI Agents SDK's default model speaks it. A request is translated into a :class:`ChatRequest`:
``instructions`` become the system message, ``input`` items become messages (text messages, a reply's
``function_call`` items one assistant message with its tool calls, ``function_call_output`` items tool
messages), function ``tools`` the same tools. The reply goes back as ``output`` items: a ``message``
with its ``output_text`` and one ``function_call`` per call, whole or as the stream of events the SDK
reads. Stateless only: ``previous_response_id`` and hosted tools (web search, file search...) are
refused by name.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Iterator

from omrl.gateway.messages import RequestError
from omrl.gateway.protocol import ChatRequest
from omrl.gateway.recorder import Reply


def chat_request(body: Any) -> ChatRequest:
    """The Chat Completions request that a Responses request asks for."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("previous_response_id"):
        raise RequestError("previous_response_id is not served: the gateway keeps no responses; send the whole input")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a string or a non-empty list of items")
    for index, item in enumerate(items):
        _add_item(messages, item, f"input[{index}]")
    tools = []
    for index, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(f"tools[{index}] is a {kind!r} tool; the gateway serves function tools only")
        spec = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        tools.append({"type": "function", "function": spec})
    if body.get("top_logprobs") or any("logprobs" in str(name) for name in body.get("include") or []):
        raise RequestError(
            "top_logprobs and include: [message.output_text.logprobs] are not served by /v1/responses; "
            "POST /v1/chat/completions with logprobs=true gives each sampled token's log-probability"
        )
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise RequestError(f"text.format {fmt.get('type')!r} is not served (nothing constrains decoding); valid: text")
    chat = {
        "model": body.get("model"),
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "max_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": body.get("stream"),
    }
    try:
        return ChatRequest.from_json({key: value for key, value in chat.items() if value is not None})
    except RequestError as exc:  # it names the translated chat's fields: say how they map back
        offset = 1 if body.get("instructions") else 0
        raise RequestError(
            f"{exc} (in the chat the Responses request translates to: messages[{offset}:] are input's items, "
            f"{'messages[0] is instructions, ' if offset else ''}max_tokens is max_output_tokens)"
        ) from exc


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise RequestError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        messages.append({"role": item.get("role"), "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id", ""),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # a reply's text and its calls are one message
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _content(output, where)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": content})
    elif kind == "reasoning":
        return  # the gateway writes no reasoning items; one from elsewhere carries nothing to render
    else:
        raise RequestError(f"{where} is a {kind!r} item; served: message, function_call, function_call_output")


def _content(content: Any, where: str) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return [
            {"type": "text", "text": part.get("text")}
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
            else part
            for part in content
        ]
    raise RequestError(f"{where}.content must be a string or a list of text parts")


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _output(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.content:
        text = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{secrets.token_hex(8)}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    for call in reply.tool_calls:
        arguments = (
            call["arguments"]
            if isinstance(call["arguments"], str)
            else json.dumps(call["arguments"], ensure_ascii=False)
        )
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{secrets.token_hex(8)}",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": arguments,
                "status": "completed",
            }
        )
    return items


def response(request: ChatRequest, reply: Reply, prompt_tokens: int, model: str) -> dict[str, Any]:
    """A ``response`` object for the first reply (the Responses API has no choices)."""
    cut = reply.finish_reason == "length"
    return {
        "id": f"resp_{secrets.token_hex(12)}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model,
        "output": _output(reply),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(reply.token_ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + len(reply.token_ids),
        },
    }


def events(whole: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``whole`` (a finished response) as the stream of events a streamed request reads."""
    sequence = iter(range(1_000_000))
    started = {**whole, "status": "in_progress", "output": [], "usage": None}
    yield "response.created", {"type": "response.created", "sequence_number": next(sequence), "response": started}
    for index, item in enumerate(whole["output"]):
        shell = {**item, "status": "in_progress"}
        if item["type"] == "message":
            shell["content"] = []
        elif item["type"] == "function_call":
            shell["arguments"] = ""
        yield (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": next(sequence),
                "output_index": index,
                "item": shell,
            },
        )
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield (
                "response.content_part.added",
                {
                    "type": "response.content_part.added",
                    "sequence_number": next(sequence),
                    **where,
                    "part": {**part, "text": ""},
                },
            )
            yield (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": next(sequence),
                    **where,
                    "delta": part["text"],
                    "logprobs": [],
                },
            )
            yield (
                "response.output_text.done",
                {
                    "type": "response.output_text.done",
                    "sequence_number": next(sequence),
                    **where,
                    "text": part["text"],
                    "logprobs": [],
                },
            )
            yield (
                "response.content_part.done",
                {"type": "response.content_part.done", "sequence_number": next(sequence), **where, "part": part},
            )
        else:
            where = {"item_id": item["id"], "output_index": index}
            yield (
                "response.function_call_arguments.delta",
                {
                    "type": "response.function_call_arguments.delta",
                    "sequence_number": next(sequence),
                    **where,
                    "delta": item["arguments"],
                },
            )
            yield (
                "response.function_call_arguments.done",
                {
                    "type": "response.function_call_arguments.done",
                    "sequence_number": next(sequence),
                    **where,
                    "arguments": item["arguments"],
                },
            )
        yield (
            "response.output_item.done",
            {
                "type": "response.output_item.done",
                "sequence_number": next(sequence),
                "output_index": index,
                "item": item,
            },
        )
    kind = "response.completed" if whole["status"] == "completed" else "response.incomplete"
    yield kind, {"type": kind, "sequence_number": next(sequence), "response": whole}
