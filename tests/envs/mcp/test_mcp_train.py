"""``omrl train`` refuses an MCP server that cannot start before any model loads, as rollout and eval do."""

from __future__ import annotations

import re
import shlex
import sys

from tests.helpers import cli_exit

EXITS = [sys.executable, "-c", "import sys; sys.stderr.write('no database here\\n'); sys.exit(2)"]


def test_train_names_the_server_that_cannot_start_before_it_loads_a_model(tasks, tmp_path, capsys):
    model = tmp_path / "unloadable-model"  # a model folder whose loading would fail with another message
    model.mkdir()
    (model / "config.json").write_text("{}")
    code, _, err = cli_exit(
        capsys,
        "train",
        "--env",
        "mcp",
        f"plugins.mcp.command={shlex.join(EXITS)}",
        f"plugins.mcp.path={tasks}",
        "--model",
        str(model),
        "--output-dir",
        str(tmp_path / "run"),
    )
    said = " ".join(err.split())
    # the server's failure, not the model's (its stderr's tail is the mcp env's to quote: not asserted here)
    assert code == 2 and re.search(r"error: MCP server `.*`: could not start: ", said), err
    assert "no-such-model" not in said.split("could not start")[1]
