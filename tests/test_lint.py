"""The tree passes the linter and the formatter configured in pyproject.toml ([tool.ruff])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_the_tree_passes_ruff(args):
    done = subprocess.run([sys.executable, "-m", "ruff", *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, (
        f"`ruff {' '.join(args)} .` found problems (`ruff check --fix .` and "
        f"`ruff format .` fix most):\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    )
