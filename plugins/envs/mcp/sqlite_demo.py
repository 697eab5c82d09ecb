"""``mcp:sqlite``: questions about a small shop, answered with the real ``mcp-server-sqlite`` (PyPI).

The shop (``data/shop.sql``: customers, products, orders and their items, 57 rows) becomes an SQLite
file in the temp dir at the first use in a process (never inside the package); each question in
``data/shop_tasks.jsonl`` (32, the train split) and ``data/shop_tasks_test.jsonl`` (10, the test
split) carries the SQL that computes its answer. The model gets the server's read-only tools
(``list_tables``, ``describe_table``, ``read_query``), so no episode can change the shop.

``mcp-server-sqlite`` is found next to this Python or on PATH. Its last release (2025.4.25) imports
mcp 1.x APIs that mcp 2 removed, so where this environment has mcp 2 it must be installed in an
environment of its own, which puts it on PATH: ``uv tool install mcp-server-sqlite --with 'mcp<2'``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sqlite3
import sys
import tempfile
import threading
from contextlib import closing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from omrl_plugins.envs.engines.common import MissingExtraError

DATA = Path(__file__).parent / "data"
SERVER = "mcp-server-sqlite"
TASKS = DATA / "shop_tasks.jsonl"
TEST_TASKS = DATA / "shop_tasks_test.jsonl"
READ_ONLY_TOOLS = ["list_tables", "describe_table", "read_query"]
INSTRUCTION = (
    "Answer the question about the shop from its SQLite database: look at its tables, query them, "
    "then give the answer alone (a number or a name)."
)
LAST_RELEASE_FOR_MCP_1 = "2025.4.25"  # mcp-server-sqlite releases up to this one need mcp < 2
SEPARATE_INSTALL = f"uv tool install {SERVER} --with 'mcp<2'"


def shop_command() -> list[str]:
    """The command line of the demo's server: ``mcp-server-sqlite --db-path <the shop's database>``."""
    return [find_server(), "--db-path", str(shop_database())]


@functools.cache
def shop_database() -> Path:
    """The shop's SQLite file, built from ``data/shop.sql`` once a process (a fresh copy: nothing an
    earlier run did to it stays), named by the SQL's hash in the temp dir."""
    sql = (DATA / "shop.sql").read_text(encoding="utf-8")
    digest = hashlib.sha256(sql.encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "omrl-mcp" / f"shop-{digest}.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}-{threading.get_ident()}.partial")
    partial.unlink(missing_ok=True)
    with closing(sqlite3.connect(partial)) as db:
        db.executescript(sql)
        db.commit()
    os.replace(partial, target)  # at once: servers of other processes may be reading it
    return target


def find_server() -> str:
    """The ``mcp-server-sqlite`` to run: the one next to this Python when it can run with the mcp
    installed here, else the first on PATH from another environment; MissingExtraError naming the
    install when there is none."""
    here = Path(sys.executable).parent
    directories = [here, *(Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d)]
    seen, unusable = set(), None
    for directory in directories:
        candidate = directory / SERVER
        if not (candidate.is_file() and os.access(candidate, os.X_OK)) or candidate.resolve() in seen:
            continue
        seen.add(candidate.resolve())
        if directory.resolve() == here.resolve() and (problem := _mcp_mismatch()):
            unusable = f"{candidate} cannot run here: {problem}"
            continue
        return str(candidate)
    if unusable:
        raise MissingExtraError(
            f"mcp:sqlite runs the MCP server {SERVER}, and {unusable}; install it in an environment of "
            f"its own, which puts it on PATH: {SEPARATE_INSTALL}"
        )
    raise MissingExtraError(
        f"mcp:sqlite runs the MCP server {SERVER}, which is not installed (looked next to {sys.executable} "
        f"and on PATH): pip install {SERVER} (where this environment has mcp 2: {SEPARATE_INSTALL})"
    )


def _mcp_mismatch() -> str:
    """Why this environment's mcp-server-sqlite cannot run with its mcp, or ""."""
    try:
        server, mcp = version(SERVER), version("mcp")
    except PackageNotFoundError:
        return ""
    if int(mcp.split(".")[0]) >= 2 and _release(server) <= _release(LAST_RELEASE_FOR_MCP_1):
        return f"{SERVER} {server} needs mcp < 2, and this environment has mcp {mcp}"
    return ""


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())
