"""Helpers the training tests share: small `omrl train` and `omrl sft` runs on the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.hookspecs import hookimpl

ACCELERATE_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"


def gridworld_config(model_dir: str, output_dir: Path | str, *overrides: str, algo: str = "grpo") -> TrainRunConfig:
    """The ``algo`` preset of `omrl train` made small for a test: ``model_dir`` on gridworld, 2 turns of up to
    8 new tokens in a 512-token context, 2 steps of 2 tasks x 3 samples, no evaluation, learning rate 1e-3,
    no TensorBoard, written to ``output_dir``. ``overrides`` (``key=value``) come last and win."""
    return load_config(
        TrainRunConfig,
        algo,
        [
            *(f"model.name={model_dir}", "env.name=gridworld", "env.max_turns=2", "generation.max_new_tokens=8"),
            *("generation.max_context=512", f"logging.output_dir={output_dir}", "logging.tensorboard=false"),
            *("steps=2", "tasks_per_step=2", "group_size=3", "eval_tasks=0", "optim.learning_rate=1e-3"),
            *overrides,
        ],
    )


def gridworld_configs(model_dir: str, runs_dir: Path, *settings: str) -> Callable[..., TrainRunConfig]:
    """For a fixture: ``make(*overrides, out="run", algo="grpo")``, the :func:`gridworld_config` of ``settings``
    then ``overrides``, written to ``runs_dir / out``."""

    def make(*overrides: str, out: str = "run", algo: str = "grpo") -> TrainRunConfig:
        return gridworld_config(model_dir, runs_dir / out, *settings, *overrides, algo=algo)

    return make


class EnvPlugin:
    """A plugin of one env: ``env_class`` registered as ``name``."""

    def __init__(self, name: str, env_class: type):
        self.name, self.env_class = name, env_class

    @hookimpl
    def register_envs(self, register):
        register(self.name, self.env_class)


class SampleIndexReward:
    """A plugin of one reward, registered as ``name``: the sample's index (``Episode.sample``; for a tree's
    paths, the leaf's index in its tree) on the last turn, so the samples of a task all score differently."""

    def __init__(self, name: str = "sample_index"):
        self.name = name

    @hookimpl
    def register_rewards(self, register):
        def sample_index(episodes):
            """The sample's index, on the last turn."""
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample)] for ep in episodes]

        register(self.name, sample_index)


def train_command(model_dir: str, output_dir: Path, *extra: str) -> Any:
    """``omrl train --algo grpo --env gridworld`` of one step of ``model_dir`` into ``output_dir`` (2 turns of
    up to 6 new tokens, one evaluation task, no TensorBoard), ``extra`` arguments last; the CliRunner result."""
    from typer.testing import CliRunner

    from omrl.cli import build_app

    return CliRunner().invoke(
        build_app(),
        [
            *("train", "--algo", "grpo", "--env", "gridworld", "--model", model_dir, "--steps", "1"),
            *("--output-dir", str(output_dir), "env.max_turns=2", "eval_tasks=1", "generation.max_new_tokens=6"),
            "logging.tensorboard=false",
            *extra,
        ],
    )


def sft_command(model_dir: str, dataset: str | Path, output_dir: Path, *extra: str) -> list[str]:
    """The arguments of ``omrl sft`` on ``model_dir``: half an epoch of ``dataset`` in batches of 8, one
    micro-batch a step, written to ``output_dir``; ``extra`` arguments last."""
    return [
        *("sft", f"model.name={model_dir}", "--dataset", str(dataset), "--output-dir", str(output_dir)),
        *("--num-train-epochs", "0.5", "--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "1"),
        *extra,
    ]


def train_then_clean_up(recipe: Any) -> dict:
    """``recipe.train()``, then ``recipe.cleanup()`` whether or not it raised; the training summary."""
    try:
        return recipe.train()
    finally:
        recipe.cleanup()


class Stop(Exception):
    """Stands in for a run killed after a checkpoint."""


def run_until(run: Any, cfg: Any, after: int, **run_options: Any) -> None:
    """``run(cfg)`` (``run_rl`` or ``run_sft``) until step ``after`` ends, as if killed there."""

    def stop(step: int, metrics: dict) -> None:
        if step == after:
            raise Stop

    try:
        run(cfg, on_step_end=stop, **run_options)
    except Stop:
        pass
    else:
        raise AssertionError(f"the run ended before step {after}")


def stop_then_resume(cfg: TrainRunConfig, after: int = 2, **run_options: Any) -> None:
    """Run ``cfg`` (which checkpoints every step) until step ``after`` ends, as if killed there, then
    resume it with ``--resume`` to its end."""
    from omrl.training.checkpoint import latest_checkpoint
    from omrl.training.rl import run_rl

    run_until(run_rl, cfg, after, **run_options)
    assert latest_checkpoint(cfg.logging.output_dir).name == f"step-{after:08d}"
    cfg.resume = True
    run_rl(cfg, **run_options)


def sft_stop_then_resume(cfg: Any, after: int, **run_options: Any) -> None:
    """Run the SFT ``cfg`` until step ``after`` ends, as if killed there, then resume it with ``--resume``
    to its end."""
    from omrl.training.sft import run_sft

    run_until(run_sft, cfg, after, **run_options)
    cfg.resume = True
    run_sft(cfg, **run_options)


def launch_two_processes(cwd: Path, *args: str, mode: str = "ddp", timeout: int = 600) -> subprocess.CompletedProcess:
    """``accelerate launch`` of ``args`` (a script and its arguments, or ``-m module ...``) as two CPU processes
    under ``configs/accelerate/<mode>.yaml``, one core each: the finished launch, its output captured."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "accelerate.commands.launch"),
            *("--config_file", str(ACCELERATE_CONFIGS / f"{mode}.yaml"), "--num_processes", "2", *args),
        ],
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # one core per process
        capture_output=True,
        text=True,
        timeout=timeout,
    )
