"""The README's first ten minutes: its SFT preset moves the random-init `tiny` model (the `sft` preset, written
for SmolLM2, made two steps at lr 2e-5 and left it where it was), and its GRPO preset updates it."""

from __future__ import annotations

import pytest

from omrl.cli import main
from omrl.training.metrics import read_metrics


def run(*argv: str) -> None:
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code == 0


def last_record(run_dir) -> dict:
    return read_metrics(run_dir)[-1]


@pytest.mark.slow  # the README's presets trained in full: 50+ SFT steps, then GRPO
def test_the_quickstart_presets_fine_tune_tiny_and_every_grpo_step_updates(tmp_path):
    expert = tmp_path / "expert.parquet"
    # the README's 1,000 episodes: at the preset's lr 1e-3, 200 of them (52 steps, 30 of warmup) leave the loss at 2.3
    run("rollout", "--env", "gridworld", "--expert", "--num-tasks", "1000", "-o", str(expert))
    run("sft", "sft-tiny", "--dataset", str(expert), "--output-dir", str(tmp_path / "sft"))
    record = last_record(tmp_path / "sft")
    assert record["step"] >= 50 and record["loss"] < 1.0, record  # the sft preset: 2 steps, loss above 8
    run(
        "train",
        "grpo-gridworld",
        "--model",
        str(tmp_path / "sft"),
        "--output-dir",
        str(tmp_path / "grpo"),
        "steps=2",
        "tasks_per_step=4",
        "eval_tasks=0",
    )
    records = read_metrics(tmp_path / "grpo")
    assert [r["step"] for r in records] == [1, 2] and not records[-1].get("skipped_updates"), records
    assert all(r["grad_norm"] > 0 for r in records)  # a real update each step: the SFT model's samples differ
