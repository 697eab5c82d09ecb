"""Faults a training run meets (Ctrl-C, a damaged checkpoint, an env that fails every episode, a
full disk) and settings that could never train: each is said plainly, and nothing is lost."""

from __future__ import annotations

import dataclasses
import errno
import io
import shutil
from pathlib import Path
from typing import Sequence

import pytest
from rich.console import Console

from omrl.data import read_episodes
from omrl.envs import Env, EnvError, Observation, StepResult
from omrl.errors import ConfigError, EnvFailure, Interrupted, OmrlError
from omrl.training.checkpoint import complete_checkpoints
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from omrl_plugins.envs.gridworld import GridWorld
from tests.training.helpers import EnvPlugin, gridworld_configs

QUIET = Console(file=io.StringIO())


@pytest.fixture
def rl_config(tiny_model_dir, tmp_path):
    """``rl_config(*overrides, algo=...)``: one task of two samples a step, one evaluation task."""
    return gridworld_configs(
        tiny_model_dir,
        tmp_path,
        *("generation.max_new_tokens=6", "tasks_per_step=1", "group_size=2", "eval_tasks=1"),
        "algorithm.entropy_coef=0.01",  # the entropy bonus: every step updates
    )


class DeadServerEnv(Env):
    """An env that fails every episode, as a server that went down would (``resets`` counts the tries)."""

    resets = 0

    def task_ids(self, split: str) -> Sequence[int]:
        return range(4)

    def reset(self, task_id: int) -> Observation:
        DeadServerEnv.resets += 1
        raise EnvError("connection refused by 127.0.0.1:9")

    def step(self, action: str) -> StepResult:
        raise EnvError("connection refused by 127.0.0.1:9")


def test_ctrl_c_names_the_checkpoint_kept_and_how_to_resume(rl_config):
    cfg = rl_config("logging.save_steps=1")

    def press_ctrl_c(step, metrics):
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match=r"newest complete checkpoint is .*step-00000001.*--resume --output-dir"):
        run_rl(cfg, on_step_end=press_ctrl_c, console=QUIET)


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(rl_config):
    cfg = rl_config("logging.save_steps=1", "steps=3")

    def stop_after_two(step, metrics):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        run_rl(cfg, on_step_end=stop_after_two, console=QUIET)
    newest = complete_checkpoints(cfg.logging.output_dir)[-1]
    (newest / "optimizer.pt").write_bytes(b"not a torch file")  # damaged after it was written
    cfg.resume = True
    with pytest.warns(UserWarning, match=r"not resuming from .*step-00000002: optimizer.pt changed"):
        run_rl(cfg, console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2, 3]  # step 2 trained again


@pytest.fixture
def no_wait(monkeypatch):
    """A step whose every episode failed is played again at once (not after seconds)."""
    import omrl.training.rollout_health

    monkeypatch.setattr(omrl.training.rollout_health, "ENV_FAILURE_WAIT", 0.0)


def test_a_run_whose_every_episode_failed_in_the_env_is_no_result(rl_config, register_plugin, no_wait):
    register_plugin(EnvPlugin("dead_server", DeadServerEnv), name="dead-server")
    cfg = rl_config("env.name=dead_server", "eval_tasks=0")
    with pytest.raises(
        EnvFailure,
        match=r"step 1: every episode failed in the env 'dead_server' in 3 rollouts in a "
        r"row \(the last reason: .*connection refused by 127.0.0.1:9\); the step is "
        r"not counted; no step was done before it: nothing to resume",
    ):
        run_rl(cfg, console=QUIET)
    assert complete_checkpoints(cfg.logging.output_dir) == [] and not read_metrics(cfg.logging.output_dir)


class BuggyResetEnv(DeadServerEnv):
    """Its reset raises in its own code, which is no EnvError: its bug, or its server's failure."""

    def reset(self, task_id: int) -> Observation:
        return {}["board"]


def test_a_run_whose_env_raised_in_its_own_code_says_its_plugin_may_need_a_fix(rl_config, register_plugin, no_wait):
    """It said only "run again once the env is back", where the env's plugin named its own line."""
    register_plugin(EnvPlugin("buggy_reset", BuggyResetEnv), name="buggy-reset")
    with pytest.raises(EnvFailure) as failure:
        run_rl(rl_config("env.name=buggy_reset", "eval_tasks=0"), console=QUIET)
    message = " ".join(str(failure.value).split())
    assert "KeyError: 'board' (in plugin 'buggy-reset' (-) at " in message
    assert message.endswith(
        "run again once the env is back (or fix the env's plugin: it raised in its own code, at the line named above)"
    )


