"""Data parallel, FSDP and DeepSpeed ZeRO-3 under ``accelerate launch`` (configs/accelerate/ddp.yaml,
fsdp.yaml, zero3.yaml): here two CPU processes (gloo).

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
# episode fewer, so it has fewer micro-batches (when sharded: idle passes).
RUN_AND_SAVE_WEIGHTS = """
import os, sys, torch
from omrl.config import load_config
from omrl.hookspecs import hookimpl
from omrl.options import SftRunConfig, TrainRunConfig
from omrl.plugins import load_plugins
from omrl.training.dpo import DPORecipe
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
    import omrl.training.dpo as dpo
    import omrl.training.rl as rl
    keep = rl.trainable
    rl.trainable = dpo.trainable = lambda episodes: keep(episodes)[1:]

if os.environ.get("OMRL_TEST_NAN_CALL") and os.environ["RANK"] == "0":  # one micro-batch's loss is NaN
    import omrl.training.rl as rl
    calls, real_loss = [0], rl.policy_gradient_loss
    def policy_gradient_loss(*args, **kwargs):
        calls[0] += 1
        loss, parts = real_loss(*args, **kwargs)
        return (loss * float("nan"), parts) if calls[0] == int(os.environ["OMRL_TEST_NAN_CALL"]) else (loss, parts)
    rl.policy_gradient_loss = policy_gradient_loss

kind, config, out = sys.argv[1:4]
cfg = load_config(SftRunConfig if kind == "sft" else TrainRunConfig, config)
recipe = SftRecipe(cfg) if kind == "sft" else (DPORecipe if cfg.algorithm.name == "dpo" else RLRecipe)(cfg)
try:
    recipe.setup()
    recipe.train()
    torch.save(recipe.strategy.state_dict(recipe.model), f"{out}/rank{recipe.strategy.rank}.pt")
finally:
    recipe.cleanup()
