"""Training on trees vs chains at equal generated tokens: GRPO on gridworld from the SFT model.

    python benchmarks/tree_vs_chain.py                       # what was measured (the defaults)
    python benchmarks/tree_vs_chain.py --chain-steps 1 --tree-steps 1 --eval-tasks 0   # tokens a step only

Both sides start from the gridworld SFT model that ``benchmarks/search_budget.py`` builds
(``--sft-dir``, reused when it is there) and use ``examples/learn_gridworld.py``'s GRPO
stage settings (learning rate, KL, mini-batches, two epochs, gamma, env and generation;
gradient checkpointing off, which changes the speed, not the numbers):

- chain: ``group_size`` sampled chains per task, ``algorithm.advantage=gigpo`` (the
  example's estimator: episode groups plus step-level groups of equal observations);
- tree: ``rollout.strategy=mcts`` (``group_size`` trees per task, each capped at
  ``rollout.budget`` generated tokens), ``algorithm.advantage=tree_grpo`` (Tree-GRPO: the
  task's leaves as the episode group plus the trees' branch points as step-level groups);
  a turn that several paths share is trained once.

"Equal generated tokens" counts every token the rollout sampled (the backend's
``decode_tokens``, which the step metrics do not log): a tree's tokens off its finished
paths count too. Steps per side are chosen so the totals match (``--chain-steps`` and
``--tree-steps``; measure a step of each with ``--eval-tasks 0`` first). Each final model
and the SFT model are then evaluated with ``omrl eval`` on the first ``--eval-tasks`` test
tasks: sampled (``--eval-samples`` episodes a task at temperature 1) and greedy. The
standard errors are over tasks (a task's samples are not independent): the std of the
per-task success divided by sqrt(tasks); a difference against SFT is paired by task.

Prints a table and writes the record, machine included, to ``--json`` (default
benchmarks/results/tree_vs_chain.json).

Measured here with the defaults (2 CPU cores shared with other jobs, load average 5-7, 23
minutes in all: 7.4 + 7.6 minutes of training, 8 of evaluation): chain 6 steps, 32,007
tokens; tree 7 steps, 33,654 tokens. Held-out success on 100 test tasks, sampled (4 a
task) / greedy: SFT 17.2 +- 2.3% / 6.0 +- 2.4%; chain 13.8 +- 2.1% / 3.0 +- 1.7%; tree
14.0 +- 2.2% / 3.0 +- 1.7%. Neither moved off the SFT model by as much as 2 standard errors
at this size (about 33k tokens, 7 updates), and tree - chain is +0.2 points (+0.2 SE).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from _results import default_json, machine, save_json

from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.threads import configure_threads
from omrl.training.rl import RLRecipe

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path):
    """A script (examples/, benchmarks/) as a module: they are not a package."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def side_overrides(args: argparse.Namespace, side: str) -> list[str]:
    """What differs between the two sides: how a step rolls out and which advantage credits it."""
    if side == "chain":
        return [f"group_size={args.chain_group}", f"algorithm.advantage={args.chain_advantage}"]
    return [
        f"group_size={args.tree_group}",
        f"rollout.strategy={args.tree_strategy}",
        f"rollout.budget={args.tree_budget}",
        "algorithm.advantage=tree_grpo",
    ]


