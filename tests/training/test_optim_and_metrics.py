"""The learning-rate schedule, AdamW parameter groups, and MetricsLogger's files."""

from __future__ import annotations

import contextlib
import io
import time
import warnings

import pytest
import torch
from rich.console import Console

from omrl.config.options import LoggingConfig, OptimConfig
from omrl.errors import ConfigError
from omrl.parallel import Strategy
from omrl.training.common import SkippedUpdates
from omrl.training.metrics import MetricsLogger, read_metrics, step_line
from omrl.training.optim import apply_update, build_optimizer, build_scheduler, lr_multiplier
from tests.helpers import tmpfs


def test_schedules_warm_up_then_hold_or_decay():
    assert [lr_multiplier(s, 10, 4, "constant") for s in (0, 2, 4, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert [lr_multiplier(s, 10, 0, "linear") for s in (0, 5, 10)] == [1.0, 0.5, 0.0]
    cosine = [lr_multiplier(s, 12, 2, "cosine") for s in (2, 7, 12)]
    assert cosine == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ConfigError, match="unknown optim.lr_schedule 'step'; valid: constant, linear, cosine"):
        lr_multiplier(0, 10, 0, "step")


def test_scheduler_drives_the_optimizer_lr_and_decay_skips_vectors():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    cfg = OptimConfig(learning_rate=0.1, weight_decay=0.01, warmup_steps=2, lr_schedule="linear")
    optimizer = build_optimizer(model, cfg)
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.01 and all(p.ndim == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 3  # linear bias, norm weight and bias
    scheduler = build_scheduler(optimizer, cfg, total_steps=4)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.0, 0.05, 0.1, 0.05])


def test_a_warm_up_as_long_as_the_run_is_warned_of():
    """optim.warmup_steps=100 on a 4-step run trained at a rate that only rose, and said nothing."""
    optimizer = build_optimizer(torch.nn.Linear(3, 1), OptimConfig(learning_rate=0.1, warmup_steps=4), fused=False)
    with pytest.warns(
        UserWarning, match=r"warmup_steps=4 is not fewer than the run's 4 optimizer steps.*never reaches"
    ):
        build_scheduler(optimizer, OptimConfig(learning_rate=0.1, warmup_steps=4), total_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_scheduler(optimizer, OptimConfig(learning_rate=0.1, warmup_steps=3), total_steps=4)


class _Warnings:
    def __init__(self):
        self.lines = []

    def warn(self, text):
        self.lines.append(text)


def test_a_skipped_update_leaves_weights_moments_and_schedule_as_they_were():
    """The one rule for every recipe: the schedule counts the updates applied."""
    model = torch.nn.Linear(3, 1)
    cfg = OptimConfig(learning_rate=0.1, warmup_steps=2, lr_schedule="linear")
    optimizer = build_optimizer(model, cfg, fused=False)
    scheduler = build_scheduler(optimizer, cfg, total_steps=5)
    strategy, skipped, log = Strategy(), SkippedUpdates(max_nan_in_a_row=3), _Warnings()
    lrs, applied = [], []
    for step, poison in enumerate(["", "", "loss", "grad", "", ""], start=1):
        loss = model(torch.ones(1, 3)).sum() * (float("nan") if poison == "grad" else 1.0)
        loss.backward()
        before = (
            [p.clone() for p in model.parameters()],
            scheduler.last_epoch,
            {k: v.clone() for k, v in optimizer.state[model.weight].items()},
        )
        update = apply_update(
            strategy,
            list(model.parameters()),
            optimizer,
            scheduler,
            skipped,
            log,
            step,
            cfg.max_grad_norm,
            finite=poison != "loss",
        )
        lrs.append(update.lr)
        applied.append(update.applied)
        if not update.applied:
            assert all(torch.equal(a, b) for a, b in zip(before[0], model.parameters()))
            assert scheduler.last_epoch == before[1]
            assert all(torch.equal(v, optimizer.state[model.weight][k]) for k, v in before[2].items())
            assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # dropped
    assert applied == [True, True, False, False, True, True]
    # each update's lr is the multiplier of the updates applied before it: 0, 1, 2, 2, 2, 3
    assert lrs == pytest.approx([0.1 * lr_multiplier(n, 5, 2, "linear") for n in (0, 1, 2, 2, 2, 3)])
    assert scheduler.last_epoch == 4 == sum(applied) == int(optimizer.state[model.weight]["step"])  # AdamW's own count
    assert skipped.count == 2 and skipped.nan_in_a_row == 0
    assert log.lines[0] == "step 3: skipped the update: non-finite loss (1 skipped so far)"
    assert log.lines[1] == "step 4: skipped the update: non-finite gradient norm (nan) (2 skipped so far)"


def test_metrics_logger_writes_on_cadence_and_the_last_step(tmp_path):
    out = io.StringIO()
    cfg = LoggingConfig(output_dir=str(tmp_path), logging_steps=2, tensorboard=True)
    with MetricsLogger(tmp_path, cfg, total_steps=5, console=Console(file=out, width=200)) as logger:
        written = [logger.log(step, {"loss": 1.0 / step, "lr": 1e-5, "reward": 0.5}) for step in range(1, 6)]
        logger.log(6, {"loss": float("nan")})
    assert written == [False, True, False, True, True]
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [2, 4, 5, 6]
    assert records[0]["loss"] == 0.5 and records[0]["reward"] == 0.5
    assert records[-1]["loss"] is None  # NaN is written as null: the file stays valid JSON
    assert "step 4/5 loss 0.25 reward 0.5 lr 1.00e-05\n" in out.getvalue()  # plain lines off a terminal
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_metrics_logger_on_resume_drops_steps_after_the_checkpoint(tmp_path):
    cfg = LoggingConfig(output_dir=str(tmp_path), tensorboard=False)
    quiet = Console(file=io.StringIO())
    with MetricsLogger(tmp_path, cfg, total_steps=6, console=quiet) as logger:
        for step in range(1, 5):
            logger.log(step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # a line cut by a kill
    with MetricsLogger(tmp_path, cfg, total_steps=6, start_step=2, console=quiet) as logger:
        for step in range(3, 7):
            logger.log(step, {"loss": 10.0 + step})
    records = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0), (6, 16.0)]


