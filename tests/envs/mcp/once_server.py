"""An MCP server that serves once: the first time it runs (``MCP_TEST_ONCE_FILE`` not there yet) it answers
``initialize`` and ``tools/list``, then exits; every later run refuses to start, saying so on stderr (with
``$GITHUB_PAT``, for the redaction tests). So an env built on it starts, and its next reset fails: a server
that started once in the process and then cannot start. Plain JSON-RPC lines, so it imports no mcp."""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    marker = os.environ["MCP_TEST_ONCE_FILE"]
    if os.path.exists(marker):
        sys.stderr.write(f"no database here; token {os.environ.get('GITHUB_PAT', 'none')}\n")
        sys.exit(2)
    open(marker, "w").close()
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "once", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "noop", "description": "Nothing.", "inputSchema": {"type": "object"}}]}
        else:
            continue  # notifications/initialized
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
        if method == "tools/list":
            break
