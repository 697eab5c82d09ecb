"""Data parallel, FSDP and DeepSpeed ZeRO-3 under ``accelerate launch`` (configs/accelerate/ddp.yaml,
fsdp.yaml, zero3.yaml): here two CPU processes (gloo).

The recipes split each step's work across processes and sum gradients weighted by global
token counts, so a two-process SFT run must give the single-process run's losses and
weights, and every process must end with the same weights.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from omrl.config import to_yaml
from omrl.rollout.outcomes import OUTCOMES
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.metrics import read_metrics
from omrl.training.sft import run_sft

from .helpers import launch_two_processes
from .launch import Job, run_jobs
from .sample_data import agent_records, sft_run_config

# 8 conversations, 2 per micro-batch, 3 micro-batches per step: the processes take 2 and 1, then 1 and
# none (when sharded the idle process runs idle passes to keep the collectives in step)
SFT_SETTINGS = dict(
    num_train_epochs=2.0,
    optim__gradient_accumulation_steps=3,
    optim__lr_schedule="cosine",
    optim__warmup_steps=1,
    logging__save_steps=2,
)


def _rl_config(tiny_model_dir, output_dir, algo: str = "grpo", *overrides: str):
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig

    return load_config(
        TrainRunConfig,
        algo,
        [
            f"model.name={tiny_model_dir}",
            "env.name=gridworld",
            "env.max_turns=3",
            "generation.max_new_tokens=8",
            "generation.max_context=512",
            "steps=2",
            "tasks_per_step=2",
            "group_size=2",
            "mini_batch_size=2",
            "eval_tasks=2",
            "eval_every=1",
            "reward.weights={goal: 1.0}",
            "algorithm.entropy_coef=0.01",
            "optim.learning_rate=1e-3",
            "logging.save_steps=1",
            "logging.tensorboard=false",
            f"logging.output_dir={output_dir}",
            *overrides,
        ],
    )


# Sharded runs must agree with DDP's, case by case: process 1 has a micro-batch fewer (idle passes,
# through the sharded reference model too); a value head beside the sharded model and a reference
# model; two sharded models; process 1 with no preference pair (idle passes).
SHARDED_CASES = {  # name: (algo, overrides, uneven)
    "grpo": ("grpo", ["optim.micro_batch_size=1", "algorithm.kl_coef=0.05"], True),
    "ppo": ("ppo", ["algorithm.kl_coef=0.05"], False),
    "ppo-critic": ("ppo", ["algorithm.critic=model", "optim.micro_batch_size=1", "mini_batch_size=0"], True),
    "dpo": ("dpo", ["optim.micro_batch_size=1"], False),
    # a Qwen3-architecture model whose template splits every turn into a new row (chat.history=as_template):
    # the update packs each episode's rows; process 1 idles through a pass
    "grpo-split": ("grpo", ["chat.history=as_template", "optim.micro_batch_size=1"], True),
}
SPLIT_MODEL = "grpo-split"  # the case that plays tests/chat/thinking.py's KEEPS_ANSWER model
# Runs resumed from their step-2 checkpoint; the last has every kind of module: policy, critic, value
# head, reference.
RESUMED_CASES = {  # name: (mode, algo, overrides)
    "fsdp-grpo": ("fsdp", "grpo", []),
    "fsdp-ppo": ("fsdp", "ppo", ["algorithm.critic=model"]),
    "zero3-ppo": ("zero3", "ppo", ["algorithm.critic=model", "algorithm.kl_coef=0.05"]),
}
MODES = ("ddp", "fsdp", "zero3")


class Launched(dict):
    """The runs by (mode, case), and the model directory of the split-history case."""

    split_model = ""


@dataclasses.dataclass
class Run:
    weights: dict[int, dict[str, torch.Tensor]]  # by process
    records: list[dict]
    output_dir: Path


@pytest.fixture(scope="module")
def launched(tiny_model_dir, tmp_path_factory) -> Launched:
    """Every multi-process SFT and RL run of the tests in this file, by (mode, case): one launch per
    mode runs them all in turn (a launch costs some 12 s before its first step), then one per mode
    resumes."""
    from tests.chat.thinking import KEEPS_ANSWER, build_qwen3_like

    root = tmp_path_factory.mktemp("launched")
    split_model = str(build_qwen3_like(root / "qwen3-keeps-answer", KEEPS_ANSWER))
    main_index = "reward.weights={main_sample_index: 1.0}"
    jobs: dict[str, dict[str, Job]] = {mode: {} for mode in MODES}
    jobs["ddp"]["plain-grpo"] = Job(
        "train", _rl_config(tiny_model_dir, root / "ddp" / "plain-grpo" / "run"), root / "ddp" / "plain-grpo"
    )
    questions = root / "qa.jsonl"  # solve-verify's tasks: the policy plays the solver and the verifier
    questions.write_text(
        "".join(json.dumps({"question": f"What is {n} + 1?", "answer": n + 1}) + "\n" for n in range(4))
    )
    seats = ["env.name=solve-verify", f"plugins.solve-verify.path={questions}", "reward.weights={process: 1.0}"]
    jobs["ddp"]["seats"] = Job(
        "train",
        _rl_config(tiny_model_dir, root / "ddp" / "seats" / "run", "grpo", *seats, "eval_tasks=0"),
        root / "ddp" / "seats",
    )
    dataset = root / "agent.jsonl"
    dataset.write_text("".join(json.dumps(record) + "\n" for record in agent_records()))
    for mode in MODES:
        jobs[mode]["sft"] = Job(
            "sft",
            sft_run_config(tiny_model_dir, dataset, root / mode / "sft" / "run", **SFT_SETTINGS),
            root / mode / "sft",
        )
        for case, (algo, overrides, uneven) in SHARDED_CASES.items():
            out = root / mode / case
            model = split_model if case == SPLIT_MODEL else tiny_model_dir
            jobs[mode][case] = Job(
                "train", _rl_config(model, out / "run", algo, main_index, *overrides), out, uneven=uneven
            )
        out = root / mode / "nan"  # process 0's second micro-batch loss is NaN
        jobs[mode]["nan"] = Job(
            "train",
            _rl_config(tiny_model_dir, out / "run", "grpo", main_index, "steps=3", "eval_tasks=0"),
            out,
            nan_call=2,
        )
    for case, (mode, algo, overrides) in RESUMED_CASES.items():
        out = root / mode / case
        jobs[mode][case] = Job(
            "train",
            _rl_config(
                tiny_model_dir,
                out / "run",
                algo,
                "steps=3",
                main_index,
                "logging.keep_checkpoints=0",
                "eval_tasks=0",
                *overrides,
            ),
            out,
        )

    runs = Launched()
    runs.split_model = split_model
    for mode, named in jobs.items():
        for case, weights in zip(named, run_jobs(root, mode, list(named.values()))):
            runs[mode, case] = Run(weights, read_metrics(named[case].out / "run"), named[case].out / "run")

    resumed: dict[str, list[Job]] = {}
    for case, (mode, _, _) in RESUMED_CASES.items():
        job, run = jobs[mode][case], runs[mode, case]
        shutil.rmtree(latest_checkpoint(run.output_dir))  # as if killed before the step-3 checkpoint
        assert latest_checkpoint(run.output_dir).name == "step-00000002"
        resumed.setdefault(mode, []).append(
            Job("train", dataclasses.replace(job.cfg, resume=True), job.out.with_name(f"{case}-resumed"))
        )
    for mode, mode_jobs in resumed.items():
        for job, weights in zip(mode_jobs, run_jobs(root, mode, mode_jobs)):
            output_dir = Path(job.cfg.logging.output_dir)
            runs[mode, job.out.name] = Run(weights, read_metrics(output_dir), output_dir)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "zero3"])
def test_two_process_sft_matches_one_process(launched, sft_config, tmp_path, mode):
    run_sft(
        sft_config(logging__output_dir=str(tmp_path / "single"), **SFT_SETTINGS), console=Console(file=io.StringIO())
    )
    single_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "single").state_dict()
    two = launched[mode, "sft"]

    single = read_metrics(tmp_path / "single")
    assert [r["step"] for r in two.records] == [r["step"] for r in single] == [1, 2, 3, 4]  # the main process logs once
    for a, b in zip(single, two.records):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), f"step {a['step']}"
        assert b["label_tokens"] == a["label_tokens"]  # the step's global count, not one process's share
    for name, tensor in two.weights[0].items():
        assert torch.equal(tensor, two.weights[1][name]), f"processes disagree on {name}"
        torch.testing.assert_close(tensor, single_weights[name], rtol=1e-4, atol=1e-5)
    assert latest_checkpoint(two.output_dir).name == "step-00000004"
    assert (two.output_dir / "config.json").is_file()


@pytest.mark.slow
def test_two_process_grpo_trains_and_keeps_processes_in_step(launched):
    run = launched["ddp", "plain-grpo"]
    for name, tensor in run.weights[0].items():
        assert torch.equal(tensor, run.weights[1][name]), f"processes disagree on {name}"
    assert [r["step"] for r in run.records][:2] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in run.records[:2])  # an update happened every step
    assert "eval_success" in run.records[0]
    assert latest_checkpoint(run.output_dir).name == "step-00000002"


@pytest.mark.slow
def test_two_process_seat_metrics_count_every_process_s_games(launched):
    """Each step's win, draw and loss rates are over the games of every process, not of one."""
    run = launched["ddp", "seats"]
    for record in run.records[:2]:
        # 2 tasks x 2 games x 2 seats (the policy plays both), one task on each process
        assert record["games"] == 8
        assert record["games/seat:solver"] == record["games/seat:verifier"] == record["games/vs:policy"] / 2 == 4
        assert sum(record[f"{o}_rate"] for o in OUTCOMES) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SHARDED_CASES))
