"""Data parallel and FSDP under ``accelerate launch`` (configs/accelerate/ddp.yaml, fsdp.yaml): here two
CPU processes (gloo).

The recipes split each step's work across processes and sum gradients weighted by global
token counts, so a two-process SFT run must give the single-process run's losses and
weights, and every process must end with the same weights.
"""

from __future__ import annotations

import dataclasses
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
ACCELERATE_CONFIGS = ROOT / "configs" / "accelerate"

# Launched on every process: runs a recipe, then saves this process's final weights. The reward
# "main_sample_index" is each sample's index on process 0 and 0 elsewhere, so only process 0 has
# preference pairs and non-zero advantages. With OMRL_TEST_UNEVEN=1, process 1 trains on one
# episode fewer, so it has fewer micro-batches (under FSDP: idle passes).
RUN_AND_SAVE_WEIGHTS = """
import os, sys, torch
from omrl.config import load_config
from omrl.hookspecs import hookimpl
from omrl.options import SftRunConfig, TrainRunConfig
from omrl.plugins import load_plugins
from omrl.training.rl import RLRecipe
from omrl.training.sft import SftRecipe

class MainSampleIndex:
    @hookimpl
    def register_rewards(self, register):
        main = os.environ["RANK"] == "0"
        register("main_sample_index", lambda episodes: [
            [0.0] * (len(ep.turns) - 1) + [float(ep.sample) if main else 0.0] for ep in episodes])

load_plugins().register(MainSampleIndex(), name="main-sample-index")
if os.environ.get("OMRL_TEST_UNEVEN") == "1" and os.environ["RANK"] == "1":
    import omrl.training.rl as rl
    keep = rl.trainable
    rl.trainable = lambda episodes: keep(episodes)[1:]

kind, config, out = sys.argv[1:4]
recipe = (SftRecipe if kind == "sft" else RLRecipe)(load_config(SftRunConfig if kind == "sft" else TrainRunConfig, config))
try:
    recipe.setup()
    recipe.train()
    torch.save(recipe.dist.state_dict(recipe.model), f"{out}/rank{recipe.dist.rank}.pt")
finally:
    recipe.cleanup()
"""


def _launch(tmp_path, *args: str, mode: str = "ddp", uneven: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMRL_TEST_UNEVEN": str(int(uneven))}  # one core per process
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch",
                           "--config_file", str(ACCELERATE_CONFIGS / f"{mode}.yaml"),
                           "--num_processes", "2", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def _run_two_processes(tmp_path, kind: str, cfg, mode: str = "ddp", uneven: bool = False
                       ) -> dict[int, dict[str, torch.Tensor]]:
    config_file = tmp_path / f"{kind}.yaml"
    config_file.write_text(to_yaml(cfg))
    script = tmp_path / "run_and_save.py"
    script.write_text(RUN_AND_SAVE_WEIGHTS)
    done = _launch(tmp_path, str(script), kind, str(config_file), str(tmp_path), mode=mode, uneven=uneven)
    assert done.returncode == 0, done.stderr[-4000:]
    return {rank: torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_process_sft_matches_one_process(sft_config, tmp_path, mode):
    # 8 conversations, 2 per micro-batch, 3 micro-batches per step: the processes take 2 and 1, then 1 and
    # none (under FSDP the idle process runs idle passes to keep the collectives in step)
    settings = dict(num_train_epochs=2.0, optim__gradient_accumulation_steps=3, optim__lr_schedule="cosine",
                    optim__warmup_steps=1, logging__save_steps=2)
    run_sft(sft_config(logging__output_dir=str(tmp_path / "single"), **settings), console=Console(file=io.StringIO()))
    single_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "single").state_dict()

    two_cfg = sft_config(logging__output_dir=str(tmp_path / "two"), **settings)
    weights = _run_two_processes(tmp_path, "sft", two_cfg, mode)

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


def _rl_config(tiny_model_dir, output_dir, algo: str = "grpo", *overrides: str):
    from omrl.config import load_config
    from omrl.options import TrainRunConfig

    return load_config(TrainRunConfig, algo, [
        f"model.name={tiny_model_dir}", "env.name=gridworld", "env.max_turns=3", "generation.max_new_tokens=8",
        "generation.max_context=512", "steps=2", "tasks_per_step=2", "group_size=2", "mini_batch_size=2",
        "eval_tasks=2", "eval_every=1", "reward.weights={goal: 1.0}", "entropy_coef=0.01",
        "optim.learning_rate=1e-3", "logging.save_steps=1", "logging.tensorboard=false",
        f"logging.output_dir={output_dir}", *overrides])


@pytest.mark.slow
def test_two_process_grpo_trains_and_keeps_processes_in_step(tiny_model_dir, tmp_path):
    weights = _run_two_processes(tmp_path, "train", _rl_config(tiny_model_dir, tmp_path / "grpo"))

    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), f"processes disagree on {name}"
    records = read_metrics(tmp_path / "grpo")
    assert [r["step"] for r in records][:2] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in records[:2])  # an update happened every step
    assert "eval_success" in records[0]
    assert latest_checkpoint(tmp_path / "grpo").name == "step-00000002"


