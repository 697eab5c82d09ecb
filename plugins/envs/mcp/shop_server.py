"""The demo MCP server of ``mcp:sqlite``: an SQLite database's read-only tools over stdio.

``python -m omrl_plugins.envs.mcp.shop_server --db-path shop.db`` serves three tools, as the
``mcp-server-sqlite`` of PyPI names them: ``list_tables``, ``describe_table`` (its columns) and
``read_query`` (a SELECT; its rows as a JSON list of objects). The database is opened read-only, so
no call can change it; a query that is not a SELECT, an unknown table or bad SQL is a tool error
(``isError``) whose text says what was wrong (a ``ToolError``: mcp 2 hides any other exception's text).

It needs only the ``mcp`` SDK that ``pip install 'omrl[mcp]'`` brings, and works with mcp 1.x
(``FastMCP``) and 2.x (``MCPServer``, its new name).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

READ_ONLY = ("SELECT", "WITH")  # what a query may start with (the database refuses writes anyway)


def serve(db_path: str) -> Any:
    """The server of the database at ``db_path``, its three tools registered (``.run()`` serves stdio)."""
    try:  # mcp 2
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # mcp 1
        from mcp.server.fastmcp import FastMCP as Server
        from mcp.server.fastmcp.exceptions import ToolError

    server = Server("omrl-shop")
    uri = Path(db_path).resolve().as_uri() + "?mode=ro"

    def rows(sql: str, *parameters: Any) -> list[dict[str, Any]]:
        with closing(sqlite3.connect(uri, uri=True)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(sql, parameters)]

    def tables() -> list[str]:
        return [row["name"] for row in rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]

    @server.tool()
    def list_tables() -> str:
        """The names of the database's tables, as a JSON list."""
        return json.dumps(tables())

    @server.tool()
    def describe_table(table_name: str) -> str:
        """The columns of a table (name, type, whether it may be null, primary key), as a JSON list."""
        if table_name not in (names := tables()):
            raise ToolError(f"no table {table_name!r}; the tables: {', '.join(names)}")
        columns = rows('SELECT name, type, "notnull", pk FROM pragma_table_info(?)', table_name)
        return json.dumps(columns)

    @server.tool()
    def read_query(query: str) -> str:
        """Run a SELECT query on the database: its rows, as a JSON list of objects."""
        if not query.lstrip().upper().startswith(READ_ONLY):
            raise ToolError("Only SELECT queries are allowed: the database is read-only")
        try:
            return json.dumps(rows(query))
        except sqlite3.Error as exc:
            raise ToolError(f"SQLite error: {exc}") from None

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m omrl_plugins.envs.mcp.shop_server", description=__doc__)
    parser.add_argument("--db-path", required=True, help="the SQLite database file to serve (opened read-only)")
    db_path = parser.parse_args(argv).db_path
    if not Path(db_path).is_file():
        parser.error(f"--db-path {db_path}: no such file")
    serve(db_path).run()  # stdio


if __name__ == "__main__":
    main()
