"""Where a step's time goes (``time/<part>`` in metrics.jsonl, :mod:`omrl.clock`): the parts of a real
GRPO step, measured on the main thread, outermost part only, adding up to the step's time."""

from __future__ import annotations

import threading
import time

from omrl import clock
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from tests.helpers import gridworld_grpo_config
from tests.training.helpers import SampleIndexReward


def test_only_the_outermost_part_on_the_main_thread_counts():
    clock.take()
    with clock.timed("eval"):
        with clock.timed("generate"):  # an evaluation's generate calls are the evaluation's time
            time.sleep(0.02)
    worker = threading.Thread(target=lambda: clock.timed("env").__enter__())  # another thread: not counted
    worker.start()
    worker.join()
    parts = clock.take()
    assert set(parts) == {"eval"} and parts["eval"] >= 0.02
    assert clock.take() == {}  # taken: counting starts afresh
    out = clock.breakdown(1.0, {"generate": 0.25, "env": 0.5})
    assert out == {"time/env": 0.5, "time/generate": 0.25, "time/other": 0.25}


def test_a_grpo_step_logs_where_its_time_went(tiny_model_dir, tmp_path, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")  # samples differ: every step updates
    cfg = gridworld_grpo_config(
        tiny_model_dir,
        tmp_path / "run",
        "steps=2",
        "tasks_per_step=2",
        "group_size=2",
        "eval_tasks=1",
        "eval_every=1",
        "generation.max_new_tokens=8",
        "reward.weights={sample_index: 1.0}",
    )
    run_rl(cfg)
    for record in read_metrics(tmp_path / "run"):
        parts = {key[len("time/") :]: value for key, value in record.items() if key.startswith("time/")}
        for part in ("generate", "env", "reward", "forward", "backward", "optimizer", "other"):
            assert parts.get(part, 0) > 0 or part == "other", (part, parts)
        assert all(value >= 0 for value in parts.values()), parts
        assert parts["eval"] > 0  # eval_every=1: each step evaluates, its generate calls counted as eval
        measured = sum(value for part, value in parts.items() if part not in ("other", "log", "checkpoint"))
        assert measured <= record["step_time"] * 1.01, (measured, record["step_time"])
        assert record["prefill_time"] <= parts["generate"]  # the prompts' part of the generate calls


def test_the_viewer_draws_the_parts_in_one_panel():
    from omrl.view.metrics import panels

    keys = ["loss", "step_time", "time/generate", "time/backward", "time/other", "prefill_time"]
    (panel,) = [p for p in panels(keys) if p["name"] == "parts"]
    assert panel["keys"] == ["time/generate", "time/backward", "time/other", "prefill_time"]
