"""Readers for the tool-call formats that write a call's arguments as literals of a syntax of their own,
read without evaluating anything (:mod:`omrl.chat.tool_formats` reads the tagged formats and holds what
every reader shares):

- ``gemma4`` (Gemma 4): ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,flag:true}<tool_call|>``, bare keys and
  strings between ``<|"|>`` marks;
- ``pythonic`` (LFM2, LFM2.5): ``<|tool_call_start|>[NAME(key='text', n=1), ...]<|tool_call_end|>``, read with
  :mod:`ast` as literals (never evaluated).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from omrl.chat.tool_formats import (
    MAX_JSON_DEPTH,
    UNREAD,
    WORDS,
    Read,
    Specs,
    invalid,
    json_depth,
    load_json,
    read_blocks,
)

# gemma4 --------------------------------------------------------------------------------------------------

_QUOTE = '<|"|>'
_BARE = re.compile(r"[^,:{}\[\]]*")


def _skip(text: str, at: int) -> int:
    while text[at : at + 1].isspace():
        at += 1
    return at


def _gemma_string(text: str, at: int) -> tuple[str, int] | None:
    """The string written at ``text[at:]`` (between ``<|"|>`` marks, or JSON-quoted) and where it ends; None
    when none starts there."""
    if text.startswith(_QUOTE, at):
        end = text.find(_QUOTE, at + len(_QUOTE))
        if end < 0:
            raise ValueError(f"a string is never closed with {_QUOTE}")
        return text[at + len(_QUOTE) : end], end + len(_QUOTE)
    if text.startswith('"', at):
        return json.JSONDecoder().raw_decode(text, at)  # a JSONDecodeError is a ValueError
    return None


def _gemma_value(text: str, at: int, depth: int = 0) -> tuple[Any, int]:
    """The value written at ``text[at:]`` and where it ends; ValueError when it does not read."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError("the arguments nest too deeply")
    at = _skip(text, at)
    string = _gemma_string(text, at)
    if string is not None:
        return string
    if text[at : at + 1] in ("{", "["):
        return _gemma_container(text, at, depth)
    word = _BARE.match(text, at)[0].strip()
    value = load_json(word)
    if value is UNREAD or isinstance(value, str):
        value = WORDS.get(word.lower(), UNREAD)
    if value is UNREAD:
        raise ValueError(f"no value at {text[at : at + 12]!r}")
    return value, _BARE.match(text, at).end()


def _gemma_container(text: str, at: int, depth: int) -> tuple[Any, int]:
    """The ``{key:value,...}`` or ``[value,...]`` at ``text[at]`` and where it ends."""
    closer = "}" if text[at] == "{" else "]"
    items: list[Any] = []
    at = _skip(text, at + 1)
    if text[at : at + 1] == closer:
        return ({} if closer == "}" else []), at + 1
    while True:
        if closer == "}":
            at = _skip(text, at)
            key = _gemma_string(text, at) or (_BARE.match(text, at)[0].strip(), _BARE.match(text, at).end())
            at = _skip(text, key[1])
            if not key[0] or text[at : at + 1] != ":":
                raise ValueError(f"an entry is not key:value at {text[at : at + 12]!r}")
            value, at = _gemma_value(text, at + 1, depth + 1)
            items.append((key[0], value))
        else:
            value, at = _gemma_value(text, at, depth + 1)
            items.append(value)
        at = _skip(text, at)
        if text[at : at + 1] == closer:
            return (dict(items) if closer == "}" else items), at + 1
        if text[at : at + 1] != ",":
            raise ValueError(f"expected ',' or {closer!r} at {text[at : at + 12]!r}")
        at += 1


def _gemma4_call(inside: str, specs: Specs) -> list[Read]:
    call = re.fullmatch(r"\s*call:([^{]*)(\{.*)", inside, re.S)
    if not call:
        return [invalid("the block is not call:NAME{...}")]
    name = call[1].strip()
    if not name:
        return [Read(failure="missing_name", error="the call names no tool")]
    try:
        arguments, end = _gemma_value(call[2], 0)
    except (ValueError, RecursionError) as exc:
        return [invalid(f"the arguments do not read: {exc}", name)]
    if call[2][end:].strip():
        return [invalid("text follows the arguments' closing }", name)]
    return [Read(name, arguments)]


def read_gemma4(text: str, specs: Specs) -> tuple[str, list[Read]]:
    return read_blocks(text, specs, "<|tool_call>", "<tool_call|>", _gemma4_call, after=True)


# pythonic ------------------------------------------------------------------------------------------------


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """The value a literal's syntax tree writes (JSON's true/false/null too); ValueError for anything else."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError("the arguments nest too deeply")
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Dict):
        keys = [_literal(key, depth + 1) if key is not None else None for key in node.keys]
        if not all(isinstance(key, str) for key in keys):
            raise ValueError("an object's keys must be strings")
        return {key: _literal(value, depth + 1) for key, value in zip(keys, node.values)}
    if isinstance(node, ast.Name) and node.id.lower() in WORDS:
        return WORDS[node.id.lower()]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, depth + 1)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"{ast.dump(node)[:60]} is not a literal")


def _pythonic_calls(inside: str, specs: Specs) -> list[Read]:
    source = inside.strip()
    try:
        if json_depth(source, "[{(", "]})") > MAX_JSON_DEPTH:
            raise ValueError("the block nests too deeply")
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [invalid("the block is not Python")]
    if not isinstance(tree, ast.List):
        return [invalid("the block is not a list of calls")]
    reads = []
    for call in tree.elts:
        if not isinstance(call, ast.Call):
            reads.append(invalid("an item of the list is not a call"))
        elif not isinstance(call.func, ast.Name):
            reads.append(Read(failure="missing_name", error="a call does not name a tool"))
        elif call.args or any(keyword.arg is None for keyword in call.keywords):
            reads.append(invalid("a call passes arguments without key=", call.func.id))
        else:
            try:
                arguments = {keyword.arg: _literal(keyword.value) for keyword in call.keywords}
            except (ValueError, RecursionError) as exc:
                reads.append(invalid(f"the arguments do not read: {exc}", call.func.id))
            else:
                reads.append(Read(call.func.id, arguments))
    return reads


def read_pythonic(text: str, specs: Specs) -> tuple[str, list[Read]]:
    return read_blocks(text, specs, "<|tool_call_start|>", "<|tool_call_end|>", _pythonic_calls)
