"""The skill file for coding assistants (skills/omrl/SKILL.md): its install line is the README's (CI
runs that), and every other command in it runs, in order, in an empty folder, and succeeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.commands import run_each

ROOT = Path(__file__).resolve().parents[2]
SKILL = ROOT / "skills" / "omrl" / "SKILL.md"

pytestmark = pytest.mark.slow  # a whole small session: rollout, sft, two trains, eval, view


def blocks(info: str) -> list[str]:
    """The command lines of the skill's fenced blocks whose info string is ``info``."""
    text = SKILL.read_text(encoding="utf-8")
    found = re.findall(rf"^```{re.escape(info)}\n(.*?)^```", text, flags=re.S | re.M)
    return [line for block in found for line in block.splitlines() if line.strip()]


def test_the_skill_names_itself_for_the_assistant():
    head = SKILL.read_text(encoding="utf-8").split("---")[1]
    assert "name: omrl" in head and "description:" in head


def test_the_install_line_is_the_readmes():
    (install,) = blocks("bash install")
    assert install in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_command_of_the_skill_runs(tmp_path, tiny_model_dir):
    commands = blocks("bash")
    assert len(commands) >= 10
    run_each(commands, tmp_path)
    assert (tmp_path / "runs" / "grpo" / "view.html").is_file()
    steps = [
        line for line in (tmp_path / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines() if '"step"' in line
    ]
    assert len(steps) == 3  # the resumed run extended the first to 3 steps
