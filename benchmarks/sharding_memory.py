"""Training memory per process: data parallel (ddp.yaml) vs FSDP (fsdp.yaml) vs ZeRO-3 (zero3.yaml), in one run.

    python benchmarks/sharding_memory.py [--model smollm2-135m] [--processes 2] [--epochs 1] [--json out.json]

Runs the same short ``omrl sft`` job under ``accelerate launch`` with each config and
reports, per process, what the training state takes: the weights it holds, their
gradients (one per trainable weight) and the AdamW state, counted from the tensors
themselves (the local shard under FSDP and ZeRO-3; under ZeRO-3 the optimizer column also
holds DeepSpeed's float32 master copy of the weight partition), plus the peak resident
memory of the process during training and after saving the final model (the sharded
modes gather the whole weights on the main process to save them). The peaks also hold
what all modes share (activations, the model as loaded before it is sharded, Python and
torch), so their ratios are closer to 1 than the state's.

Prints the table and writes the record (every rank's report, the table in MiB, the ratios to data
parallel, and the machine) to ``--json`` (default ``benchmarks/results/sharding_memory.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import default_json, machine, save_json

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def local_bytes(tensor) -> int:
    """Bytes this process holds for ``tensor`` (its shard when it is an FSDP DTensor or a ZeRO-3 parameter)."""
    from omrl.parallel import fsdp

    local = tensor.to_local() if fsdp.is_sharded(tensor) else getattr(tensor, "ds_tensor", tensor)
    return local.numel() * local.element_size()


def training_state(recipe) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer state this process holds."""
    params = list(recipe.model.parameters())
    optimizer = sum(
        local_bytes(v)
        for state in recipe.optimizer.state.values()
        for v in state.values()
        if getattr(v, "dim", lambda: 0)() > 0
    )
    if recipe.strategy.name == "zero3":  # DeepSpeed keeps gradient partitions and float32 masters apart
        zero = recipe.strategy.engine.optimizer
        gradients = local_bytes(zero.grad_partitions_flat_buffer)
        optimizer += sum(local_bytes(t) for t in zero.fp32_partitioned_groups_flat)
    else:
        gradients = sum(local_bytes(p) for p in params if p.requires_grad)
    return {"weights": sum(local_bytes(p) for p in params), "gradients": gradients, "optimizer": optimizer}


def worker(config_path: str, report_dir: str) -> None:
    """Run the SFT job in this process and write what it held to ``report_dir``."""
    from omrl.config import load_config
    from omrl.config.options import SftRunConfig
    from omrl.training.sft import SftRecipe

    def peak_rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is in KiB

    peak = {}

    def after_step(step, metrics):  # peak so far, before the final model is gathered and saved
        peak["train"] = peak_rss()

    recipe = SftRecipe(load_config(SftRunConfig, config_path), on_step_end=after_step)
    try:
        recipe.setup()
        recipe.train()
        report = {**training_state(recipe), "peak_rss": peak["train"], "peak_rss_with_save": peak_rss()}
        Path(report_dir, f"rank{recipe.strategy.rank}.json").write_text(json.dumps(report))
    finally:
        recipe.cleanup()


def conversations(count: int) -> list[dict]:
    """Short agent conversations, enough for a few SFT steps."""
    return [
        {
            "conversations": [
                {"from": "human", "value": f"You are in room {i}. The key is in room {i + 1}. What do you do?"},
                {"from": "gpt", "value": f"Thought: the key is next door.\nAction: go to room {i + 1}"},
                {"from": "human", "value": "You see the key."},
                {"from": "gpt", "value": "Thought: take it.\nAction: take key"},
            ]
        }
        for i in range(count)
    ]


def threads_per_process(args) -> int:
    """Each process's torch threads: the cores shared out among the processes."""
    return max(1, os.cpu_count() // args.processes)


def run_mode(mode: str, args, work: Path) -> list[dict]:
    from omrl.config import load_config, to_yaml
    from omrl.config.options import SftRunConfig

    run_dir = work / mode
    run_dir.mkdir()
    cfg = load_config(
        SftRunConfig,
        None,
        [
            f"model.name={args.model}",
            f"dataset={work / 'data.jsonl'}",
            f"num_train_epochs={args.epochs}",
            "optim.micro_batch_size=2",
            f"optim.gradient_accumulation_steps={args.processes}",
            "max_seq_length=256",
            f"logging.output_dir={run_dir / 'run'}",
            "logging.tensorboard=false",
            "logging.save_steps=0",
        ],
    )
    config_path = run_dir / "sft.yaml"
    config_path.write_text(to_yaml(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(args))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "configs" / "accelerate" / f"{mode}.yaml"),
            "--num_processes",
            str(args.processes),
            __file__,
            "--worker",
            str(config_path),
            str(run_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(args.processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=1.0, help="over 2 x processes x 2 conversations")
    parser.add_argument("--json", type=Path, default=default_json("sharding_memory"), help="where the record goes")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "REPORT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(4 * args.processes)))
        reports = {mode: run_mode(mode, args, work) for mode in ("ddp", "fsdp", "zero3")}

    keys = ("weights", "gradients", "optimizer")
    columns = (*keys, "state", "peak_rss", "peak_rss_with_save")
    print(f"{args.model}, {args.processes} processes: MiB held by the most loaded process")
    print(f"{'':10} {'weights':>9} {'grads':>9} {'AdamW':>9} {'state':>9} {'peak RSS':>9} {'+ save':>9}")
    rows = {}
    for mode, per_rank in reports.items():
        most = {k: max(r[k] for r in per_rank) for k in columns if k != "state"}
        most["state"] = max(sum(r[k] for k in keys) for r in per_rank)
        rows[mode] = most
        print(f"{mode:10} " + " ".join(f"{most[k] / MIB:9.1f}" for k in columns))
    ratios = {
        mode: {k: rows[mode][k] / rows["ddp"][k] for k in ("state", "peak_rss", "peak_rss_with_save")}
        for mode in ("fsdp", "zero3")
    }
    for mode, ratio in ratios.items():
        print(
            f"{mode} / ddp: state {ratio['state']:.2f}, peak RSS in training {ratio['peak_rss']:.2f}, "
            f"with the final save {ratio['peak_rss_with_save']:.2f}"
        )
    save_json(
        args.json,
        {
            "benchmark": "sharding_memory",
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "worker"},
            "machine": machine(threads_per_process(args)),
            "mib_most_loaded_process": {mode: {k: v / MIB for k, v in row.items()} for mode, row in rows.items()},
            "ratios_to_ddp": ratios,
            "per_rank_bytes": reports,
        },
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
