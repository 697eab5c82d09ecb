"""``mcp:sqlite``: questions about a small shop, answered with the tools of an MCP server over its database.

The server is omrl's own :mod:`.shop_server` (``python -m omrl_plugins.envs.mcp.shop_server``), run
with this Python, so ``pip install 'omrl[mcp]'`` is all it needs, under mcp 1.x or 2.x. Its tools are
``list_tables``, ``describe_table`` and ``read_query``, named as in ``mcp-server-sqlite`` (PyPI), and
read-only: no episode can change the shop.

The shop (``data/shop.sql``: customers, products, orders and their items, 57 rows) becomes an SQLite
file in the temp dir at the first use in a process (never inside the package); each question in
``data/shop_tasks.jsonl`` (32, the train split) and ``data/shop_tasks_test.jsonl`` (10, the test
split) carries the SQL that computes its answer.

The expert (``omrl rollout --expert``) plays as a model should: it lists the tables, describes the
ones its question's SQL reads, runs that SQL with ``read_query``, and answers with the value the
server returned.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sqlite3
import sys
import tempfile
import threading
from contextlib import closing
from pathlib import Path

from omrl.envs import Observation, StepResult
from omrl_plugins.envs.dataset import TEST_START
from omrl_plugins.envs.mcp.env import McpEnv
from omrl_plugins.envs.tooling import ANSWER_TOOL

DATA = Path(__file__).parent / "data"
SERVER_MODULE = "omrl_plugins.envs.mcp.shop_server"
TASKS = DATA / "shop_tasks.jsonl"
TEST_TASKS = DATA / "shop_tasks_test.jsonl"
READ_ONLY_TOOLS = ["list_tables", "describe_table", "read_query"]
INSTRUCTION = (
    "Answer the question about the shop from its SQLite database: look at its tables, query them, "
    "then give the answer alone (a number or a name)."
)
_TABLES_READ = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.IGNORECASE)


def shop_command() -> list[str]:
    """The command line of the demo's server: this Python runs :mod:`.shop_server` on the shop's database."""
    return [sys.executable, "-m", SERVER_MODULE, "--db-path", str(shop_database())]


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


@functools.cache
def task_sql() -> dict[int, str]:
    """Each task id's SQL: the train file's rows are 0.., the test file's 1,000,000.. (the dataset env's ids)."""
    found = {}
    for start, path in ((0, TASKS), (TEST_START, TEST_TASKS)):
        with path.open(encoding="utf-8") as rows:
            found.update({start + index: json.loads(line)["sql"] for index, line in enumerate(rows)})
    return found


def expert_calls(sql: str, max_calls: int) -> list[tuple[str, dict[str, str]]]:
    """The tool calls (name, arguments) the expert makes for ``sql``: list the tables, describe each one
    the SQL reads (as many as ``max_calls`` leaves room for), then run it.

    >>> for call in expert_calls("SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id", 8):
    ...     print(call)
    ('list_tables', {})
    ('describe_table', {'table_name': 'orders'})
    ('describe_table', {'table_name': 'customers'})
    ('read_query', {'query': 'SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id'})
    >>> [name for name, _ in expert_calls("SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id", 2)]
    ['list_tables', 'read_query']
    """
    tables = list(dict.fromkeys(_TABLES_READ.findall(sql)))
    looks = [("list_tables", {}), *(("describe_table", {"table_name": table}) for table in tables)]
    return [*looks[: max(0, max_calls - 1)], ("read_query", {"query": sql})]


def first_value(result: str) -> str | None:
    """The first column of the first row of a ``read_query`` result (a JSON list of objects), as text;
    None when the result holds none (an error's text, no rows).

    >>> first_value('[{"COUNT(*)": 3}]'), first_value('[{"name": "Bob"}]'), first_value("[]")
    ('3', 'Bob', None)
    """
    try:
        rows = json.loads(result)
    except ValueError:
        return None
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) or not rows[0]:
        return None
    return str(next(iter(rows[0].values())))


class ShopEnv(McpEnv):
    """:class:`McpEnv` on the shop's server, with an expert that finds each answer with the tools."""

    _plan: tuple[tuple[str, str], ...] = ()  # the expert's tool calls for this episode: (tool, action)
    _done_calls = 0  # how many of them were played
    _found: str | None = None  # the value the episode's last read_query returned

    def start_help(self) -> str:
        return (
            f"mcp:sqlite runs its server with this Python ({sys.executable} -m {SERVER_MODULE}), which needs "
            "the mcp SDK: pip install 'omrl[mcp]'"
        )

    def reset(self, task_id: int) -> Observation:
        first = super().reset(task_id)
        calls = expert_calls(task_sql()[task_id], self.max_calls)
        # each as the action a tool call becomes, so the tool_call template writes it back as that call
        self._plan = tuple((name, self.action_from_tool_call(name, arguments)) for name, arguments in calls)
        self._done_calls, self._found = 0, None
        return first

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        if self._done_calls < len(self._plan) and result.info.get("tool") == self._plan[self._done_calls][0]:
            self._done_calls += 1
        if action.startswith("read_query[") and not result.info.get("tool_error"):
            self._found = first_value(result.observation)
        return result

    def expert_action(self) -> str | None:
        if super().expert_action() is None:  # no episode in progress, or it is over
            return None
        if self._done_calls < len(self._plan):
            return self._plan[self._done_calls][1]
        if self._found is not None:
            return f"{ANSWER_TOOL}[{self._found}]"
        return super().expert_action()  # the query failed: the file's answer
