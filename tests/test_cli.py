"""The command line: --help everywhere, --version, one-line errors, --debug tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from omrl import __version__
from omrl.cli import build_app


def omrl(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omrl", *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )


def _walk(command, path: tuple[str, ...] = ()):
    yield path, command
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _walk(sub, (*path, name))


def test_every_command_has_help():
    root = typer.main.get_command(build_app())
    paths = [path for path, _ in _walk(root)]
    assert ("plugins",) in paths and ("config", "show") in paths
    runner = CliRunner()
    for path, command in _walk(root):
        assert command.help or path == (), f"omrl {' '.join(path)} has no help text"
        result = runner.invoke(build_app(), [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output


def test_version():
    result = omrl("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"omrl {__version__}"


def test_bad_input_is_one_line_without_traceback():
    result = omrl("config", "show", "grpo", "optim.lr=1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown config key 'optim.lr'"), result.stderr
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback():
    result = omrl("--debug", "config", "show", "no-such-preset")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr


def broken_plugin(folder) -> dict[str, str]:
    """The environment of an ``omrl`` that finds the distribution omrl-broken in ``folder``, whose plugin
    module fails to import."""
    dist = folder / "omrl_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omrl-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[omrl]\nbroken.env = omrl_broken_module\n")
    (folder / "omrl_broken_module.py").write_text("raise ImportError('needs libfoo')\n")
    return {"PYTHONPATH": str(folder), "OMRL_PLUGINS": "omrl,omrl-broken"}


def test_plugin_that_fails_to_import_is_named(tmp_path):
    result = omrl("plugins", **broken_plugin(tmp_path))
    assert result.returncode == 2
    assert "plugin 'broken.env' from omrl-broken failed to import: ImportError: needs libfoo" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_version_and_help_answer_beside_a_plugin_that_fails_to_import(tmp_path):
    """Both exited 2 on the plugin's error: the way to find out what is installed was shut too."""
    broken = broken_plugin(tmp_path)
    version, usage = omrl("--version", **broken), omrl("--help", **broken)
    assert version.returncode == 0 and version.stdout.strip() == f"omrl {__version__}"
    assert usage.returncode == 0 and "rollout" in usage.stdout and "train" in usage.stdout
    for result in (version, usage):
        assert "warning: plugin 'broken.env' from omrl-broken failed to import: ImportError: needs libfoo" in " ".join(
            result.stderr.split()
        )
    assert omrl("env", "list", **broken).returncode == 2  # a command still refuses to run without it


def test_config_show_prints_the_resolved_config(capsys):
    from tests.helpers import cli_exit

    code, out, err = cli_exit(capsys, "config", "show", "grpo", "model.name=tiny", "group_size=8")
    assert code == 0, err
    assert "name: tiny" in out and "group_size: 8" in out


REFUSED = {  # (preset, overrides...): what the command would say
    ("grpo", "algorithm.advantage=foo"): "unknown advantage estimator 'foo'",
    ("grpo", "algorithm.rollout_correction=tis"): "token_tis, or auto (the default: chosen for the run's sampler)",
    ("grpo", "reward.allocation=foo"): "unknown reward allocation 'foo'; valid: last_token",
    ("grpo", "env.template=foo"): "unknown template 'foo'",
    ("grpo", "optim.lr_schedule=foo"): "unknown optim.lr_schedule 'foo'; valid: constant",
    ("eval", "generation.batching=foo"): "unknown generation.batching 'foo'; valid: turns",
    ("grpo", "mini_batch_size=-1"): "mini_batch_size must be >= 0",
    ("grpo", "rollout.max_staleness=-1"): "rollout.max_staleness must be >= 0",
    ("grpo", "model.lora_dropout=1.5"): "model.lora_dropout must be in [0, 1)",
    ("grpo", "generation.weight_sync=files"): "sends weights to a server (generation.backend=openai)",
    # an option of the estimator, loss or correction chosen, which its plugin checks on the probe batch
    ("grpo", "algorithm.rollout_correction=token_mask", "algorithm.rollout_band_low=2"): "rollout_band_low must be in",
    ("grpo", "algorithm.policy_loss=dual_clip", "algorithm.clip_ratio_c=0.5"): "clip_ratio_c must be > 1.0",
    ("ppo", "algorithm.advantage=pass_at_k", "algorithm.pass_k=0"): "algorithm.pass_k must be an integer",
}


@pytest.mark.parametrize("words", list(REFUSED))
def test_config_show_refuses_a_value_the_command_would_refuse(words, capsys, monkeypatch):
    import warnings

    from tests.helpers import cli_exit

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main prints warnings its own way
    monkeypatch.setenv("COLUMNS", "400")  # in-process: a fresh interpreter (torch, for the probe) each is seconds
    message = REFUSED[words]
    code, out, err = cli_exit(capsys, "config", "show", *words)
    assert code == 2 and message in " ".join(err.split()), err
    assert out == ""  # nothing printed as if it would run


def test_data_convert_refuses_to_write_over_its_own_source(tmp_path, capsys):
    from omrl.cli import main

    source = tmp_path / "episodes.jsonl"
    source.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    before = source.read_bytes()
    with pytest.raises(SystemExit) as info:
        main(["data", "convert", str(source), str(tmp_path / "." / "episodes.jsonl")])
    assert info.value.code == 2 and "is the source itself" in capsys.readouterr().err
    assert source.read_bytes() == before