def test_a_dpo_step_whose_every_episode_failed_in_the_env_is_not_counted(rl_config, register_plugin, monkeypatch):
    """DPO plays such a step again too (as GRPO does), then stops without counting it."""
    import omrl.training.rollout_health

    monkeypatch.setattr(omrl.training.rollout_health, "ENV_FAILURE_WAIT", 0.0)
    monkeypatch.setattr(DeadServerEnv, "resets", 0)
    register_plugin(EnvPlugin("dead_server", DeadServerEnv), name="dead-server")
    cfg = rl_config("env.name=dead_server", "eval_tasks=0", "logging.save_steps=1", algo="dpo")
    with pytest.raises(
        EnvFailure,
        match=r"step 1: every episode failed in the env 'dead_server' in 3 rollouts in a "
        r"row \(the last reason: .*connection refused.*\); the step is not counted",
    ):
        run_rl(cfg, console=QUIET)
    assert complete_checkpoints(cfg.logging.output_dir) == [] and not read_metrics(cfg.logging.output_dir)
    assert DeadServerEnv.resets >= 2 * (1 + omrl.training.rollout_health.ENV_FAILURE_REPLAYS)  # played, then replayed


class FlakyServerEnv(GridWorld):
    """Gridworld behind a server that fails the next ``failures`` resets (a server down, or full)."""

    failures = 0

    def reset(self, task_id: int) -> Observation:
        if FlakyServerEnv.failures > 0:
            FlakyServerEnv.failures -= 1
            raise EnvError("every create got HTTP 503: the server holds its limit of 24 live envs")
        return super().reset(task_id)


@pytest.fixture
def flaky_server(register_plugin, no_wait):
    register_plugin(EnvPlugin("flaky_server", FlakyServerEnv), name="flaky-server")
    FlakyServerEnv.failures = 0
    yield FlakyServerEnv
    FlakyServerEnv.failures = 0


def test_a_step_whose_every_episode_failed_in_the_env_is_played_again(rl_config, flaky_server):
    def fail_next_rollout(step, metrics):
        if step == 1:
            flaky_server.failures = 2  # both episodes of step 2's first rollout

    cfg = rl_config("env.name=flaky_server", "eval_tasks=0", "logging.save_steps=1")
    run_rl(cfg, on_step_end=fail_next_rollout, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    assert [r["step"] for r in records] == [1, 2] and records[1]["env_errors"] == 0  # the replay's episodes
    assert "replayed_rollouts" not in records[0] and records[1]["replayed_rollouts"] == 1  # else unseen
    assert flaky_server.failures == 0


@pytest.mark.slow
def test_a_step_on_a_dead_server_is_never_counted_checkpointed_or_rotated_over_a_good_one(rl_config, flaky_server):
    """The server dies after step 1: step 2 is played again, fails again, and the run stops with
    step 1's checkpoint kept (keep_checkpoints=1 would rotate it out for a step 2 checkpoint) and
    no row for step 2; once the server is back, --resume plays steps 2 and 3."""

    def kill_the_server(step, metrics):
        if step == 1:
            flaky_server.failures = 10**6

    cfg = rl_config(
        "env.name=flaky_server", "eval_tasks=0", "logging.save_steps=1", "logging.keep_checkpoints=1", "steps=3"
    )
    with pytest.raises(
        EnvFailure,
        match=r"step 2: every episode failed .* in 3 rollouts in a row .*HTTP 503.*not "
        r"counted; the newest checkpoint is .*step-00000001: bring the env back .*omrl train --resume",
    ):
        run_rl(cfg, on_step_end=kill_the_server, console=QUIET)
    assert [c.name for c in complete_checkpoints(cfg.logging.output_dir)] == ["step-00000001"]
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1]
    assert not list((Path(cfg.logging.output_dir) / "rollouts").glob("step-00000002*"))
    flaky_server.failures = 0  # the server is back
    cfg.resume = True
    run_rl(cfg, console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2, 3]
    assert [c.name for c in complete_checkpoints(cfg.logging.output_dir)] == ["step-00000003"]