"""


def _launch(tmp_path, *args: str, mode: str = "ddp", uneven: bool = False, timeout: int = 600,
            nan_call: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMRL_TEST_UNEVEN": str(int(uneven)),  # one core per process
           "OMRL_TEST_NAN_CALL": str(nan_call or "")}
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch",
                           "--config_file", str(ACCELERATE_CONFIGS / f"{mode}.yaml"),
                           "--num_processes", "2", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _run_two_processes(tmp_path, kind: str, cfg, mode: str = "ddp", uneven: bool = False, nan_call: int = 0
                       ) -> dict[int, dict[str, torch.Tensor]]:
    config_file = tmp_path / f"{kind}.yaml"
    config_file.write_text(to_yaml(cfg))
    script = tmp_path / "run_and_save.py"
    script.write_text(RUN_AND_SAVE_WEIGHTS)
    done = _launch(tmp_path, str(script), kind, str(config_file), str(tmp_path), mode=mode, uneven=uneven,
                   nan_call=nan_call)
    assert done.returncode == 0, done.stderr[-4000:]
    return {rank: torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "zero3"])
def test_two_process_sft_matches_one_process(sft_config, tmp_path, mode):
    # 8 conversations, 2 per micro-batch, 3 micro-batches per step: the processes take 2 and 1, then 1 and
    # none (when sharded the idle process runs idle passes to keep the collectives in step)
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
        "eval_tasks=2", "eval_every=1", "reward.weights={goal: 1.0}", "algorithm.entropy_coef=0.01",
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
    ("grpo", ["optim.micro_batch_size=1", "algorithm.kl_coef=0.05"], True),
    ("ppo", ["algorithm.kl_coef=0.05"], False),  # a value head beside the sharded model, and a reference model
    ("ppo", ["algorithm.critic=model", "optim.micro_batch_size=1", "mini_batch_size=0"], True),  # two sharded models
    ("dpo", ["optim.micro_batch_size=1"], False),  # process 1 has no pair: it runs idle passes
])
def test_sharded_rl_matches_data_parallel(tiny_model_dir, tmp_path, algo, overrides, uneven):
    """Same seed, same processes: FSDP and ZeRO-3 shard what DDP replicates, so the runs must agree."""
    runs = {}
    for mode in ("ddp", "fsdp", "zero3"):
        (tmp_path / mode).mkdir()
        cfg = _rl_config(tiny_model_dir, tmp_path / mode / "run", algo, "reward.weights={main_sample_index: 1.0}",
                         *overrides)
        runs[mode] = (_run_two_processes(tmp_path / mode, "train", cfg, mode, uneven)[0],
                      read_metrics(tmp_path / mode / "run"))

    ddp_weights, ddp_records = runs["ddp"]
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    for mode in ("fsdp", "zero3"):
        weights, records = runs[mode]
        assert [r["step"] for r in records] == [r["step"] for r in ddp_records]
        for a, b in zip(ddp_records, records):
            assert b["reward"] == a["reward"], f"{mode} step {a['step']}: the rollouts differ"
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), f"{mode} step {a['step']}"
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), f"{mode} step {a['step']}"
            assert b["lr"] == pytest.approx(a["lr"]), f"{mode} step {a['step']}"
        for name, tensor in ddp_weights.items():
            if name not in start:  # a head made by the run: no starting point to measure a move from
                torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5, msg=f"{mode} {name}")
                continue
            # Adam turns a float-rounding difference in a near-zero gradient into a step difference of
            # up to the learning rate, so the gap is judged against how far training moved the tensor
            # (measured: at most 0.4% of it; a shard that missed its update is off by the whole move)
            moved = float((tensor - start[name]).abs().max())
            gap = float((weights[name] - tensor).abs().max())
            assert gap <= 0.02 * moved + 1e-7, f"{mode} {name}: {gap:.2e} from DDP's weights, moved {moved:.2e}"
        # the checkpoint holds the gathered, whole weights in Hugging Face format
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / mode / "run").state_dict()
        for name, tensor in weights.items():
            torch.testing.assert_close(saved[name], tensor, msg=f"{mode} {name}")


@pytest.mark.slow
def test_a_non_finite_gradient_skips_the_update_in_every_mode(tiny_model_dir, tmp_path):
    """A NaN loss in one micro-batch on process 0 makes the summed gradient NaN: every mode skips
    that update (DeepSpeed's engine by itself under ZeRO-3), counts it, and trains on as DDP does."""
    runs = {}
    for mode in ("ddp", "zero3"):
        (tmp_path / mode).mkdir()
        cfg = _rl_config(tiny_model_dir, tmp_path / mode / "run", "grpo", "reward.weights={main_sample_index: 1.0}",
                         "steps=3", "eval_tasks=0")
        runs[mode] = (_run_two_processes(tmp_path / mode, "train", cfg, mode, nan_call=2)[0],
                      read_metrics(tmp_path / mode / "run"))
    (ddp_weights, ddp_records), (zero_weights, zero_records) = runs["ddp"], runs["zero3"]
    assert [r.get("skipped_updates", 0) for r in zero_records] == [r.get("skipped_updates", 0) for r in ddp_records]
    assert max(r.get("skipped_updates", 0) for r in zero_records) == 1
    assert zero_records[-1]["grad_norm"] == pytest.approx(ddp_records[-1]["grad_norm"], rel=1e-3)
    for name, tensor in ddp_weights.items():
        assert torch.isfinite(zero_weights[name]).all(), name
        torch.testing.assert_close(zero_weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


FAIL_ON_RANK_1 = """
import os, sys
from omrl.config import load_config
from omrl.options import SftRunConfig
from omrl.training.sft import SftRecipe

recipe = SftRecipe(load_config(SftRunConfig, sys.argv[1]))
try:
    recipe.setup()
    if os.environ["RANK"] == "1":
        raise RuntimeError("failed on process 1")
    recipe.train()  # process 0 waits in the step's first collective for process 1
finally:
    recipe.cleanup()
"""


def test_an_error_on_one_process_ends_the_run_instead_of_hanging(sft_config, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(to_yaml(sft_config(logging__output_dir=str(tmp_path / "run"))))
    (tmp_path / "fail.py").write_text(FAIL_ON_RANK_1)
    done = _launch(tmp_path, str(tmp_path / "fail.py"), str(config), timeout=120)  # a hang raises TimeoutExpired
    assert done.returncode != 0
    assert "failed on process 1" in done.stderr


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


@pytest.mark.parametrize("mode", ["MEGATRON_LM", "XLA"])
def test_unsupported_accelerate_modes_are_refused_by_name(mode):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from omrl.errors import ConfigError
    from omrl.parallel import Strategy

    process = SimpleNamespace(accelerator=SimpleNamespace(distributed_type=DistributedType[mode]))
    with pytest.raises(ConfigError, match="accelerate is set up for .*valid: MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED"):
        Strategy._check_launch(process)


@pytest.mark.parametrize("setting, value, error", [
    ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2", "zero_stage: 2 is not supported under omrl's ZeRO-3; valid: 3"),
    ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu", "offload_optimizer_device: cpu .*valid: none"),
    ("ACCELERATE_DEEPSPEED_ZERO3_INIT", "true", "zero3_init: true .*valid: false"),
    ("ACCELERATE_DEEPSPEED_CONFIG_FILE", "ds.json", "deepspeed_config_file is not supported"),
    ("ACCELERATE_MIXED_PRECISION", "bf16", "mixed_precision: bf16 .*valid: no"),
    ("ACCELERATE_GRADIENT_CLIPPING", "1.0", "gradient_clipping: 1.0 .*set optim.max_grad_norm"),
    ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "gradient_accumulation_steps: 4 .*valid: 1, or leave it out"),
])
def test_deepspeed_settings_the_recipes_do_not_implement_are_refused(monkeypatch, setting, value, error):
    from omrl.errors import ConfigError
    from omrl.parallel import zero3

    monkeypatch.setenv(setting, value)
    with pytest.raises(ConfigError, match=error):
        zero3.check_options()


def test_zero3_keeps_transformers_from_partitioning_models_as_they_load():
    """On GPUs the Accelerator registers a stage-3 DeepSpeed config with transformers, which would then
    load every model (the rollout copy too) already partitioned; omrl partitions them itself."""
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    from omrl.parallel import zero3

    registered = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert is_deepspeed_zero3_enabled()  # what accelerate leaves behind on a GPU machine
    zero3.load_models_whole()
    assert not is_deepspeed_zero3_enabled()
    del registered


def test_a_sharded_resume_refuses_an_optimizer_state_of_other_parameters(tiny_model_dir):
    from omrl.parallel import FSDP, Trainables
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters())
    process = object.__new__(FSDP)  # its optimizer-state check, without a process group
    process.owner = Trainables({"policy": model})
    names = [name for name, _ in process.owner.named_parameters()]
    saved = {"state": {}, "param_groups": [{"lr": 1e-3, "params": names[:-1] + ["critic.head.weight"]}]}
    with pytest.raises(ValueError, match=r"does not fit this run: 1 parameter group\(s\) against 1, "
                                         rf"missing \['{names[-1]}'\], unexpected \['critic.head.weight'\]"):
        process.load_optimizer_state(optimizer, saved)


def test_zero3_refuses_other_weight_dtypes():
    from omrl.errors import ConfigError
    from omrl.parallel import zero3

    with pytest.raises(ConfigError, match="model.dtype=bfloat16 is not supported under ZeRO-3 .*valid: model.dtype=float32"):
        zero3.check_options("bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize("mode, algo, overrides", [
    ("fsdp", "grpo", []),
    ("fsdp", "ppo", ["algorithm.critic=model"]),
    ("zero3", "ppo", ["algorithm.critic=model", "algorithm.kl_coef=0.05"]),  # every kind of module: policy, critic, value head, reference
])
def test_sharded_run_resumes_exactly(tiny_model_dir, tmp_path, mode, algo, overrides):
    """A sharded run resumed from its step-2 checkpoint ends where the uninterrupted run ended."""
    import shutil

    cfg = _rl_config(tiny_model_dir, tmp_path / "run", algo, "steps=3", "logging.keep_checkpoints=0",
                     "reward.weights={main_sample_index: 1.0}", "eval_tasks=0", *overrides)
    uninterrupted = _run_two_processes(tmp_path, "train", cfg, mode)[0]
    records = read_metrics(tmp_path / "run")

    shutil.rmtree(latest_checkpoint(tmp_path / "run"))  # as if killed before the step-3 checkpoint
    assert latest_checkpoint(tmp_path / "run").name == "step-00000002"
    resumed = _run_two_processes(tmp_path, "train", dataclasses.replace(cfg, resume=True), mode)[0]

    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0, msg=name)
    resumed_records = read_metrics(tmp_path / "run")
    assert resumed_records[-1]["step"] == 3
    assert resumed_records[-1]["loss"] == records[-1]["loss"]


def test_fsdp_settings_the_recipes_do_not_implement_are_refused(monkeypatch):
    from omrl.errors import ConfigError
    from omrl.parallel import fsdp

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
    from omrl.parallel import fsdp
    from omrl.training.model_setup import load_trainable_model

    lora_model, _ = load_trainable_model(ModelConfig(name=tiny_model_dir, lora_rank=4), "cpu")
    with pytest.raises(ConfigError, match="LoRA .* cannot be combined with FSDP"):
        fsdp.shard(lora_model)  # refused before any process group is needed
