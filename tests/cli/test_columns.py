"""Output fits 80 columns: listings group families, long lists of names are cut, keys are whole."""

from __future__ import annotations

from typer.testing import CliRunner

from omrl.cli import build_app
from omrl.config import describe, to_yaml
from omrl.config.loading import command_line_config
from omrl.config.options import TrainRunConfig

NARROW = {"COLUMNS": "80"}


def run(*argv: str, env: dict | None = None):
    result = CliRunner().invoke(build_app(), list(argv), env=env or NARROW)
    assert result.exit_code == 0, result.output
    return result.output


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_env_list_shows_families_by_default_and_every_env_when_asked():
    families = run("env", "list")
    assert widest(families) <= 80 and len(families.splitlines()) < 30
    assert "babyai" in families and "babyai:GoToDoor" not in families
    assert "every env: omrl env list --all" in families
    every = run("env", "list", "--all", env={"COLUMNS": "250"})
    assert "babyai:GoToDoor" in every and len(every.splitlines()) > 300


def test_plugins_show_a_row_a_family_and_a_line_a_component():
    grouped = run("plugins")
    assert widest(grouped) <= 80 and len(grouped.splitlines()) < 80
    assert "gem:* (" in grouped and "gem:Sudoku" not in grouped
    assert "babyai:GoToDoor" in run("plugins", "--all", env={"COLUMNS": "250"})


def test_an_unknown_env_names_a_close_match_and_the_families_not_330_names():
    result = CliRunner().invoke(build_app(), ["env", "list", "babyai:GoTo"])
    message = str(result.exception)
    assert "Did you mean 'babyai:GoToDoor'?" in message
    assert "babyai:* (40)" in message and "reasoning-gym:* (" in message
    assert len(message) < 400, message


def test_third_party_envs_name_their_distribution_not_built_in(fake_plugins):
    table = run("env", "list", "keys")
    assert "built in" not in table  # registered in code: distribution '-'


def test_config_keys_print_every_key_whole():
    table = run("config", "keys", "train")
    assert all(key in table for key, *_ in describe(TrainRunConfig))


def test_a_piped_config_show_keeps_every_line():
    shown = run("config", "show", "grpo")
    expected = to_yaml(command_line_config(TrainRunConfig, ["grpo"]))
    assert all(line in shown for line in expected.splitlines())
