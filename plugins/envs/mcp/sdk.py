"""The mcp SDK's calls, read alike across mcp 1.x and 2.x: list the tools, call one, its result as text,
and what went wrong in one line.

The SDK is imported inside each function, so that importing this module (and registering the env)
loads no mcp. mcp 2 renamed fields (``isError`` is ``is_error``) and classes (``McpError`` is
``MCPError``); :func:`model_field` and the lookups below read either.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

MAX_PAGES = 100  # tools/list pages read at most (a server that keeps handing out cursors)
CONNECTION_CLOSED = -32000  # the code the SDK fails requests with once the connection is gone (mcp.types)
NOISE_SHOWN = 200  # characters shown of a line a server printed on stdout that is not JSON-RPC
SERVER: contextvars.ContextVar[Any] = contextvars.ContextVar("omrl_mcp_server", default=None)  # its ServerSpec


@dataclass(frozen=True)
class ToolOutcome:
    """A tools/call result as text (its content's text parts; other parts named), and whether the
    server marked it an error (``isError``: the call failed, the server did not)."""

    text: str
    is_error: bool


async def list_tools(session: Any) -> list[dict[str, Any]]:
    """Every tool the server lists (all pages), as ``{name, description, parameters}``."""
    import mcp.types as types

    tools, cursor = [], None
    for _ in range(MAX_PAGES):
        page = await (
            session.list_tools(params=types.PaginatedRequestParams(cursor=cursor)) if cursor else session.list_tools()
        )
        tools += [
            {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": model_field(tool, "input_schema", "inputSchema") or {"type": "object", "properties": {}},
            }
            for tool in page.tools
        ]
        cursor = model_field(page, "next_cursor", "nextCursor")
        if not cursor:
            break
    return tools


async def call_tool(session: Any, name: str, arguments: dict[str, Any]) -> ToolOutcome:
    """Tool ``name``'s outcome, called in ``session``."""
    result = await session.call_tool(name, arguments)
    return ToolOutcome(result_text(result), bool(model_field(result, "is_error", "isError")))


def result_text(result: Any) -> str:
    """A tools/call result as text: its text parts joined by newlines, other parts named (``[image:
    image/png]``); with no content, its structured content as JSON."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {model_field(block, 'mime_type', 'mimeType')}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            mime = model_field(resource, "mime_type", "mimeType") or "unknown type"
            parts.append(text if isinstance(text, str) else f"[resource: {resource.uri} ({mime})]")
        else:
            parts.append(f"[{kind or type(block).__name__} content]")
    structured = model_field(result, "structured_content", "structuredContent")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def model_field(obj: Any, name: str, v1_name: str) -> Any:
    """A field of an SDK model: mcp 2 spells it ``name``, mcp 1 ``v1_name`` (read only where the
    first is missing: mcp 2 warns on every read of the old spelling)."""
    if hasattr(obj, name):
        return getattr(obj, name)
    return getattr(obj, v1_name, None)


def http_client() -> Callable[[str], Any]:
    """The streamable-HTTP transport: ``streamable_http_client`` (mcp 2, late 1.x) or ``streamablehttp_client``."""
    import mcp.client.streamable_http as http

    return getattr(http, "streamable_http_client", None) or http.streamablehttp_client


def mcp_error() -> type[Exception]:
    """The SDK's error-answer exception: MCPError (mcp 2) or McpError (mcp 1)."""
    import mcp.shared.exceptions as exceptions

    return getattr(exceptions, "MCPError", None) or exceptions.McpError


def describe_failure(exc: BaseException) -> str:
    """What went wrong, one line: the innermost errors of an exception group, not the group."""
    leaves = _leaves(exc)
    if not leaves:
        return "cancelled"
    text = "; ".join(_one_line(leaf) for leaf in leaves[:3])
    return text if len(text) <= 500 else text[:500] + "..."


def _one_line(exc: BaseException) -> str:
    import anyio

    closed = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)  # mcp 1's way to say it
    if isinstance(exc, closed) or getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED:
        return "the connection closed (the server exited, or closed its output)"
    return f"{type(exc).__name__}: {str(exc).strip() or 'no detail'}"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, asyncio.CancelledError):
        return []
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup (anyio's task groups raise them)
    if inner:
        return [leaf for sub in inner for leaf in _leaves(sub)]
    return [exc]


class _StdoutNoise(logging.Filter):
    """The SDK logs a 10-line traceback for each line a stdio server prints on stdout that is not JSON-RPC
    (a print() left in a tool, say), naming neither the server nor the line: one warning line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Failed to parse JSONRPC"):
            spec = SERVER.get()
            line = _input_of(record.exc_info[1])
            line = spec.hide(line) if spec is not None else line
            shown = line if len(line) <= NOISE_SHOWN else line[:NOISE_SHOWN] + "..."
            record.msg = (
                f"{spec or 'an MCP server'} printed a line on stdout that is not JSON-RPC (ignored; a server "
                f"must log to stderr): {shown!r}"
            )
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_stdout_noise() -> None:
    """Put :class:`_StdoutNoise` on the SDK's stdio logger (once)."""
    logger = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(known, _StdoutNoise) for known in logger.filters):
        logger.addFilter(_StdoutNoise())


def _input_of(exc: BaseException | None) -> str:
    """The line a pydantic ValidationError could not read (its first error's input), else the error's text."""
    errors = getattr(exc, "errors", None)
    line = errors()[0].get("input") if callable(errors) and errors() else None
    return line if isinstance(line, str) else str(exc)