@pytest.mark.slow
def test_the_steps_done_before_the_env_went_down_are_kept_without_save_steps(rl_config, flaky_server):
    """With no checkpoint cadence (logging.save_steps=0, the default), a server that dies after step 2
    costs the run step 3, not steps 1 and 2: they are checkpointed as the run stops, and --resume plays
    step 3 with the tasks it would have played."""

    def kill_the_server(step, metrics):
        if step == 2:
            flaky_server.failures = 10**6

    steady = rl_config("env.name=flaky_server", "eval_tasks=0", "steps=3", out="steady")
    run_rl(steady, console=QUIET)  # the same run with the server up throughout
    cfg = rl_config("env.name=flaky_server", "eval_tasks=0", "steps=3")
    with pytest.raises(EnvFailure, match=r"step 3: .*the newest checkpoint is .*step-00000002: .*--resume"):
        run_rl(cfg, on_step_end=kill_the_server, console=QUIET)
    assert [c.name for c in complete_checkpoints(cfg.logging.output_dir)] == ["step-00000002"]
    flaky_server.failures = 0
    cfg.resume = True
    run_rl(cfg, console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2, 3]
    step_3 = [read_episodes(Path(c.logging.output_dir) / "rollouts" / "step-00000003.parquet") for c in (cfg, steady)]
    assert [ep.task_id for ep in step_3[0]] == [ep.task_id for ep in step_3[1]]  # the step's tasks, handed back


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.learning_rate=-1", "optim.learning_rate must be a finite number >= 0, got -1"),
        ("optim.micro_batch_size=0", "optim.micro_batch_size must be >= 1, got 0"),
        (
            "algorithm.advantage=gae",
            "algorithm.advantage=gae cannot run with algorithm.name=grpo.*use algorithm.name=ppo",
        ),
        ("group_size=1", "algorithm.advantage=grpo gives every sample an advantage of 0 with group_size=1"),
        ("generation.temperature=-1", "generation.temperature must be >= 0"),
        ("generation.max_context=6", "generation.max_context larger than it"),
    ],
)
def test_settings_that_could_never_train_are_refused_before_any_rollout(rl_config, override, message):
    cfg = rl_config(override)
    with pytest.raises(ConfigError, match=message):
        run_rl(cfg, console=QUIET)
    assert not (cfg.logging.output_dir and read_metrics(cfg.logging.output_dir))


def test_an_estimator_whose_own_setting_empties_every_group_is_not_told_to_use_two_samples(rl_config):
    """pass_at_k with pass_k = group_size = 2 learns nothing; the advice was "use group_size >= 2", which it had."""
    with pytest.raises(ConfigError) as caught:
        run_rl(rl_config("algorithm.advantage=pass_at_k", "algorithm.pass_k=2"), console=QUIET)
    said = str(caught.value)
    assert "advantage of 0 with group_size=2" in said and "use group_size >= 2" not in said
    assert "raise group_size, or change the estimator's own algorithm.* keys" in said


def test_a_full_disk_is_reported_as_the_machines_fault_not_omrls(capsys):
    from omrl.cli import report_error

    status = report_error(OSError(errno.ENOSPC, "No space left on device", "/runs/x/optimizer.pt"), debug=False)
    err = capsys.readouterr().err
    assert status == 2 and "the disk is full (/runs/x/optimizer.pt)" in err and "bug in omrl" not in err
    status = report_error(PermissionError(errno.EPERM, "Operation not permitted", "/sys/run"), debug=False)  # /sys
    err = capsys.readouterr().err
    assert status == 2 and "the operation is not permitted there (/sys/run)" in err and "bug in omrl" not in err


def test_a_full_disk_under_an_atomic_write_names_the_file_it_could_not_write(tmp_path, monkeypatch, capsys):
    """A write's OSError names no file ("No space left on device"): the error says which one it was."""
    import pyarrow as pa

    from omrl import atomic
    from omrl.cli import report_error

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    monkeypatch.setattr(atomic.pq, "write_table", full)
    for write, path in [
        (lambda p: atomic.atomic_write_text(p, "x"), tmp_path / "config.yaml"),
        (lambda p: atomic.atomic_write_parquet(pa.table({"a": [1]}), p), tmp_path / "rollouts.parquet"),
    ]:
        with pytest.raises(OSError) as raised:
            write(path)
        assert report_error(raised.value, debug=False) == 2
        assert f"the disk is full ({path})" in capsys.readouterr().err and not path.exists()