def test_a_steps_console_line_shows_the_headline_and_counts_the_rest():
    metrics = {"reward_goal": 0.5, "kl": 0.01, "loss": 2.0, "tokens_per_s": 1234.5, "lr": 3e-6, "reward": 0.25}
    assert step_line(metrics) == "loss 2 reward 0.25 kl 0.01 lr 3.00e-06 (+2 in metrics.jsonl)"
    assert step_line({"loss": 1.0}) == "loss 1"


@pytest.mark.slow  # two training runs and wandb's service process
def test_metrics_go_to_wandb_and_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    import wandb  # a dev dependency: a missing wandb fails this test rather than skipping it

    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: wandb writes its run files locally
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingConfig(output_dir=str(tmp_path), tensorboard=False, wandb_project="omrl-test")
    quiet = Console(file=io.StringIO())
    with MetricsLogger(tmp_path, cfg, total_steps=2, run_config={"seed": 3}, console=quiet) as logger:
        logger.log(1, {"loss": 0.5})
        first_id = logger._wandb.id
        assert dict(logger._wandb.config) == {"seed": 3}
    # wandb names an offline run's directory by the second it starts: resume in a later second, or
    # both sessions would share one directory (and one run file)
    time.sleep(1.05 - time.time() % 1)
    with MetricsLogger(tmp_path, cfg, total_steps=2, start_step=1, console=quiet) as logger:
        logger.log(2, {"loss": 0.25})
        assert logger._wandb.id == first_id  # the id kept in wandb_run_id
    assert (tmp_path / "wandb_run_id").read_text() == first_id
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{first_id}/run-{first_id}.wandb"))
    assert len(runs) == 2 and all(run.stat().st_size > 0 for run in runs)
    assert wandb.run is None  # finished on close