@pytest.mark.slow
@pytest.mark.parametrize("algo, overrides, uneven", [
    # process 1 has a micro-batch fewer: idle passes, through the sharded reference model too
    ("grpo", ["optim.micro_batch_size=1", "kl_coef=0.05"], True),
    ("ppo", ["kl_coef=0.05"], False),  # a value head beside the sharded model, and a reference model
    ("ppo", ["critic=model", "optim.micro_batch_size=1", "mini_batch_size=0"], True),  # two sharded models
    ("dpo", ["optim.micro_batch_size=1"], False),  # process 1 has no pair: it runs idle passes
])
def test_fsdp_rl_matches_data_parallel(tiny_model_dir, tmp_path, algo, overrides, uneven):
    """Same seed, same processes: FSDP shards what DDP replicates, so the runs must agree."""
    runs = {}
    for mode in ("ddp", "fsdp"):
        (tmp_path / mode).mkdir()
        cfg = _rl_config(tiny_model_dir, tmp_path / mode / "run", algo, "reward.weights={main_sample_index: 1.0}",
                         *overrides)
        runs[mode] = (_run_two_processes(tmp_path / mode, "train", cfg, mode, uneven)[0],
                      read_metrics(tmp_path / mode / "run"))

    (ddp_weights, ddp_records), (fsdp_weights, fsdp_records) = runs["ddp"], runs["fsdp"]
    assert [r["step"] for r in fsdp_records] == [r["step"] for r in ddp_records]
    for a, b in zip(ddp_records, fsdp_records):
        assert b["reward"] == a["reward"], f"step {a['step']}: the rollouts differ"
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), f"step {a['step']}"
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), f"step {a['step']}"
    for name, tensor in ddp_weights.items():
        torch.testing.assert_close(fsdp_weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    # the checkpoint holds the gathered, whole weights in Hugging Face format
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "run").state_dict()
    for name, tensor in fsdp_weights.items():
        torch.testing.assert_close(saved[name], tensor, msg=name)


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


@pytest.mark.parametrize("mode", ["DEEPSPEED", "MEGATRON_LM", "XLA"])
def test_unsupported_accelerate_modes_are_refused_by_name(mode):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from omrl.errors import ConfigError
    from omrl.training.distributed import Distributed

    process = SimpleNamespace(accelerator=SimpleNamespace(distributed_type=DistributedType[mode]))
    with pytest.raises(ConfigError, match="accelerate is set up for .*valid: MULTI_CPU, MULTI_GPU, FSDP"):
        Distributed._check_mode(process)


def test_deepspeed_is_refused_with_the_fsdp_config_to_use_instead():
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from omrl.errors import ConfigError
    from omrl.training.distributed import Distributed

    process = SimpleNamespace(accelerator=SimpleNamespace(distributed_type=DistributedType.DEEPSPEED))
    with pytest.raises(ConfigError, match="DeepSpeed, which omrl's recipes do not support.*accelerate/fsdp.yaml"):
        Distributed._check_mode(process)


@pytest.mark.slow
@pytest.mark.parametrize("algo, overrides", [("grpo", []), ("ppo", ["critic=model"])])
def test_fsdp_run_resumes_exactly(tiny_model_dir, tmp_path, algo, overrides):
    """A sharded run resumed from its step-2 checkpoint ends where the uninterrupted run ended."""
    import shutil

    cfg = _rl_config(tiny_model_dir, tmp_path / "run", algo, "steps=3", "logging.keep_checkpoints=0",
                     "reward.weights={main_sample_index: 1.0}", "eval_tasks=0", *overrides)
    uninterrupted = _run_two_processes(tmp_path, "train", cfg, "fsdp")[0]
    records = read_metrics(tmp_path / "run")

    shutil.rmtree(latest_checkpoint(tmp_path / "run"))  # as if killed before the step-3 checkpoint
    assert latest_checkpoint(tmp_path / "run").name == "step-00000002"
    resumed = _run_two_processes(tmp_path, "train", dataclasses.replace(cfg, resume=True), "fsdp")[0]

    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0, msg=name)
    resumed_records = read_metrics(tmp_path / "run")
    assert resumed_records[-1]["step"] == 3
    assert resumed_records[-1]["loss"] == records[-1]["loss"]


def test_fsdp_settings_the_recipes_do_not_implement_are_refused(monkeypatch):
    from omrl.errors import ConfigError
    from omrl.training import fsdp

    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match="fsdp_version 1 is not supported; valid: 2"):
        fsdp.check_options()
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    with pytest.raises(ConfigError, match="fsdp_offload_params: true is not supported"):
        fsdp.check_options()


def test_fsdp_refuses_lora(tiny_model_dir):
    from omrl.errors import ConfigError
    from omrl.options import ModelConfig
    from omrl.training import fsdp
    from omrl.training.model_setup import load_trainable_model

    lora_model, _ = load_trainable_model(ModelConfig(name=tiny_model_dir, lora_rank=4), "cpu")
    with pytest.raises(ConfigError, match="LoRA .* cannot be combined with FSDP"):
        fsdp.shard(lora_model)  # refused before any process group is needed