def test_sharded_rl_matches_data_parallel(launched, tiny_model_dir, case):
    """Same seed, same processes: FSDP and ZeRO-3 shard what DDP replicates, so the runs must agree."""
    ddp = launched["ddp", case]
    start = AutoModelForCausalLM.from_pretrained(
        launched.split_model if case == SPLIT_MODEL else tiny_model_dir
    ).state_dict()
    if case == SPLIT_MODEL:  # the episodes really were split into rows, and trained packed
        assert all(r["rows_per_episode"] > 1 for r in ddp.records if "rows_per_episode" in r)
    for mode in ("fsdp", "zero3"):
        run = launched[mode, case]
        assert [r["step"] for r in run.records] == [r["step"] for r in ddp.records]
        for a, b in zip(ddp.records, run.records):
            assert b["reward"] == a["reward"], f"{mode} step {a['step']}: the rollouts differ"
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), f"{mode} step {a['step']}"
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), f"{mode} step {a['step']}"
            assert b["lr"] == pytest.approx(a["lr"]), f"{mode} step {a['step']}"
        for name, tensor in ddp.weights[0].items():
            if name not in start:  # a head made by the run: no starting point to measure a move from
                torch.testing.assert_close(run.weights[0][name], tensor, rtol=1e-4, atol=1e-5, msg=f"{mode} {name}")
                continue
            # Adam turns a float-rounding difference in a near-zero gradient into a step difference of
            # up to the learning rate, so the gap is judged against how far training moved the tensor
            # (measured: at most 0.4% of it; a shard that missed its update is off by the whole move)
            moved = float((tensor - start[name]).abs().max())
            gap = float((run.weights[0][name] - tensor).abs().max())
            assert gap <= 0.02 * moved + 1e-7, f"{mode} {name}: {gap:.2e} from DDP's weights, moved {moved:.2e}"
        # the checkpoint holds the gathered, whole weights in Hugging Face format
        saved = AutoModelForCausalLM.from_pretrained(run.output_dir).state_dict()
        for name, tensor in run.weights[0].items():
            torch.testing.assert_close(saved[name], tensor, msg=f"{mode} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "zero3"])
def test_a_non_finite_gradient_skips_the_update_in_every_mode(launched, mode):
    """A NaN loss in one micro-batch on process 0 makes the summed gradient NaN: every mode skips
    that update (DeepSpeed's engine by itself under ZeRO-3), counts it, and trains on as DDP does."""
    ddp, run = launched["ddp", "nan"], launched[mode, "nan"]
    skipped = [r.get("skipped_updates", 0) for r in ddp.records]
    assert max(skipped) == 1
    assert [r.get("skipped_updates", 0) for r in run.records] == skipped
    assert run.records[-1]["grad_norm"] == pytest.approx(ddp.records[-1]["grad_norm"], rel=1e-3)
    for name, tensor in ddp.weights[0].items():
        assert torch.isfinite(run.weights[0][name]).all(), name
        torch.testing.assert_close(run.weights[0][name], tensor, rtol=1e-4, atol=1e-5, msg=name)


FAIL_ON_RANK_1 = """
import os, sys
from omrl.config import load_config
from omrl.config.options import SftRunConfig
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


@pytest.mark.slow  # two processes under accelerate launch
def test_an_error_on_one_process_ends_the_run_instead_of_hanging(sft_config, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(to_yaml(sft_config(logging__output_dir=str(tmp_path / "run"))))
    (tmp_path / "fail.py").write_text(FAIL_ON_RANK_1)
    # a hang raises TimeoutExpired
    done = launch_two_processes(tmp_path, str(tmp_path / "fail.py"), str(config), timeout=120)
    assert done.returncode != 0
    assert "failed on process 1" in done.stderr


@pytest.mark.slow  # two processes under accelerate launch
def test_tasks_per_step_must_split_evenly_across_processes(tiny_model_dir, tmp_path):
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig

    config = tmp_path / "train.yaml"
    config.write_text(
        to_yaml(
            load_config(
                TrainRunConfig,
                "grpo",
                [
                    f"model.name={tiny_model_dir}",
                    "env.name=gridworld",
                    "tasks_per_step=3",
                    "steps=1",
                    f"logging.output_dir={tmp_path / 'run'}",
                ],
            )
        )
    )
    done = launch_two_processes(tmp_path, "-m", "omrl", "train", str(config))
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


@pytest.mark.parametrize(
    "setting, value, error",
    [
        ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2", "zero_stage: 2 is not supported under omrl's ZeRO-3; valid: 3"),
        ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu", "offload_optimizer_device: cpu .*valid: none"),
        ("ACCELERATE_DEEPSPEED_ZERO3_INIT", "true", "zero3_init: true .*valid: false"),
        ("ACCELERATE_DEEPSPEED_CONFIG_FILE", "ds.json", "deepspeed_config_file is not supported"),
        ("ACCELERATE_MIXED_PRECISION", "bf16", "mixed_precision: bf16 .*valid: no"),
        ("ACCELERATE_GRADIENT_CLIPPING", "1.0", "gradient_clipping: 1.0 .*set optim.max_grad_norm"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "gradient_accumulation_steps: 4 .*valid: 1, or leave it out"),
    ],
)
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
    from transformers import AutoModelForCausalLM

    from omrl.parallel import FSDP, Trainables

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters())
    process = object.__new__(FSDP)  # its optimizer-state check, without a process group
    process.owner = Trainables({"policy": model})
    names = [name for name, _ in process.owner.named_parameters()]
    saved = {"state": {}, "param_groups": [{"lr": 1e-3, "params": names[:-1] + ["critic.head.weight"]}]}
    with pytest.raises(
        ValueError,
        match=r"does not fit this run: 1 parameter group\(s\) against 1, "
        rf"missing \['{names[-1]}'\], unexpected \['critic.head.weight'\]",
    ):
        process.load_optimizer_state(optimizer, saved)


def test_zero3_refuses_other_weight_dtypes():
    from omrl.errors import ConfigError
    from omrl.parallel import zero3

    with pytest.raises(
        ConfigError, match="model.dtype=bfloat16 is not supported under ZeRO-3 .*valid: model.dtype=float32"
    ):
        zero3.check_options("bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RESUMED_CASES))
def test_sharded_run_resumes_exactly(launched, case):
    """A sharded run resumed from its step-2 checkpoint ends where the uninterrupted run ended."""
    mode = RESUMED_CASES[case][0]
    uninterrupted, resumed = launched[mode, case], launched[mode, f"{case}-resumed"]
    for name, tensor in uninterrupted.weights[0].items():
        torch.testing.assert_close(resumed.weights[0][name], tensor, rtol=0, atol=0, msg=name)
    assert resumed.records[-1]["step"] == 3
    assert resumed.records[-1]["loss"] == uninterrupted.records[-1]["loss"]


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
    from omrl.config.options import ModelConfig
    from omrl.errors import ConfigError
    from omrl.parallel import fsdp
    from omrl.training.model_setup import load_trainable_model

    lora_model, _ = load_trainable_model(ModelConfig(name=tiny_model_dir, lora_rank=4), "cpu")
    with pytest.raises(ConfigError, match="LoRA .* cannot be combined with FSDP"):
        fsdp.shard(lora_model)  # refused before any process group is needed
