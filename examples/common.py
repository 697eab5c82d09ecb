"""What the learning examples share: the budget of the tool-learning ones, the settings of their SFT and
GRPO runs, the tool-learning ones' SFT stage and report, a stage's result kept on disk, the standard
error they report, their summary and command line, and how they save a figure.

The examples are scripts, not a package: each puts this folder on ``sys.path`` and imports from here.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from omrl.atomic import atomic_save_figure, atomic_write_text
from omrl.config import load_config
from omrl.config.options import SftRunConfig
from omrl.training.sft import run_sft


@dataclass
class ToolBudget:
    """A tool-learning example's model, how much work each stage does, and the GRPO settings."""

    model: str
    expert_episodes: int  # of each kind
    tool_share: float  # of the SFT data: the rest is the expert that answers at once
    sft_epochs: float
    sft_learning_rate: float
    grpo_steps: int
    tasks_per_step: int
    group_size: int
    grpo_learning_rate: float
    eval_tasks: int
    eval_samples: int = 4
    micro_batch_size: int = 8
    mini_batch_size: int = 0  # 0: one optimizer step per rollout
    ppo_epochs: int = 1
    kl_coef: float = 0.0


def sft_settings(out: Path, budget: Any, seed: int, dataset: str | Path, warmup_steps: int) -> list[str]:
    """The ``omrl sft`` overrides of the examples, from an example's ``Budget``: ``sft_epochs`` passes of
    ``budget.model`` over ``dataset`` at ``sft_learning_rate`` (``warmup_steps``, then cosine), one
    episode a row (no packing) of up to 1,024 tokens, ``micro_batch_size`` rows a forward pass. The
    model goes to ``out``, with no TensorBoard."""
    return [
        f"model.name={budget.model}",
        f"dataset={dataset}",
        f"logging.output_dir={out}",
        f"num_train_epochs={budget.sft_epochs}",
        f"optim.learning_rate={budget.sft_learning_rate}",
        "optim.lr_schedule=cosine",
        f"optim.warmup_steps={warmup_steps}",
        f"optim.micro_batch_size={budget.micro_batch_size}",
        "max_seq_length=1024",
        "packing=false",
        f"seed={seed}",
        "logging.tensorboard=false",
        "logging.logging_steps=50",
    ]


def grpo_settings(out: Path, budget: Any, seed: int, reward: str = "{goal: 1.0}", tasks_per_step: int = 0) -> list[str]:
    """The ``omrl train --algo grpo`` overrides of the examples, from an example's ``Budget``:
    ``grpo_steps`` steps of ``tasks_per_step`` tasks (the budget's unless given) x ``group_size`` samples
    at temperature 1, rewarded by ``reward``; ``grpo_learning_rate``, ``kl_coef`` and ``micro_batch_size``
    rows a forward pass; each sample's loss the mean over its tokens. Checkpoints go to ``out``, with no
    TensorBoard."""
    return [
        f"logging.output_dir={out}",
        "logging.tensorboard=false",
        f"steps={budget.grpo_steps}",
        f"tasks_per_step={tasks_per_step or budget.tasks_per_step}",
        f"group_size={budget.group_size}",
        f"algorithm.kl_coef={budget.kl_coef}",
        f"reward.weights={reward}",
        f"optim.learning_rate={budget.grpo_learning_rate}",
        f"optim.micro_batch_size={budget.micro_batch_size}",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
        "generation.temperature=1.0",
        f"seed={seed}",
    ]


def sft_on_both_experts(tool: Path, direct: Path, out: Path, budget: ToolBudget, seed: int) -> None:
    """``omrl sft`` of a tool-learning example on both experts' episodes (``tool``: the expert that calls
    the tool; ``direct``: the one that answers at once), ``tool_share`` of the draw from the tool's."""
    dataset = f"{tool}:{budget.tool_share},{direct}:{1 - budget.tool_share}"
    run_sft(load_config(SftRunConfig, None, sft_settings(out, budget, seed, dataset, warmup_steps=10)))


def show_tool_use(label: str, metrics: dict[str, Any], details: str) -> dict[str, Any]:
    """Print a tool-learning example's held-out ``metrics`` after ``label``: success with its standard
    error, the share of episodes that called the tool, the example's own ``details`` and env errors."""
    print(
        f"{label}: success {metrics['success']:.1%} +- {metrics['success_se']:.1%}, tool calls in "
        f"{metrics['tool_call_rate']:.1%} of episodes{details}; env errors {metrics['env_errors']}",
        flush=True,
    )
    return metrics


def stage(out: Path, name: str, run: Callable[[], Any]) -> Any:
    """Run a stage once: its result is kept in ``<out>/<name>.json`` and read back on a rerun."""
    path = out / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    result = run()
    atomic_write_text(path, json.dumps(result, indent=2))
    return result


def standard_error(values: list[float]) -> float:
    """The standard error of the mean of ``values`` (0 for fewer than two).

    >>> round(standard_error([0.0, 1.0, 1.0, 0.0]), 4)
    0.2887
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def write_summary(out: Path, summary: dict[str, Any], gain: float, se_kind: str = "SE") -> dict[str, Any]:
    """Write ``<out>/summary.json`` and print the success gain in standard errors and the minutes taken."""
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    print(f"success {gain:+.1%} ({summary['success_gain_in_se']:.1f} {se_kind}) in {summary['minutes']:.1f} minutes")
    return summary


def tool_example_arguments(doc: str, out: str, full: Any, quick: Any, share_help: str) -> tuple[Path, Any, int]:
    """The command line of a tool-learning example: ``--out``, ``--quick`` (``quick`` instead of
    ``full``), ``--seed`` and ``--tool-share`` (the share of SFT data that uses the tool)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-share", type=float, help=share_help)
    args = parser.parse_args()
    budget = quick if args.quick else full
    if args.tool_share is not None:
        budget = replace(budget, tool_share=args.tool_share)
    return args.out, budget, args.seed


def save_figure(fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (whole or not at all) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    atomic_save_figure(fig, path)
    plt.close(fig)
