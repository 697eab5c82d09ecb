"""Helpers the tests share that are not fakes (those are in tests/fakes.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def play_expert(env: Any, task_id: int, admissible: bool = False) -> list[Any]:
    """Reset and follow the env's expert to the end; the results of every step. With ``admissible``,
    each expert action must also be one of the env's admissible actions."""
    env.reset(task_id)
    results = []
    while not results or not results[-1].done:
        action = env.expert_action()
        assert action is not None, f"the expert gave up after {len(results)} steps"
        if admissible:
            assert action in env.admissible_actions()
        results.append(env.step(action))
    return results


def fresh_python_json(code: str) -> Any:
    """Run ``code`` in a fresh Python (nothing imported yet; HF_HUB_OFFLINE=1): the JSON its last line printed."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def eval_two_tasks(env_name: str, tmp_path: Path) -> dict[str, Any]:
    """``omrl eval`` of the `tiny` model on 2 tasks of ``env_name`` (2 turns, 4 new tokens a reply), which
    must play both episodes to an end; its report."""
    from typer.testing import CliRunner

    from omrl.cli import build_app

    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        build_app(),
        [
            "eval",
            "--env",
            env_name,
            "--model",
            "tiny",
            "--num-tasks",
            "2",
            "generation.max_new_tokens=4",
            "env.max_turns=2",
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["metrics"]["episodes"] == 2 and sum(data["metrics"]["end_reasons"].values()) == 2
    return data