def test_adamw_is_fused_over_plain_parameters_and_plain_where_it_cannot_be():
    from omrl.training.optim import build_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, OptimConfig())
    assert optimizer.defaults["fused"] is True  # one kernel over every parameter: AdamW's step is ~6x faster
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 3]  # the weight matrix decays; biases, norm not
    assert build_optimizer(model, OptimConfig(), fused=False).defaults["fused"] is None


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a small file system of its own, a 64 KiB tmpfs (root mounts it here): :func:`fill` takes
    its space."""
    import os

    if os.geteuid() != 0:
        pytest.skip("only root can mount the small file system this fills")
    folder = tmp_path / "small"
    folder.mkdir()
    with tmpfs(folder, "size=64k"):
        yield folder


def fill(folder) -> None:
    """Take what space is left on ``folder``'s file system."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as filler:
        while True:
            filler.write(b"x" * 4096)
            filler.flush()


def test_a_full_disk_under_metrics_jsonl_names_the_file(small_disk):
    """It said "the disk is full: [Errno 28] No space left on device" and named no file."""
    import errno

    full_folder = small_disk
    (full_folder / "metrics.jsonl").touch()  # the run's file exists; the space around it is taken
    fill(full_folder)
    cfg = LoggingConfig(output_dir=str(full_folder), tensorboard=False)
    logger = MetricsLogger(full_folder, cfg, total_steps=2, console=Console(file=io.StringIO()))
    with pytest.raises(OSError) as full:
        logger.log(1, {"loss": 1.0})
    assert full.value.errno == errno.ENOSPC and full.value.filename == str(full_folder / "metrics.jsonl")
    with pytest.raises(OSError) as again:  # the buffered line fails the close as well: still named
        logger.close()
    assert again.value.filename == str(full_folder / "metrics.jsonl")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_full_disk_under_tensorboard_names_its_folder_and_prints_no_thread_traceback(small_disk, capfd):
    """TensorBoard writes on a thread of its own: it printed that thread's traceback, then "the disk is full:
    [Errno 28] No space left on device", naming no file. Here the disk fills after step 1: step 2's line
    fits in the page metrics.jsonl holds already; its events need a page more."""
    import errno

    cfg = LoggingConfig(output_dir=str(small_disk), tensorboard=True)
    logger = MetricsLogger(small_disk, cfg, total_steps=2, console=Console(file=io.StringIO()))
    logger.log(1, {"loss": 1.0})
    fill(small_disk)
    with pytest.raises(OSError) as failed:
        logger.log(2, {f"metric_{i}": float(i) for i in range(120)})
        time.sleep(0.5)  # the writer thread's turn
        logger.close()
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(small_disk / "tensorboard")
    assert [r["step"] for r in read_metrics(small_disk)] == [1, 2]  # metrics.jsonl kept each step
    logger.close()  # said once: closing again says nothing more
    assert "Traceback" not in capfd.readouterr().err


def test_a_run_that_applied_an_update_is_never_said_to_be_the_model_it_started_from():
    """With mini-batches a step may apply its first update and skip the rest: the run said every update was
    skipped and its model unchanged, while its weights had moved (and collapsed)."""
    from omrl.errors import NothingLearned

    class Logger:
        def warn(self, text):
            pass

    nan = "non-finite gradient norm (nan)"
    partly = SkippedUpdates(max_nan_in_a_row=10)
    partly.applied()
    for step in (1, 1, 2, 2):
        partly.skip(nan, Logger(), step, nan=True)
    partly.check_learned(2, "out", Logger())  # 4 skipped of 5: the model changed
    resumed = SkippedUpdates(max_nan_in_a_row=10)
    resumed.load_state_dict(partly.state_dict())
    resumed.check_learned(2, "out", Logger())
    never = SkippedUpdates(max_nan_in_a_row=10)
    for step in (1, 1, 2, 2):
        never.skip(nan, Logger(), step, nan=True)
    with pytest.raises(NothingLearned, match="is the model it started from"):
        never.check_learned(2, "out", Logger())