def test_a_final_model_save_killed_halfway_leaves_nothing_behind_next_time(tiny_model, tmp_path):
    from omrl.training.model_setup import save_final_model

    model, tokenizer = tiny_model
    stale = tmp_path / ".final-model-tmp-12345"  # what a run killed while saving left
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    save_final_model(model, tokenizer, tmp_path, merge_lora=False)
    assert not stale.exists() and (tmp_path / "config.json").exists()
    shutil.rmtree(tmp_path)


def test_a_run_whose_prompts_leave_no_room_for_a_turn_says_so(rl_config):
    with pytest.raises(
        ConfigError,
        match=r"no episode of this run got a single model turn: the opening prompt \(up to "
        r"\d+ tokens\) leaves no room within generation.max_context=20",
    ):
        run_rl(rl_config("generation.max_context=20", "eval_tasks=0"), console=QUIET)


@pytest.mark.slow
def test_resuming_a_finished_run_adds_no_metrics_row_and_sums_up_the_run(rl_config):
    cfg = rl_config()
    first = run_rl(cfg, console=QUIET)
    cfg.resume = True
    again = run_rl(cfg, console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2]
    assert again["reward_total"] == first["reward_total"]  # its last step's, not an empty summary


def test_a_resumed_run_still_knows_why_its_updates_were_skipped():
    from omrl.training.common import SkippedUpdates

    skipped = SkippedUpdates(max_nan_in_a_row=3)
    skipped.skip("every advantage is 0", Logged(), step=1)
    resumed = SkippedUpdates(max_nan_in_a_row=3)
    resumed.load_state_dict(skipped.state_dict())  # as a checkpoint keeps it
    assert resumed.reasons == {"every advantage is 0": 1} and resumed.count == 1


class Logged:
    def warn(self, text: str) -> None:
        pass


class HalfDeadEnv(GridWorld):
    """Gridworld behind a server that fails every odd task's reset."""

    def reset(self, task_id: int) -> Observation:
        if task_id % 2:
            raise EnvError(f"connection reset while creating task {task_id}")
        return super().reset(task_id)


@pytest.mark.parametrize("max_rate", [0.1, 0.6])
def test_a_run_whose_env_errors_pass_the_stated_share_exits_non_zero_after_saving(
    rl_config, tmp_path, register_plugin, max_rate
):
    register_plugin(EnvPlugin("half_dead", HalfDeadEnv), name="half-dead")
    cfg = rl_config(
        *("env.name=half_dead", "steps=1", "tasks_per_step=4", "train_tasks=4", "eval_tasks=0"),
        f"max_env_error_rate={max_rate}",
    )
    if max_rate < 0.5:
        with pytest.raises(
            EnvFailure,
            match=r"failed in the env 'half_dead', more than max_env_error_rate=0.1 "
            r"allows.*connection reset while creating task",
        ):
            run_rl(cfg, console=QUIET)
    else:
        run_rl(cfg, console=QUIET)
    assert (tmp_path / "run" / "model.safetensors").exists()  # the run's model is saved either way
    with pytest.raises(ConfigError, match="max_env_error_rate must be a share between 0 and 1"):
        run_rl(dataclasses.replace(cfg, max_env_error_rate=1.5), console=QUIET)


def test_a_runs_evaluation_counts_only_the_episodes_that_measured_the_model(rl_config, register_plugin):
    """Task 1's reset fails on the test split too: it is no loss of the model's, as omrl eval counts it."""
    register_plugin(EnvPlugin("half_dead", HalfDeadEnv), name="half-dead")
    cfg = rl_config("env.name=half_dead", "steps=1", "train_tasks=2", "eval_tasks=2", "max_env_error_rate=1.0")
    run_rl(cfg, console=QUIET)
    last = read_metrics(cfg.logging.output_dir)[-1]
    assert last["eval_unmeasured"] == 1 and last["eval_success"] in (0.0, 1.0)  # task 0's alone


class HealedEnv(GridWorld):
    """Gridworld whose server failed every odd task's reset until it was mended (``mended``)."""

    mended = False

    def reset(self, task_id: int) -> Observation:
        if task_id % 2 and not HealedEnv.mended:
            raise EnvError(f"connection reset while creating task {task_id}")
        return super().reset(task_id)


