"""``--resume`` continues a run from its own config.yaml: nothing typed again, and ``steps`` may be raised."""

from __future__ import annotations

import json
import shlex

import pytest

from omrl.training.checkpoint import interrupted
from omrl.training.metrics import read_metrics

RUN = (
    "--algo",
    "grpo",
    "--env",
    "gridworld",
    "--model",
    "tiny",
    "tasks_per_step=2",
    "group_size=2",
    "env.max_turns=2",
    "generation.max_new_tokens=4",
    "logging.tensorboard=false",
)


def steps_logged(run) -> list[int]:
    return [record["step"] for record in read_metrics(run)]


@pytest.mark.slow
def test_resume_reads_the_runs_config_and_extends_a_finished_run(omrl_main, tmp_path):
    run = tmp_path / "run"
    code, _, err = omrl_main("train", *RUN, "--steps", "2", "--output-dir", str(run))
    assert code == 0, err
    code, out, err = omrl_main("train", "--resume", "--output-dir", str(run), "--steps", "3")
    assert code == 0, err
    assert "grpo on gridworld with tiny, 3 steps x 2 tasks x 2 samples" in out + err
    assert "before omrl had the option" not in out + err  # the run's own options: nothing is new
    assert steps_logged(run) == [1, 2, 3]

    code, _, err = omrl_main("train", "--resume", "--output-dir", str(run), "--steps", "2")
    assert code == 2
    assert "the config differs from the checkpoint's in steps: 3 -> 2" in err
    assert "that may be raised: steps, num_train_epochs" in err
    code, _, err = omrl_main("train", "--resume", "--output-dir", str(run), "group_size=4")
    assert code == 2
    assert "group_size: 2 -> 4" in err


def test_the_ctrl_c_line_is_a_command_that_runs(tmp_path):
    run = tmp_path / "ctrl c run"  # a space: the printed line must quote it
    kept = run / "checkpoints" / "step-00000001"
    kept.mkdir(parents=True)
    (kept / "COMPLETE").write_text("")
    message = str(interrupted(run, "train"))
    command = shlex.split(message.split("Continue with: ")[1])
    assert command == ["omrl", "train", "--resume", "--output-dir", str(run)], message


def test_two_sft_runs_in_a_row_each_get_a_directory(omrl_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Act: left"}]
    (tmp_path / "data.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    for _ in range(2):
        code, _, err = omrl_main("sft", "--model", "tiny", "--dataset", "data.jsonl", "logging.tensorboard=false")
        assert code == 0, err
    assert len(list((tmp_path / "runs").glob("sft-*"))) == 2


@pytest.mark.slow
def test_the_same_command_with_resume_added_continues_a_preset_played_on_another_env(omrl_main, tmp_path):
    """The grpo preset is webshop's: on gridworld its turn cap becomes the env's own, on resume too
    (it used to stay the preset's 8 there, and the resume was refused as a changed config)."""
    run = tmp_path / "run"
    words = ("train", "grpo", "--env", "gridworld", "--model", "tiny", "tasks_per_step=1", "group_size=2",
             "eval_tasks=1", "generation.max_new_tokens=4", "logging.tensorboard=false", "--output-dir", str(run))  # fmt: skip
    code, _, err = omrl_main(*words, "--steps", "1")
    assert code == 0, err
    code, _, err = omrl_main(*words, "--steps", "2", "--resume")
    assert code == 0, err
    assert steps_logged(run) == [1, 2]


@pytest.mark.slow  # a run of its own process, stopped mid-way
def test_a_run_sent_sigterm_stops_as_ctrl_c_does_and_resumes(tiny_model_dir, tmp_path):
    """A scheduler's preemption (SIGTERM) killed the run at once: no word of the checkpoint kept or of how
    to go on, its env servers and child processes left running. It now stops as Ctrl-C does, exit 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "omrl",
        "train",
        *RUN,
        "steps=400",
        "logging.save_steps=1",
        "--output-dir",
        str(run),
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step-00000002" / "COMPLETE").is_file():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    said = " ".join(err.split())
    assert process.returncode == 143, said
    assert "terminated (SIGTERM): interrupted; the newest complete checkpoint is" in said
    assert f"Continue with: omrl train --resume --output-dir {run}" in said
