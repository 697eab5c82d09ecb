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


def test_piped_plugins_print_each_description_whole_as_plain_text():
    result = CliRunner().invoke(build_app(), ["plugins"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rm = next(line for line in lines if line.startswith("reward  rm  "))
    assert "(so with reward.allocation=per_turn each turn is trained on its own).  options: path=''" in rm  # whole
    assert not any("``" in line or ":func:`" in line for line in lines)  # reStructuredText read as text
    assert "see straight_through)" in next(line for line in lines if line.startswith("kl  k1+  "))


def test_omrls_own_warnings_print_as_one_line_without_a_source_location(capsys):
    import warnings

    import omrl.rewards
    from omrl.cli import quiet_third_parties

    saved = warnings.showwarning
    try:
        quiet_third_parties()
        warnings.showwarning("all rewards are 0", UserWarning, omrl.rewards.__file__, 200)
        warnings.showwarning("deprecated thing", FutureWarning, "/somewhere/site-packages/lib.py", 7)
    finally:
        warnings.showwarning = saved
    err = capsys.readouterr().err
    assert "warning: all rewards are 0\n" in err and "rewards.py" not in err  # omrl's: a message for the user
    assert "warning: FutureWarning: deprecated thing (lib.py:7)" in err  # a library's: where it came from


def test_the_banner_shows_no_sampling_for_the_expert_and_no_example_for_an_env_without_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["rollout", "--env", "gridworld", "--expert", "--num-tasks", "1", "-o", str(tmp_path / "x.parquet")])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "worked example none in this env" in out  # gridworld has none: not "on"
    assert "player the env's scripted expert (no model)" in out and "temperature" not in out
    assert "tok/s" not in out  # nothing is sampled


def test_a_family_whose_members_need_other_packages_is_not_listed_as_installed():
    from omrl.cli.env_cmd import family_rows

    rows = [
        {"name": "code", "package": None, "distribution": "omrl", "installed": True, "install": None},
        {
            "name": "code:babyai:GoTo",
            "package": "minigrid",
            "distribution": "omrl",
            "installed": False,
            "install": "pip install 'omrl[babyai]'",
        },
        {"name": "code:gem:Sudoku", "package": "gem-llm", "distribution": "omrl", "installed": True, "install": None},
    ]
    [code] = family_rows(rows)
    assert code["envs"] == 3 and code["installed_envs"] == 2 and not code["installed"]
    assert code["install"] == "pip install 'omrl[babyai]'"


GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:30338. This is typically caused by a remote worker crashing."
)