@pytest.mark.slow
def test_a_resumed_run_is_judged_on_every_episode_it_played_not_just_those_since(rl_config, register_plugin):
    """Half of step 1's episodes failed (past max_env_error_rate=0.2); step 2's all played: 1 in 4 of the
    run failed, still past it. A resume that forgot step 1 would count 0 and exit 0."""
    register_plugin(EnvPlugin("healed", HealedEnv), name="healed")
    cfg = rl_config(
        *("env.name=healed", "steps=1", "tasks_per_step=4", "train_tasks=4", "eval_tasks=0"),
        "max_env_error_rate=0.2",
    )
    HealedEnv.mended = False
    with pytest.raises(EnvFailure, match=r"failed in the env 'healed'"):
        run_rl(cfg, console=QUIET)
    HealedEnv.mended = True
    resumed = dataclasses.replace(cfg, steps=2, resume=True)
    with pytest.raises(EnvFailure, match=r"(\d+) of the run's (\d+) episodes \(25%\) failed in the env 'healed'"):
        run_rl(resumed, console=QUIET)


@pytest.mark.slow
def test_a_damaged_final_checkpoint_is_written_again_by_the_resume_that_went_back_past_it(rl_config):
    """The resume skips it for the one before and replays the step: the final save must replace it, or every
    later resume warns and replays that step again."""
    from omrl.training import checkpoint as ckpt
    from omrl.training.checkpoint_marker import damage

    cfg = rl_config("steps=3", "logging.save_steps=2", "eval_tasks=0")  # step 3's checkpoint is the final save's
    run_rl(cfg, console=QUIET)
    final = ckpt.checkpoint_path(cfg.logging.output_dir, 3)
    optimizer = final / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    assert damage(final) is not None
    with pytest.warns(UserWarning, match="trying the checkpoint before it"):
        run_rl(dataclasses.replace(cfg, resume=True), console=QUIET)
    assert damage(final) is None and ckpt.latest_checkpoint(cfg.logging.output_dir) == final


@pytest.mark.slow
def test_an_emptied_complete_marker_is_damage_the_resume_goes_back_past(rl_config, capsys):
    """Not "an older omrl wrote it" (whose trust command then crashed): every omrl writes its step line."""
    from omrl.training import checkpoint as ckpt
    from tests.helpers import cli_exit

    cfg = rl_config("steps=2", "logging.save_steps=1", "eval_tasks=0")
    run_rl(cfg, console=QUIET)
    newest = ckpt.checkpoint_path(cfg.logging.output_dir, 2)
    (newest / ckpt.COMPLETE_MARKER).write_text("")
    code, _, err = cli_exit(capsys, "checkpoint", "trust", str(newest))
    assert code == 2 and "COMPLETE marker is empty or cut" in err
    with pytest.warns(
        UserWarning, match=r"step-00000002: its COMPLETE marker is empty or cut.*the checkpoint before it"
    ):
        run_rl(dataclasses.replace(cfg, steps=3, resume=True), console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2, 3]


@pytest.mark.slow
def test_a_metrics_file_with_lines_that_are_no_records_resumes_or_says_which(rl_config):
    cfg = rl_config("steps=1", "eval_tasks=0")
    run_rl(cfg, console=QUIET)
    metrics = Path(cfg.logging.output_dir) / "metrics.jsonl"
    with metrics.open("ab") as out:
        out.write(b"\x9c\xff binary noise\n5\n[1, 2]\n")  # what a crash or a stray write leaves: skipped
    run_rl(dataclasses.replace(cfg, steps=2, resume=True), console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2]
    with metrics.open("a") as out:
        out.write('{"step": "x"}\n')  # a record: not to be dropped unsaid
    with pytest.raises(OmrlError, match=r"metrics.jsonl holds a record whose step is not a whole number"):
        run_rl(dataclasses.replace(cfg, steps=3, resume=True), console=QUIET)


@pytest.mark.parametrize(
    "override, message",
    [
        ("logging.save_steps=-1", "logging.save_steps must be a whole number >= 0"),
        ("logging.keep_checkpoints=-1", "logging.keep_checkpoints must be a whole number >= 0"),
        ("logging.logging_steps=0", "logging.logging_steps must be a whole number >= 1"),
    ],
)
def test_a_cadence_that_means_nothing_is_refused_naming_its_key(rl_config, override, message):
    """save_steps=-1 saved every step (step % -1 == 0) and keep_checkpoints=-1 kept them all, unsaid."""
    with pytest.raises(ConfigError, match=message):
        run_rl(rl_config(override), console=QUIET)
