"""Output fits 80 columns: listings group families, long lists of names are cut, keys are whole."""

from __future__ import annotations

import typer
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
    grouped = run("plugins")  # piped: a whole line a component (descriptions are not cut to fit 80 columns)
    assert len(grouped.splitlines()) < 90  # 17 env rows (families), not 400
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


def test_config_keys_print_every_key_whole_and_its_help_readable_at_80_columns():
    shown = run("config", "keys", "train")
    lines = shown.splitlines()
    assert widest(shown) <= 80 and len(lines) < 400  # was a 780-line table with a 13-character help column
    for key, kind, default, help_text in describe(TrainRunConfig):
        at = lines.index(f"{key}  {kind} = {default}")  # the key whole, with its type and default
        below = " ".join(line.strip() for line in lines[at + 1 : at + 1 + len(help_text) // 40 + 2])
        assert " ".join(help_text.split()) in below, key


def test_a_piped_config_show_keeps_every_line():
    shown = run("config", "show", "grpo")
    expected = to_yaml(command_line_config(TrainRunConfig, ["grpo"]))
    assert all(line in shown for line in expected.splitlines())


def test_help_at_80_columns_prints_every_flag_name_whole_on_one_line():
    """Neither cut (``--per-device-train-…``) nor folded onto a second line (``--per-device-train-b``)."""
    for command in ("sft", "train", "eval", "rollout"):
        shown = run(command, "--help")
        assert widest(shown) <= 80 and "…" not in shown, command
        names = {line[2:].split()[0] for line in shown.splitlines() if line.startswith("│ --")}
        click_command = typer.main.get_command(build_app()).commands[command]
        flags = [o for p in click_command.params for o in (*p.opts, *p.secondary_opts) if o[:2] == "--"]
        assert len(flags) > 5 and set(flags) <= names, (command, set(flags) - names)


def test_config_show_of_a_preset_on_another_env_previews_what_train_plays():
    import yaml

    result = CliRunner().invoke(build_app(), ["config", "show", "grpo", "env.name=gridworld"], env=NARROW)
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    # train plays a preset outside its env with the env's own turn cap, from the base of the preset's tuned model
    assert shown["env"]["max_turns"] == 0 and shown["model"]["name"] == "smollm2-135m"
    assert "preset grpo is a recipe for webshop" in result.stderr


def test_a_mixture_runs_summary_is_a_table_of_metrics_and_one_per_env_metric_by_env():
    from omrl.cli.train_cmd import summary_tables

    envs = ["gridworld", "babyai:GoTo", "webshop"]
    summary = {"steps": 4, "loss": 0.5, **{f"{m}/{e}": 0.1 for m in ("success", "reward", "turns") for e in envs}}
    plain, by_env = summary_tables(summary, envs)
    assert plain.row_count == 2 and by_env.row_count == 3 and len(by_env.columns) == 1 + len(envs)
    [alone] = summary_tables({"steps": 4, "loss": 0.5}, ["gridworld"])
    assert alone.row_count == 2


def test_time_keys_are_no_envs_in_the_summary():
    """``time/generate`` is no metric of an env "generate": every one-env run printed a bogus per-env table."""
    from omrl.cli.train_cmd import summary_tables

    times = {"time/generate": 1.5, "time/env": 0.5}
    [alone] = summary_tables({"steps": 4, **times}, ["gridworld"])
    assert list(alone.columns[0].cells) == ["steps", *times]
    mixed = {"steps": 4, **times, "success/gridworld": 0.5, "success/webshop": 0.25}
    plain, by_env = summary_tables(mixed, ["gridworld", "webshop"])
    assert list(plain.columns[0].cells) == ["steps", *times]
    assert [column.header for column in by_env.columns] == ["metric", "gridworld", "webshop"]