def train_side(example, sft: Path, out: Path, steps: int, overrides: list[str], args: argparse.Namespace) -> dict:
    """GRPO from ``sft`` for ``steps`` steps with learn_gridworld's GRPO settings plus ``overrides``;
    per step: tokens generated (every sampled token, the backend's count), rows, success, seconds."""
    budget = example.FULL
    cfg = load_config(
        TrainRunConfig,
        "grpo",
        [
            f"model.name={sft}",
            *example.ENV,
            *example.GENERATION,
            f"logging.output_dir={out}",
            "logging.tensorboard=false",
            "logging.save_rollouts=false",
            "model.gradient_checkpointing=false",
            f"steps={steps}",
            f"tasks_per_step={args.tasks_per_step}",
            f"mini_batch_size={budget.mini_batch_size}",
            f"ppo_epochs={budget.ppo_epochs}",
            f"algorithm.kl_coef={budget.kl_coef}",
            f"algorithm.gamma={budget.gamma}",
            "eval_tasks=0",
            "reward.weights={goal: 1.0}",
            f"optim.learning_rate={budget.grpo_learning_rate}",
            "optim.micro_batch_size=16",
            "algorithm.loss_agg_mode=seq-mean-token-mean",
            "generation.temperature=1.0",
            f"seed={args.seed}",
            *overrides,
        ],
    )
    log: list[dict] = []
    generated: list[float] = []

    def on_step_end(step: int, metrics: dict[str, float]) -> None:
        row = {
            "step": step,
            "generated_tokens": generated[-1] if generated else 0.0,
            **{
                k: metrics[k]
                for k in (
                    "success",
                    "response_tokens",
                    "step_time",
                    "rollout_time",
                    "finished_paths",
                    "trained_token_share",
                    "skipped",
                )
                if k in metrics
            },
        }
        log.append(row)
        print(
            f"  step {step}: {row['generated_tokens']:.0f} tokens, rollout success {row.get('success', 0):.1%}, "
            f"{row.get('step_time', 0):.1f} s",
            flush=True,
        )

    recipe = RLRecipe(cfg, on_step_end=on_step_end)
    started = time.perf_counter()
    try:
        recipe.setup()
        backend = recipe.session.backend
        take_stats = backend.take_stats

        def counting_take_stats() -> dict[str, float]:  # the step's rollout stats, taken once per step
            stats = take_stats()
            generated.append(float(stats.get("decode_tokens", 0)))
            return stats

        backend.take_stats = counting_take_stats
        recipe.train()
    finally:
        recipe.cleanup()
    return {
        "overrides": overrides,
        "steps": steps,
        "generated_tokens": sum(r["generated_tokens"] for r in log),
        "train_seconds": time.perf_counter() - started,
        "per_step": log,
        "model": str(out),
    }


def held_out(model: Path, out: Path, args: argparse.Namespace, example) -> dict:
    """``omrl eval`` of ``model`` on the first ``eval_tasks`` test tasks, sampled and greedy: success,
    its standard error over tasks, and each task's success (for paired differences)."""
    result = {}
    for name, temperature, samples in (("sampled", 1.0, args.eval_samples), ("greedy", 0.0, 1)):
        report = out / f"eval-{name}.json"
        command = [
            "omrl",
            "eval",
            "--model",
            str(model),
            "--env",
            "gridworld",
            "--num-tasks",
            str(args.eval_tasks),
            "--samples",
            str(samples),
            "--report",
            str(report),
            *example.ENV[1:],
            *example.GENERATION,
            f"generation.temperature={temperature}",
            f"seed={args.seed}",
        ]
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        episodes = json.loads(report.read_text(encoding="utf-8"))["episodes"]
        per_task: dict[int, list[bool]] = {}
        for ep in episodes:
            per_task.setdefault(ep["task_id"], []).append(bool(ep["won"]))
        means = {task: sum(won) / len(won) for task, won in per_task.items()}
        result[name] = {
            **mean_se(list(means.values())),
            "per_task": means,
            "samples": samples,
            "eval_seconds": time.perf_counter() - started,
            "command": " ".join(command),
        }
    return result


def mean_se(values: list[float]) -> dict[str, float]:
    """Mean and its standard error (sample std / sqrt(n)).

    >>> {k: round(v, 4) for k, v in mean_se([0.0, 1.0, 1.0, 0.0]).items()}
    {'mean': 0.5, 'se': 0.2887}
    """
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "se": math.sqrt(var / n)}


def paired(a: dict, b: dict) -> dict[str, float]:
    """``a - b`` over the tasks both were evaluated on, with the paired standard error and its ratio."""
    tasks = sorted(set(a) & set(b), key=int)
    diff = mean_se([a[t] - b[t] for t in tasks])
    return {"diff": diff["mean"], "se": diff["se"], "z": diff["mean"] / diff["se"] if diff["se"] else 0.0}