@pytest.mark.parametrize("make", [lambda: RuntimeError(GLOO_PEER_GONE), lambda: _dist_error("timed out")])
def test_a_process_that_lost_a_failed_peer_says_so_not_a_bug_in_omrl(make, monkeypatch, capsys):
    """Process 1 of two, whose peer failed first, printed gloo's error as "a bug in omrl or a plugin"."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert report_error(make(), debug=False) == 1
    printed = " ".join(capsys.readouterr().err.split())
    assert "process 1 of this run lost its connection to another, which failed first" in printed
    assert "bug in omrl" not in printed
    monkeypatch.setenv("WORLD_SIZE", "1")  # alone, the same error is no peer's
    report_error(make(), debug=False)
    assert "this is a bug in omrl or a plugin" in " ".join(capsys.readouterr().err.split())


def _dist_error(message: str) -> Exception:
    import torch.distributed

    return torch.distributed.DistBackendError(message)


def test_a_runs_folder_where_a_preset_goes_says_which_flag_takes_it(tmp_path, omrl_main):
    """`omrl eval runs/x` said "unknown preset 'runs/x'; valid: dpo, eval, ..." of a folder that exists."""
    run = tmp_path / "run"
    run.mkdir()
    code, _, err = omrl_main("eval", str(run))
    said = " ".join(err.split())
    assert code == 2 and f"{run} is a folder, not a preset" in said, said
    assert f"give --model {run}; to continue the run in it, --resume --output-dir {run}" in said


def test_an_unknown_plugin_kind_suggests_the_near_one(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["plugins", "--kind", "envs"])
    assert stop.value.code == 2
    assert "unknown kind 'envs'. Did you mean 'env'? Valid: advantage, env," in capsys.readouterr().err


def test_help_paragraphs_are_not_cut_where_the_docstring_wraps():
    listed = CliRunner().invoke(build_app(), ["--help"], env={"COLUMNS": "400"}).output
    assert "Exits 2, after the list, where two plugins' components" in listed
    own = CliRunner().invoke(build_app(), ["sweep", "--help"], env={"COLUMNS": "400"}).output
    assert "each cell plays num_tasks of each env" in own


def test_config_show_refuses_an_unknown_backend_as_the_commands_do(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["config", "show", "grpo-gridworld", "generation.backend=vllmm"])
    assert stop.value.code == 2
    assert "unknown generation backend 'vllmm'; valid: hf, vllm, openai" in capsys.readouterr().err


def test_a_family_given_where_one_env_goes_names_one_of_its_members(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["env", "play", "babyai:*"])
    assert stop.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'babyai:*' names a family of 40 envs, not one; give one of them, e.g. 'babyai:" in err
    assert "(omrl env list 'babyai:*' lists them)" in err


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_under_a_launch_only_the_main_process_says_a_stop_and_a_warning(rank, said, monkeypatch, capsys):
    """Every process of a launch printed the resume command and each warning: one copy per process."""
    import io
    import warnings

    import typer
    from rich.console import Console

    from omrl.cli import quiet_third_parties, stop_on_interrupt

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    out = io.StringIO()

    def stopped():
        raise KeyboardInterrupt("interrupted; continue with: omrl sft --resume")

    with pytest.raises(typer.Exit):
        stop_on_interrupt(stopped, Console(file=out))
    quiet_third_parties()
    warnings.warn_explicit("a setting nothing reads", UserWarning, "x.py", 1)
    assert ("continue with: omrl sft --resume" in out.getvalue()) is said
    assert ("a setting nothing reads" in capsys.readouterr().err) is said


def test_a_launched_process_ended_by_sigterm_says_another_process_most_often_failed(monkeypatch):
    """The survivor of a killed process said "terminated (SIGTERM): interrupted", as if the user had stopped it."""
    import io

    import typer
    from rich.console import Console

    import omrl.cli
    from omrl.cli import stop_on_interrupt

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(omrl.cli, "TERMINATED", [15])
    out = io.StringIO()

    def stopped():
        raise KeyboardInterrupt("interrupted")

    with pytest.raises(typer.Exit):
        stop_on_interrupt(stopped, Console(file=out, width=400))
    said = out.getvalue()
    assert said.startswith("terminated (SIGTERM): interrupted (under accelerate launch, a SIGTERM most often")


def test_the_banner_cannot_promise_a_remote_envs_worked_example():
    """A served env's worked example is its server's: the header said "on" for one that gives none."""
    from omrl.cli.settings import worked_example_shown

    assert worked_example_shown("agentgym", True) == "on, where the env gives one"
    assert worked_example_shown("agentgym", False) == "off"
    assert worked_example_shown("webshop", True) == "on" and worked_example_shown("webshop", False) == "off"
    assert worked_example_shown("gridworld", True) == worked_example_shown("gridworld", False) == "none in this env"


def test_under_a_launch_each_processs_error_says_which_process_it_is(monkeypatch, capsys):
    """Every process of a launch prints its own error (they may differ): unnamed, two lines read as one repeated."""
    from omrl.cli import report_error
    from omrl.errors import OmrlError

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert report_error(OmrlError("the data is bad"), debug=False) == 2
    assert report_error(KeyError("board"), debug=False) == 1
    err = capsys.readouterr().err
    assert "error: process 1 of 2: the data is bad\n" in err and "error: process 1 of 2: KeyError: 'board'" in err
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    report_error(OmrlError("the data is bad"), debug=False)
    assert capsys.readouterr().err == "error: the data is bad\n"  # one process: nothing to tell apart
