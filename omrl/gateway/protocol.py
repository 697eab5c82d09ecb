"""The Chat Completions wire format: a request read and checked, a reply written whole or as events.

Served: ``messages``, ``tools`` and ``tool_choice`` (``none`` leaves the tools out; ``auto``,
``required`` and a named function offer them, nothing constrains what the model samples), ``n``,
``stop``, ``max_tokens`` and ``max_completion_tokens``, ``temperature``, ``top_p`` and ``seed`` (see
:class:`ChatRequest`), ``logprobs`` (the sampled tokens' own; ``top_logprobs`` is refused),
``stream`` with ``stream_options.include_usage``, and ``response_format`` of type ``text``. Options
that would change what the model samples (:data:`NEUTRAL`: penalties, ``logit_bias``, ``top_k``...)
are refused unless neutral. Other keys frameworks send (``user``, ``metadata``,
``parallel_tool_calls``, ``store``...) change nothing.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from omrl.chat.tool_calls import function_of
from omrl.gateway.messages import RequestError, normalize
from omrl.gateway.recorder import Reply

MAX_CHOICES = 16


@dataclass
class ChatRequest:
    """A checked Chat Completions request. ``temperature``, ``top_p`` and ``seed`` are the agent's
    (None: not given); the gateway decides whether they apply (``agent.sampling``)."""

    messages: list[dict[str, Any]]
    model: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)  # offered to the model (empty with tool_choice none)
    n: int = 1
    stop: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    retry: bool = False  # the client says it sent this call before (openai's x-stainless-retry-count above 0)

    @classmethod
    def from_json(cls, body: Any) -> "ChatRequest":
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        tools = _tools(body.get("tools"))
        choice = body.get("tool_choice")
        if choice == "none":
            tools = []
        elif choice not in (None, "auto", "required") and not (
            isinstance(choice, dict) and isinstance(function_of(choice).get("name"), str)
        ):
            raise RequestError(
                f"tool_choice is {choice!r}; valid: none, auto, required or {{type: function, function: {{name}}}}"
            )
        elif isinstance(choice, dict) and function_of(choice)["name"] not in {t["function"]["name"] for t in tools}:
            offered = ", ".join(t["function"]["name"] for t in tools) or "none"
            raise RequestError(f"tool_choice names {function_of(choice)['name']!r}, not one of the tools ({offered})")
        unserved_sampling(body)
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            kind = fmt.get("type") if isinstance(fmt, dict) else fmt
            raise RequestError(f"response_format {kind!r} is not served (nothing constrains decoding); valid: text")
        if _number(body, "top_logprobs", int, 0, 20):
            raise RequestError("top_logprobs is not served; logprobs=true gives each sampled token's log-probability")
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise RequestError("stream_options must be an object such as {include_usage: true}")
        return cls(
            messages=normalize(body.get("messages")),
            model=str(body.get("model") or ""),
            tools=tools,
            n=_number(body, "n", int, 1, MAX_CHOICES) or 1,
            stop=_stops(body.get("stop")),
            max_tokens=_number(body, "max_completion_tokens", int, 1, None)
            or _number(body, "max_tokens", int, 1, None),
            temperature=_number(body, "temperature", float, 0.0, 2.0),
            top_p=_number(body, "top_p", float, 0.0, 1.0),
            seed=_number(body, "seed", int, -SEED_LIMIT, SEED_LIMIT),
            logprobs=bool(body.get("logprobs")),
            stream=bool(body.get("stream")),
            include_usage=bool(stream_options.get("include_usage")),
        )


#: options that change what the model samples, each with the values that change nothing: the policy samples as
#: the run says (training's log-probabilities assume it), so any other value is refused rather than ignored
NEUTRAL = {
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "min_p": (0,),
    "top_k": (0, -1),
    "logit_bias": ({},),
    "functions": ([],),  # the legacy form of tools
    "function_call": ("none", "auto"),
    "best_of": (1,),
    "echo": (False,),
    "modalities": (["text"],),
    # vLLM's constrained decoding (sent through extra_body): no value leaves the samples as they are
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
}


def unserved_sampling(body: dict[str, Any]) -> None:
    """A RequestError naming the first option of :data:`NEUTRAL` that ``body`` sets to a value that would
    change what the model samples."""
    for key, neutral in NEUTRAL.items():
        value = body.get(key)
        # True == 1: a flag is neutral only where the neutral value is a flag too
        if value is not None and not any(
            value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral
        ):
            valid = "".join(f"{json.dumps(v)} or " for v in neutral)
            hint = "; send tools and tool_choice" if key.startswith("function") else ""
            raise RequestError(
                f"{key}={json.dumps(value)[:80]} is not served (the policy samples as the run sets); valid: "
                f"{valid}leave it out{hint}"
            )


#: how large a request's seed may be: the engines add row and chunk numbers to it within 64 bits
SEED_LIMIT = 2**62


def _number(body: dict, key: str, kind: type, low: float | None, high: float | None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and isinstance(value, float) and not value.is_integer())  # float() overflows past 1e308
    ):
        raise RequestError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise RequestError(f"{key} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"{key} must be {bounds}, got {value!r}")
    return kind(value)


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"stop must be a non-empty string or a list of them, got {value!r}")
    return stops


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools must be a list of {type: function, function: {name, description, parameters}}")
    for i, tool in enumerate(value):
        spec = function_of(tool)
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise RequestError(f"tools[{i}] must be {{type: function, function: {{name, description, parameters}}}}")
        if spec.get("parameters") is not None and not isinstance(spec["parameters"], dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object")
    return [{"type": "function", "function": function_of(tool)} for tool in value]


# -- replies -----------------------------------------------------------------------------------------
def _wire_calls(reply: Reply, with_index: bool = False) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(reply.tool_calls):
        arguments = (
            call["arguments"]
            if isinstance(call["arguments"], str)
            else json.dumps(call["arguments"], ensure_ascii=False)
        )
        item = {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": arguments}}
        calls.append({"index": index, **item} if with_index else item)
    return calls


def _logprobs(tokenizer: Any, reply: Reply) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(reply.token_ids, reply.logprobs):
        token = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content}


def completion(
    request: ChatRequest, replies: list[Reply], prompt_tokens: int, model: str, tokenizer: Any
) -> dict[str, Any]:
    """A ``chat.completion`` object for ``replies`` (one per choice)."""
    choices = []
    for index, reply in enumerate(replies):
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else "")}
        if reply.reasoning is not None:  # where vLLM's reasoning parsers put it
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = _wire_calls(reply)
        choice = {"index": index, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
        if request.logprobs:
            choice["logprobs"] = _logprobs(tokenizer, reply)
        choices.append(choice)
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "omrl",
        "choices": choices,
        "usage": _usage(prompt_tokens, replies),
    }


def _usage(prompt_tokens: int, replies: list[Reply]) -> dict[str, int]:
    completion_tokens = sum(len(r.token_ids) for r in replies)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunks(
    request: ChatRequest, replies: list[Reply], prompt_tokens: int, model: str, tokenizer: Any
) -> Iterator[dict[str, Any]]:
    """The same replies as ``chat.completion.chunk`` events: per choice its role, its text, its tool calls
    and its finish reason, then the usage when asked for."""
    head = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "omrl",
    }

    def event(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    for index, reply in enumerate(replies):
        yield event(index, {"role": "assistant", "content": ""})
        if reply.reasoning:
            yield event(index, {"reasoning_content": reply.reasoning})
        # every sampled token's log-probability, once: on the text, else on the tool calls, else on the end
        logprobs = _logprobs(tokenizer, reply) if request.logprobs else None
        if reply.content:
            yield event(index, {"content": reply.content}, logprobs=logprobs)
            logprobs = None
        if reply.tool_calls:
            yield event(index, {"tool_calls": _wire_calls(reply, with_index=True)}, logprobs=logprobs)
            logprobs = None
        yield event(index, {}, reply.finish_reason, logprobs=logprobs)
    if request.include_usage:
        yield {**head, "choices": [], "usage": _usage(prompt_tokens, replies)}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
