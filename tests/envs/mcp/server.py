"""A small MCP server for the mcp env's tests, run as its own process: over stdio by default, or over
streamable HTTP on a port (``python server.py --port 8123``). With ``MCP_TEST_PID_FILE`` set it
writes its pid there, so a test can kill it from outside; with ``MCP_TEST_ESCAPEE_PID_FILE`` set it first
starts a long sleeper in a session of its own (``setsid``, as a daemonizing server does) and writes that
one's pid there. Its ``block`` tool holds the whole server (no end-of-input is read meanwhile), having
written ``MCP_TEST_BLOCK_FILE``."""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time

import anyio

try:  # mcp 2
    from mcp.server.mcpserver import Image
    from mcp.server.mcpserver import MCPServer as Server
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1
    from mcp.server.fastmcp import FastMCP as Server
    from mcp.server.fastmcp import Image
    from mcp.server.fastmcp.exceptions import ToolError

PIXEL = base64.b64decode(  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
TABLE = {"alice": "42", "bob": "7"}

server = Server("omrl-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def lookup(key: str) -> str:
    """The value stored under a key."""
    if key not in TABLE:
        raise ToolError(f"no key {key!r}; keys: {', '.join(TABLE)}")
    return TABLE[key]


@server.tool()
def fail() -> str:
    """Always fails (a tool error, not a server error)."""
    raise ToolError("this tool always fails")


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after ``seconds``."""
    await anyio.sleep(seconds)
    return f"slept {seconds} s"


@server.tool()
def block(seconds: float) -> str:
    """Holds the whole server for ``seconds`` (a synchronous sleep: nothing else is read meanwhile)."""
    if os.environ.get("MCP_TEST_BLOCK_FILE"):
        with open(os.environ["MCP_TEST_BLOCK_FILE"], "w") as out:
            out.write("blocking")
    time.sleep(seconds)
    return f"blocked {seconds} s"


@server.tool()
def chatter(text: str) -> str:
    """Prints ``text`` on stdout, the protocol's own stream (a common server bug), then answers."""
    print(text, flush=True)
    return f"said {len(text)} characters"


@server.tool()
def crash() -> str:
    """Kills the server process at once."""
    os._exit(3)


@server.tool()
def picture() -> list:
    """A caption and an image."""
    return ["a red pixel", Image(data=PIXEL, format="png")]


@server.tool()
def long_text(count: int) -> str:
    """``count`` characters of text."""
    return "x" * count


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    if os.environ.get("MCP_TEST_ESCAPEE_PID_FILE"):
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        escapee = subprocess.Popen(sleeper, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        with open(os.environ["MCP_TEST_ESCAPEE_PID_FILE"], "w") as out:
            out.write(str(escapee.pid))
    if os.environ.get("MCP_TEST_PID_FILE"):
        with open(os.environ["MCP_TEST_PID_FILE"], "w") as out:
            out.write(str(os.getpid()))
    if port:
        try:
            server.run("streamable-http", host="127.0.0.1", port=port)
        except TypeError:  # mcp 1 takes host and port as settings
            server.settings.host, server.settings.port = "127.0.0.1", port
            server.run("streamable-http")
    else:
        server.run()
