"""``mcp``: any MCP server's tools as an env (:mod:`.env`), over sessions held on one background event
loop (:mod:`.client`, the SDK's calls in :mod:`.sdk`); ``mcp:sqlite``, a shop's questions (:mod:`.sqlite_demo`) answered with the
tools of omrl's own SQLite server (:mod:`.shop_server`). Registering imports no mcp: the SDK loads at
the first env built."""

from omrl.envs import env_variant
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.mcp import sqlite_demo
from omrl_plugins.envs.mcp.env import McpEnv, McpTool, server_spec

__all__ = ["McpEnv", "McpTool", "register_envs", "server_spec"]


@hookimpl
def register_envs(register):
    register("mcp", McpEnv)
    register(
        "mcp:sqlite",
        env_variant(
            sqlite_demo.ShopEnv,
            "McpSqliteEnv",
            "Questions about a shop's SQLite database, answered with the tools of an MCP server over it.",
            command=sqlite_demo.shop_command,
            url=None,
            env=None,
            allowed_tools=sqlite_demo.READ_ONLY_TOOLS,
            path=str(sqlite_demo.TASKS),
            test_path=str(sqlite_demo.TEST_TASKS),
            prompt_key="question",
            answer_key="answer",
            test_fraction=0.0,
            seed=0,
            instruction=sqlite_demo.INSTRUCTION,
        ),
    )
