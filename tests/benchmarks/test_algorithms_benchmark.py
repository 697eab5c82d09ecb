"""benchmarks/algorithms.py: its table and noise verdicts, and a smoke run of two arms end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks.helpers import BENCHMARKS, load_benchmark


@pytest.fixture
def algorithms(monkeypatch):
    """benchmarks/algorithms.py as a module."""
    return load_benchmark(monkeypatch, "algorithms")


def _row(arm: str, sampled: float, se: float, **extra) -> dict:
    return {
        "arm": arm,
        "what": arm.upper(),
        "status": "ok",
        "train_seconds": 90.0,
        "sampled": {"mean": sampled, "se": se},
        "greedy": {"mean": sampled, "se": se},
        **extra,
    }


def test_the_table_calls_small_differences_noise(algorithms):
    grpo = _row("grpo", 0.40, 0.04)
    close, far = _row("rloo", 0.45, 0.04), _row("ppo", 0.70, 0.04)
    missing = {"arm": "gspo", "what": "GSPO", "status": "not run", "error": "UnknownNameError: no 'gspo'"}
    for row in (close, far):
        row["vs_grpo"] = algorithms.versus(row, grpo)
    assert not close["vs_grpo"]["sampled"]["beyond_noise"]  # 5 points < 2 x 5.7
    assert far["vs_grpo"]["sampled"]["beyond_noise"]  # 30 points > 2 x 5.7
    settings = {k: 1 for k in ("steps", "tasks_per_step", "group_size", "expert_episodes", "sft_epochs")}
    record = {
        "rows": [grpo, close, far, missing],
        "seed": 0,
        "settings": {**settings, "eval_tasks": 8, "eval_samples": 2},
    }

    text = algorithms.table(record)
    lines = text.splitlines()
    assert lines[0].startswith("| arm | what it is | sampled success ± SE | greedy ± SE | vs grpo")
    assert "| rloo | RLOO | 45.0 ± 4.0% | 45.0 ± 4.0% | +5.0, within noise | 1.5 |" in lines
    assert "| ppo | PPO | 70.0 ± 4.0% | 70.0 ± 4.0% | +30.0 (5.3 SE) | 1.5 |" in lines
    assert any(line.startswith("| gspo | GSPO | not run: UnknownNameError") for line in lines)
    assert "within noise: rloo; beyond: ppo (+30.0)." in text


def test_every_arm_of_the_issue_is_there(algorithms):
    assert list(algorithms.ARMS) == ["grpo", "dr_grpo", "rloo", "gigpo", "gspo", "cispo", "dapo", "ppo", "distill"]
    assert "algorithm.name=ppo" in algorithms.ARMS["ppo"].overrides  # from configs/ppo.yaml
    assert "algorithm.advantage=gae" in algorithms.ARMS["ppo"].overrides


@pytest.mark.slow
def test_a_smoke_run_of_two_arms(tmp_path):
    out = tmp_path / "algos"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "algorithms.py"), "--smoke", "--arms", "grpo,rloo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((out / "algorithms.json").read_text())
    rows = {row["arm"]: row for row in record["rows"]}
    assert list(rows) == ["sft", "grpo", "rloo"]
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        for kind in ("sampled", "greedy"):
            assert 0.0 <= row[kind]["mean"] <= 1.0
            assert row[kind]["se"] >= 0.0
            assert row[kind]["tasks"] == record["settings"]["eval_tasks"]
        assert row["train_seconds"] > 0
    assert rows["grpo"]["settings"] == rows["rloo"]["settings"]  # the same budget
    assert isinstance(rows["rloo"]["vs_grpo"]["sampled"]["beyond_noise"], bool)  # judged against grpo
    assert record["machine"]["cpus"] >= 1
    assert "| arm | what it is |" in done.stdout and "| rloo |" in done.stdout
    assert (out / "algorithms.md").read_text().startswith("| arm | what it is |")
