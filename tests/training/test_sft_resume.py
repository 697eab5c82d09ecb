"""Exact resume: a run killed after checkpoint k and resumed matches an uninterrupted run step for step."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest
from rich.console import Console

from omrl.config import to_yaml
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.metrics import read_metrics
from omrl.training.sft import run_sft
from tests.training.helpers import run_until, sft_stop_then_resume

QUIET = Console(file=io.StringIO())

# Runs the recipe and SIGKILLs itself right after step KILL_AT (no cleanup, no flush beyond what was written).
KILLED_RUN = """
import os, signal, sys
from omrl.config import load_config
from omrl.config.options import SftRunConfig
from omrl.training.sft import run_sft

kill_at = int(sys.argv[2])

def die(step, metrics):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

run_sft(load_config(SftRunConfig, sys.argv[1]), on_step_end=die)
"""


def _losses(output_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(output_dir)]


def _assert_same_losses(resumed, reference):
    assert [s for s, _ in resumed] == [s for s, _ in reference]  # every step once: none skipped or repeated
    for (step, got), (_, want) in zip(resumed, reference):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), f"step {step}"


@pytest.mark.slow  # a run killed in a process of its own, then resumed
def test_killed_run_resumes_at_exactly_the_next_batch(sft_config, sft_reference, tmp_path):
    # 8 conversations, 2 per micro-batch, 2 micro-batches per step: 2 steps an epoch, 3 epochs, a checkpoint
    # every 3 steps; with a schedule and weight decay, whose state a resume must restore as well
    settings = dict(num_train_epochs=3.0, optim__gradient_accumulation_steps=2, logging__save_steps=3)
    settings |= dict(optim__lr_schedule="cosine", optim__warmup_steps=2, optim__weight_decay=0.01)
    reference = _losses(sft_reference(**settings))
    assert len(reference) == 6

    cfg = sft_config(logging__output_dir=str(tmp_path / "killed"), **settings)
    config_file = tmp_path / "killed.yaml"
    config_file.write_text(to_yaml(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see the one_torch_thread fixture
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(config_file), "4"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert latest_checkpoint(cfg.logging.output_dir).name == "step-00000003"  # mid-epoch 1
    assert [s for s, _ in _losses(cfg.logging.output_dir)] == [1, 2, 3, 4]  # step 4 was never checkpointed

    cfg.resume = True
    summary = run_sft(cfg, console=QUIET)
    assert summary["steps"] == 6
    _assert_same_losses(_losses(cfg.logging.output_dir), reference)


def test_lora_run_with_dropout_stopped_by_a_hook_resumes_exactly(sft_config, sft_reference, tmp_path):
    """LoRA dropout draws random numbers: the restored RNG states make the resumed steps identical."""
    settings = dict(
        model__lora_rank=4,
        model__lora_dropout=0.2,
        optim__learning_rate=1e-2,
        num_train_epochs=1.5,
        logging__save_steps=2,
        packing=True,
        max_seq_length=220,
    )
    reference = _losses(sft_reference(**settings))

    cfg = sft_config(logging__output_dir=str(tmp_path / "stopped"), **settings)
    sft_stop_then_resume(cfg, 3, console=QUIET)
    _assert_same_losses(_losses(cfg.logging.output_dir), reference)


def test_resuming_a_finished_run_reports_its_last_loss_not_nan(sft_config, tmp_path):
    cfg = sft_config(logging__output_dir=str(tmp_path / "done"))
    first = run_sft(cfg, console=QUIET)
    cfg.resume = True
    again = run_sft(cfg, console=QUIET)  # no step to run: the summary is the run's all the same
    assert again["steps"] == first["steps"] and again["final_loss"] == first["final_loss"]


@pytest.mark.slow
def test_a_final_model_its_resumed_run_trained_past_is_named_before_it_plays(sft_config, tmp_path):
    """A finished run resumed for another epoch stops after a checkpoint, before it saves its model again:
    its folder still holds the older model, and a command that would play it says so, naming both steps."""
    from omrl.cli.play_checks import warn_if_final_model_behind
    from omrl.training.checkpoint_marker import final_model_behind

    cfg = sft_config(logging__output_dir=str(tmp_path / "run"), logging__save_steps=1, num_train_epochs=1.0)
    saved = run_sft(cfg, console=QUIET)["steps"]
    assert final_model_behind(tmp_path / "run") is None  # the model is the run's newest
    cfg.resume, cfg.num_train_epochs = True, 2.0
    run_until(run_sft, cfg, saved + 1, console=QUIET)
    with pytest.warns(UserWarning, match=f"saved at step {saved}, but the run trained on to step {saved + 1}"):
        warn_if_final_model_behind(str(tmp_path / "run"))
    run_sft(cfg, console=QUIET)  # finished: its model is the newest again
    assert final_model_behind(tmp_path / "run") is None


def test_a_finished_run_resumed_for_more_epochs_takes_its_next_update_at_the_new_schedules_rate(sft_config, tmp_path):
    """It took it at the old schedule's last rate: 0, at the end of a cosine decay."""
    from omrl.training.optim import lr_multiplier

    settings = dict(optim__lr_schedule="cosine", optim__warmup_steps=0, logging__output_dir=str(tmp_path / "run"))
    cfg = sft_config(num_train_epochs=1.0, **settings)
    first = run_sft(cfg, console=QUIET)["steps"]
    cfg.resume, cfg.num_train_epochs = True, 2.0
    total = run_sft(cfg, console=QUIET)["steps"]
    rates = {row["step"]: row["lr"] for row in read_metrics(tmp_path / "run")}
    assert total > first + 1
    assert rates[first + 1] == pytest.approx(
        cfg.optim.learning_rate * lr_multiplier(first, total, 0, "cosine"), rel=1e-6
    )
    assert rates[first + 1] > 0
