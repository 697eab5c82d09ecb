"""A training run's own stages under their deadlines: a weight sync, a checkpoint save, an evaluation or
the generation process's hand-over that hangs stops the run (exit status 2), named, its stacks written."""

from __future__ import annotations

import json
import multiprocessing
import queue
import time

import pytest

from omrl.config.options import DeadlineConfig
from omrl.supervisor import StageStalled, stage, supervise
from omrl.training import async_generation, online, online_run
from omrl.training.rl import run_rl
from tests.helpers import gridworld_grpo_config


def hang(*args, **kwargs):
    time.sleep(120)


@pytest.mark.slow  # waits out a deadline of seconds
@pytest.mark.parametrize(
    "stage, module, name",
    [
        ("weight_sync", online, "_sync"),
        ("checkpoint", online_run, "save_recipe_checkpoint"),
        ("eval", online_run, "evaluate"),
    ],
)
def test_a_training_stage_that_hangs_stops_the_run_named(tiny_model_dir, tmp_path, monkeypatch, stage, module, name):
    monkeypatch.setattr(module, name, hang)
    cfg = gridworld_grpo_config(
        tiny_model_dir,
        tmp_path / "run",
        "steps=1",
        "tasks_per_step=1",
        "group_size=2",
        "eval_tasks=1",
        "generation.max_new_tokens=4",
        "logging.save_steps=1",
        f"deadlines.{stage}_s=1",
        "deadlines.heartbeat_s=0",
    )
    started = time.monotonic()
    with pytest.raises(StageStalled, match=rf"deadlines.{stage}_s=1 \(step 1"):
        run_rl(cfg)
    assert time.monotonic() - started < 120
    (dump,) = (tmp_path / "run" / "stalls").iterdir()
    assert f"-{stage}-" in dump.name and "in hang" in dump.read_text()


def test_a_generation_process_that_never_hands_over_stops_the_run(tmp_path):
    context = multiprocessing.get_context("spawn")
    silent = context.Process(target=time.sleep, args=(60,), daemon=True)  # alive, and never answers
    silent.start()
    generation = object.__new__(async_generation.GenerationProcess)
    generation.results, generation.process, generation.ready = queue.Queue(), silent, {}
    try:
        with supervise(DeadlineConfig(handover_s=1.5, heartbeat_s=0), tmp_path, warn=lambda text: None):
            with pytest.raises(StageStalled, match=r"waiting for the generation process's next step did not finish"):
                generation.take(3)
    finally:
        silent.kill()


@pytest.mark.slow
def test_a_run_a_deadline_stops_keeps_the_steps_done_and_resumes_from_them(tiny_model_dir, tmp_path, monkeypatch):
    """With no checkpoint asked for (save_steps=0), a generate that hangs in step 2 used to lose step 1."""
    play = online_run.OnlineRun._play_here

    def hangs_in_step_two(self, step, started):
        if step == 1:
            with stage("generate"):
                time.sleep(120)
        return play(self, step, started)

    monkeypatch.setattr(online_run.OnlineRun, "_play_here", hangs_in_step_two)
    run = tmp_path / "run"
    words = ("steps=2", "tasks_per_step=1", "group_size=2", "generation.max_new_tokens=4", "logging.save_steps=0")
    cfg = gridworld_grpo_config(tiny_model_dir, run, *words, "deadlines.generate_s=1", "deadlines.heartbeat_s=0")
    with pytest.raises(
        StageStalled, match=r"the newest checkpoint is .*step-00000001: continue with omrl train --resume"
    ):
        run_rl(cfg)
    monkeypatch.undo()
    run_rl(gridworld_grpo_config(tiny_model_dir, run, *words, "resume=true", "deadlines.generate_s=900"))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s] == [1, 2]  # step 1 was kept, not played again


@pytest.mark.parametrize("stops", ["stalls", "ctrl-c"])
def test_a_stop_in_the_last_steps_evaluation_keeps_the_trained_step(tiny_model_dir, tmp_path, monkeypatch, stops):
    """With logging.save_steps=0 (the default) the last step's evaluation held the whole run: a stall or a
    Ctrl-C in it lost every step. The step's update is done, so it is logged and checkpointed first."""
    from omrl.training.checkpoint import latest_checkpoint
    from omrl.training.checkpoint_marker import checkpoint_step
    from omrl.training.metrics import read_metrics

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(online_run, "evaluate", hang if stops == "stalls" else interrupted)
    out = tmp_path / "run"
    cfg = gridworld_grpo_config(tiny_model_dir, out, "steps=1", "tasks_per_step=1", "group_size=2", "eval_tasks=1",
                                "generation.max_new_tokens=4", "deadlines.eval_s=1", "deadlines.heartbeat_s=0")  # fmt: skip
    with pytest.raises(StageStalled if stops == "stalls" else KeyboardInterrupt) as caught:
        run_rl(cfg)
    kept = latest_checkpoint(out)
    assert kept is not None and checkpoint_step(kept) == 1
    assert [record["step"] for record in read_metrics(out)] == [1]
    if stops == "stalls":
        assert f"the newest checkpoint is {kept}: continue with omrl train --resume" in str(caught.value)