def table(record: dict) -> str:
    """The README table: generated tokens, steps, train time, held-out success ± SE (and vs SFT)."""
    lines = [
        "| model | steps | tokens generated | train min | sampled success | greedy success |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in record["models"].items():
        ev = row.get("eval", {})
        cells = []
        for kind in ("sampled", "greedy"):
            if kind not in ev:
                cells.append("-")
                continue
            text = f"{100 * ev[kind]['mean']:.1f} ± {100 * ev[kind]['se']:.1f}%"
            vs = row.get("vs_sft", {}).get(kind)
            cells.append(text + (f" ({100 * vs['diff']:+.1f}, {vs['z']:+.1f} SE)" if vs else ""))
        train = row.get("train")
        steps, tokens, minutes = (
            (train["steps"], f"{train['generated_tokens']:,.0f}", f"{train['train_seconds'] / 60:.1f}")
            if train
            else ("-", "-", "-")
        )
        lines.append(f"| {name} | {steps} | {tokens} | {minutes} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chain-steps", type=int, default=6)
    parser.add_argument("--tree-steps", type=int, default=7)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--chain-group", type=int, default=8, help="chains per task (default: %(default)s)")
    parser.add_argument("--chain-advantage", default="gigpo", help="chain's estimator (default: %(default)s)")
    parser.add_argument("--tree-strategy", default="mcts", help="tree side's search (default: %(default)s)")
    parser.add_argument("--tree-group", type=int, default=2, help="trees per task (default: %(default)s)")
    parser.add_argument("--tree-budget", type=int, default=384, help="tokens per tree (default: %(default)s)")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out test tasks; 0: no evaluation")
    parser.add_argument("--eval-samples", type=int, default=4, help="sampled episodes per task (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-dir", type=Path, default=ROOT / "runs" / "search-budget" / "gridworld-sft")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "tree-vs-chain", help="run folders")
    parser.add_argument("--json", type=Path, default=default_json("tree_vs_chain"), help="where the record goes")
    args = parser.parse_args()

    threads = configure_threads()  # as the omrl commands do: a busy machine must not be oversubscribed
    from rich.console import Console

    example = load_script(ROOT / "examples" / "learn_gridworld.py")
    sft = load_script(ROOT / "benchmarks" / "search_budget.py").gridworld_sft(args.sft_dir, args.seed, Console())
    record = {
        "benchmark": "tree_vs_chain",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine(threads),
        "models": {},
    }
    models = {"sft": {"path": sft}}
    for side, steps in (("chain", args.chain_steps), ("tree", args.tree_steps)):
        print(f"{side}: {steps} GRPO steps ({' '.join(side_overrides(args, side))})", flush=True)
        train = train_side(example, sft, args.out / side, steps, side_overrides(args, side), args)
        print(
            f"{side}: {train['generated_tokens']:,.0f} tokens generated in {train['train_seconds'] / 60:.1f} min",
            flush=True,
        )
        models[side] = {"path": args.out / side, "train": train}
    for name, row in models.items():
        if args.eval_tasks:
            out = args.out / f"eval-{name}"
            out.mkdir(parents=True, exist_ok=True)
            row["eval"] = held_out(row["path"], out, args, example)
        record["models"][name] = {k: str(v) if isinstance(v, Path) else v for k, v in row.items()}
    for name, row in record["models"].items():
        if name != "sft" and "eval" in row:
            row["vs_sft"] = {
                kind: paired(row["eval"][kind]["per_task"], record["models"]["sft"]["eval"][kind]["per_task"])
                for kind in ("sampled", "greedy")
            }
    if args.eval_tasks and {"chain", "tree"} <= set(record["models"]):
        record["tree_minus_chain"] = {
            kind: paired(
                record["models"]["tree"]["eval"][kind]["per_task"], record["models"]["chain"]["eval"][kind]["per_task"]
            )
            for kind in ("sampled", "greedy")
        }
    save_json(args.json, record)
    print(table(record))
    for kind, d in record.get("tree_minus_chain", {}).items():
        print(f"tree - chain ({kind}): {100 * d['diff']:+.1f} points, {d['z']:+.1f} SE (paired by task)")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
