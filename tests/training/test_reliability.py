"""Faults a training run meets (Ctrl-C, a damaged checkpoint, an env that fails every episode, a
full disk) and settings that could never train: each is said plainly, and nothing is lost."""

from __future__ import annotations

import errno
import io
import shutil
from typing import Sequence

import pytest
from rich.console import Console

from omrl.config import load_config
from omrl.envs import Env, EnvError, Observation, StepResult
from omrl.errors import ConfigError, EnvFailure, Interrupted
from omrl.hookspecs import hookimpl
from omrl.options import TrainRunConfig
from omrl.training.checkpoint import complete_checkpoints
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl

QUIET = Console(file=io.StringIO())


@pytest.fixture
def rl_config(tiny_model_dir, tmp_path):
    def make(*overrides: str) -> TrainRunConfig:
        return load_config(TrainRunConfig, "grpo", [
            f"model.name={tiny_model_dir}", "env.name=gridworld", "env.max_turns=2", "generation.max_new_tokens=6",
            "generation.max_context=512", f"logging.output_dir={tmp_path / 'run'}", "logging.tensorboard=false",
            "steps=2", "tasks_per_step=1", "group_size=2", "eval_tasks=1", "optim.learning_rate=1e-3",
            "algorithm.entropy_coef=0.01", *overrides])  # the entropy bonus: every step updates

    return make


class DeadServerEnv(Env):
    """An env that fails every episode, as a server that went down would."""

    def task_ids(self, split: str) -> Sequence[int]:
        return range(4)

    def reset(self, task_id: int) -> Observation:
        raise EnvError("connection refused by 127.0.0.1:9")

    def step(self, action: str) -> StepResult:
        raise EnvError("connection refused by 127.0.0.1:9")


class DeadServer:
    @hookimpl
    def register_envs(self, register):
        register("dead_server", DeadServerEnv)


def test_ctrl_c_names_the_checkpoint_kept_and_how_to_resume(rl_config):
    cfg = rl_config("logging.save_steps=1")

    def press_ctrl_c(step, metrics):
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match=r"newest complete checkpoint is .*step-00000001.*--resume --output-dir"):
        run_rl(cfg, on_step_end=press_ctrl_c, console=QUIET)


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


def test_a_run_whose_every_episode_failed_in_the_env_is_no_result(rl_config, register_plugin):
    register_plugin(DeadServer(), name="dead-server")
    with pytest.raises(EnvFailure, match="every one of the 4 episodes .* failed in the env 'dead_server'.*"
                                         "connection refused by 127.0.0.1:9"):
        run_rl(rl_config("env.name=dead_server", "eval_tasks=0"), console=QUIET)


@pytest.mark.parametrize("override, message", [
    ("optim.learning_rate=-1", "optim.learning_rate must be a finite number >= 0, got -1"),
    ("optim.micro_batch_size=0", "optim.micro_batch_size must be >= 1, got 0"),
    ("algorithm.advantage=gae", "algorithm.advantage=gae cannot run with algorithm.name=grpo.*use algorithm.name=ppo"),
    ("group_size=1", "algorithm.advantage=grpo gives every sample an advantage of 0 with group_size=1"),
    ("generation.temperature=-1", "generation.temperature must be >= 0"),
    ("generation.max_context=6", "generation.max_context larger than it"),
])
def test_settings_that_could_never_train_are_refused_before_any_rollout(rl_config, override, message):
    cfg = rl_config(override)
    with pytest.raises(ConfigError, match=message):
        run_rl(cfg, console=QUIET)
    assert not (cfg.logging.output_dir and read_metrics(cfg.logging.output_dir))


def test_a_full_disk_is_reported_as_the_machines_fault_not_omrls(capsys):
    from omrl.cli import report_error

    status = report_error(OSError(errno.ENOSPC, "No space left on device", "/runs/x/optimizer.pt"), debug=False)
    err = capsys.readouterr().err
    assert status == 2 and "the disk is full (/runs/x/optimizer.pt)" in err and "bug in omrl" not in err


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
    with pytest.raises(ConfigError, match=r"no episode of this run got a single model turn: the opening prompt \(up to "
                                          r"\d+ tokens\) leaves no room within generation.max_context=20"):
        run_rl(rl_config("generation.max_context=20", "eval_tasks=0"), console=QUIET)


def test_resuming_a_finished_run_adds_no_metrics_row(rl_config):
    cfg = rl_config()
    run_rl(cfg, console=QUIET)
    cfg.resume = True
    run_rl(cfg, console=QUIET)
    assert [r["step"] for r in read_metrics(cfg.logging.output_dir)] == [1, 2]
