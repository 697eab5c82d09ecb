"""A real third-party plugin package: pip-installed, listed by `omrl plugins`, used by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "omrl-plugin-example"


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory) -> dict[str, str]:
    """pip-install the example into a private target dir; returns the env that sees it."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        check=True,
        timeout=300,
    )
    assert list(target.glob("omrl_plugin_example-*.dist-info")), "pip did not install the example"
    return {**os.environ, "PYTHONPATH": str(target), "OMRL_PLUGINS": "omrl,omrl-plugin-example"}


def test_omrl_plugins_lists_the_installed_plugin(installed_example):
    result = subprocess.run(
        [sys.executable, "-m", "omrl", "plugins", "--json"],
        env=installed_example,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(result.stdout)}
    env = rows[("env", "guess_number")]
    assert env["distribution"] == "omrl-plugin-example"
    assert env["description"].startswith("Guess a secret number")
    assert rows[("reward", "brevity")]["distribution"] == "omrl-plugin-example"


def test_omrl_uses_the_plugin_by_name(installed_example):
    code = (
        "from omrl import registry\n"
        "env = registry.envs.get('guess_number')()\n"
        "env.reset(3)\n"
        "for _ in range(8):\n"
        "    r = env.step(env.expert_action())\n"
        "    if r.done: break\n"
        "print(r.won, registry.rewards.component('brevity').distribution)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=installed_example, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "omrl-plugin-example"]


def test_plugin_is_invisible_when_not_allowed(installed_example):
    env = {**installed_example, "OMRL_PLUGINS": "omrl"}
    result = subprocess.run(
        [sys.executable, "-m", "omrl", "plugins", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "guess_number" not in result.stdout
