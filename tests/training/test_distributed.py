"""Data parallel under ``accelerate launch`` with configs/accelerate/ddp.yaml: here two CPU processes (gloo).

The recipes split each step's work across processes and sum gradients once per optimizer
step, weighted by global token counts, so a two-process SFT run must give the
single-process run's losses and weights, and every process must end with the same weights.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from omrl.config import to_yaml
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.metrics import read_metrics
from omrl.training.sft import run_sft

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "configs" / "accelerate" / "ddp.yaml"

# Launched on every process: runs a recipe, then saves this process's final weights.
RUN_AND_SAVE_WEIGHTS = """
import sys, torch
from omrl.config import load_config
from omrl.options import SftRunConfig, TrainRunConfig
from omrl.training.rl import RLRecipe
from omrl.training.sft import SftRecipe

kind, config, out = sys.argv[1:4]
recipe = (SftRecipe if kind == "sft" else RLRecipe)(load_config(SftRunConfig if kind == "sft" else TrainRunConfig, config))
try:
    recipe.setup()
    recipe.train()
    torch.save(recipe.model.state_dict(), f"{out}/rank{recipe.dist.rank}.pt")
finally:
    recipe.cleanup()
"""


def _launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core per process
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP),
                           "--num_processes", "2", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def _run_two_processes(tmp_path, kind: str, cfg) -> dict[int, dict[str, torch.Tensor]]:
    config_file = tmp_path / f"{kind}.yaml"
    config_file.write_text(to_yaml(cfg))
    script = tmp_path / "run_and_save.py"
    script.write_text(RUN_AND_SAVE_WEIGHTS)
    done = _launch(tmp_path, str(script), kind, str(config_file), str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    return {rank: torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)}


@pytest.mark.slow
def test_two_process_sft_matches_one_process(sft_config, tmp_path):
    # 8 conversations, 2 per micro-batch, 2 micro-batches per step: each process takes one per step
    settings = dict(num_train_epochs=2.0, optim__gradient_accumulation_steps=2, optim__lr_schedule="cosine",
                    optim__warmup_steps=1, logging__save_steps=2)
    run_sft(sft_config(logging__output_dir=str(tmp_path / "single"), **settings), console=Console(file=io.StringIO()))
    single_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "single").state_dict()

    two_cfg = sft_config(logging__output_dir=str(tmp_path / "two"), **settings)
    weights = _run_two_processes(tmp_path, "sft", two_cfg)

    single, two = read_metrics(tmp_path / "single"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in two] == [r["step"] for r in single] == [1, 2, 3, 4]  # the main process logs once
    for a, b in zip(single, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), f"step {a['step']}"
        assert b["label_tokens"] == a["label_tokens"]  # the step's global count, not one process's share
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), f"processes disagree on {name}"
        torch.testing.assert_close(tensor, single_weights[name], rtol=1e-4, atol=1e-5)
    assert latest_checkpoint(tmp_path / "two").name == "step-00000004"
    assert (tmp_path / "two" / "config.json").is_file()


@pytest.mark.slow
def test_two_process_grpo_trains_and_keeps_processes_in_step(tiny_model_dir, tmp_path):
    from omrl.config import load_config
    from omrl.options import TrainRunConfig

    cfg = load_config(TrainRunConfig, "grpo", [
        f"model.name={tiny_model_dir}", "env.name=gridworld", "env.max_turns=3", "generation.max_new_tokens=8",
        "generation.max_context=512", "steps=2", "tasks_per_step=2", "group_size=2", "mini_batch_size=2",
        "eval_tasks=2", "eval_every=1", "reward.weights={goal: 1.0}", "entropy_coef=0.01",
        "optim.learning_rate=1e-3", "logging.save_steps=1", "logging.tensorboard=false",
        f"logging.output_dir={tmp_path / 'grpo'}"])
    weights = _run_two_processes(tmp_path, "train", cfg)

    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), f"processes disagree on {name}"
    records = read_metrics(tmp_path / "grpo")
    assert [r["step"] for r in records][:2] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in records[:2])  # an update happened every step
    assert "eval_success" in records[0]
    assert latest_checkpoint(tmp_path / "grpo").name == "step-00000002"


def test_tasks_per_step_must_split_evenly_across_processes(tiny_model_dir, tmp_path):
    from omrl.config import load_config
    from omrl.options import TrainRunConfig

    config = tmp_path / "train.yaml"
    config.write_text(to_yaml(load_config(TrainRunConfig, "grpo", [
        f"model.name={tiny_model_dir}", "env.name=gridworld", "tasks_per_step=3", "steps=1",
        f"logging.output_dir={tmp_path / 'run'}"])))
    done = _launch(tmp_path, "-m", "omrl", "train", str(config))
    assert done.returncode != 0
    assert "tasks_per_step=3 does not split evenly across 2 processes" in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("mode", ["FSDP", "DEEPSPEED"])
def test_sharded_accelerate_modes_are_refused_by_name(mode):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from omrl.errors import ConfigError
    from omrl.training.distributed import Distributed

    process = SimpleNamespace(accelerator=SimpleNamespace(distributed_type=DistributedType[mode]))
    with pytest.raises(ConfigError, match=f"accelerate is set up for {DistributedType[mode].value}.*valid: MULTI_CPU, MULTI_GPU"):
        Distributed._check_mode(process)
