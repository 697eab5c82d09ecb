"""An MCP server for the mcp env's tests whose tools each take one argument of a schema other than a plain
string: a list or null (``anyOf``), anything (no ``type`` at all), and a string or null, which stays text."""

from __future__ import annotations

import json
from typing import Any, Optional

try:  # mcp 2
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1
    from mcp.server.fastmcp import FastMCP as Server

server = Server("omrl-test-schemas")


@server.tool()
def total(values: Optional[list[int]] = None) -> int:
    """The sum of a list of integers."""
    return sum(values or [])


@server.tool()
def keys(data: Any) -> str:
    """The keys of a JSON object, sorted and joined by commas."""
    return ",".join(sorted(data)) if isinstance(data, dict) else f"not an object: {type(data).__name__}"


@server.tool()
def echo(text: Optional[str] = None) -> str:
    """The text it was given, as JSON (so a string shows its quotes)."""
    return json.dumps(text)


if __name__ == "__main__":
    server.run()
