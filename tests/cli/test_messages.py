"""Messages print as written: a hint such as ``pip install 'omrl[plot]'`` keeps its brackets.

The CLI prints through rich, whose markup reads ``[plot]`` as a style tag and drops it, which
turned every install hint into ``pip install 'omrl'``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from omrl.cli import build_app, main, report_error
from omrl.errors import ConfigError, OmrlError

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = sorted(set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]) - {"dev"})
HINT = re.compile(r"omrl\\?\[([a-z0-9-]+)\]")


def named_extras() -> set[str]:
    """Every extra that a message in omrl's or the built-in plugins' code names."""
    sources = [*ROOT.joinpath("omrl").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]
    return {extra for path in sources for extra in HINT.findall(path.read_text())}


def test_every_extra_a_message_names_exists():
    assert named_extras() - set(EXTRAS) == set()


@pytest.mark.parametrize("extra", sorted(named_extras() | set(EXTRAS)))
@pytest.mark.parametrize("error", [OmrlError, ConfigError, RuntimeError, PermissionError])
def test_an_error_naming_an_extra_prints_it_whole(extra, error, capsys):
    exc = error(13, "cannot write") if error is PermissionError else error(f"install it: pip install 'omrl[{extra}]'")
    if error is PermissionError:
        exc.filename = f"runs/omrl[{extra}]"
    report_error(exc, debug=False)
    printed = capsys.readouterr().err
    assert f"omrl[{extra}]" in printed, printed


def test_a_missing_extra_reaches_the_terminal_whole(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now fails, as when not installed
    with pytest.raises(SystemExit) as stop:
        main(["plot", str(tmp_path)])
    assert stop.value.code == 2
    assert "pip install 'omrl[plot]'" in capsys.readouterr().err


def test_plugin_descriptions_print_as_written():
    result = CliRunner().invoke(build_app(), ["plugins", "--kind", "env"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "(pip install 'omrl[babyai]')" in result.output
