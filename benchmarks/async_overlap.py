"""Synchronous vs asynchronous generation on the same cores, in one run: the default job's steps.

    python benchmarks/async_overlap.py [--steps 4] [--threads 2] [--json out.json] [key=value ...]

Runs `omrl train --algo grpo --env webshop` (the default job: SmolLM2 after WebShop SFT, 2 tasks x 2
samples a step; ``key=value`` overrides as on the command line, evaluation off) twice, each in a
fresh process:

1. synchronous: generation then update, both with ``--threads`` torch threads;
2. asynchronous: ``rollout.async_generation=true rollout.max_staleness=1``; the generation process
   and the trainer each get half the threads, so both sides use the same cores (``--split T,G``
   gives the trainer T threads and the generation process G instead).

Prints and writes (``benchmarks/results/async_overlap.json`` unless ``--json``) the wall time of
each run and its steady state: the steps after the first (the first pays for loading and has
nothing to overlap), as seconds a step, trained tokens a second (the tokens sampled in those
steps, over their seconds) and episodes an hour. The ratio is async / sync throughput. The
target is >= 1.5x. Overlap can at best hide the shorter side, generation or update, behind the
longer one, so the ceiling is (generation + update) / max(generation, update) at the threads
each side gets.

``--env-latency SECONDS`` measures the case overlap is for: an env that answers each step after that
long, served over HTTP (the AgentGym protocol, ``omrl env serve``'s server, in this process) and
played by learn_gridworld's quick SFT of ``tiny`` (made once into runs/search-budget/gridworld-sft; 4 tasks x 4
samples a step, up to 12 turns of 12 tokens, reward: the goal, which it reaches in some episodes). Env steps wait on the network, not
the cores, so the generation process can play the next step while the trainer updates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import yaml
from _results import default_json, machine, save_json

DEFAULT_JOB = ["--env", "webshop"]  # the default job: 2 tasks x 2 samples a step
LATENCY_JOB = [
    "--env",
    "agentgym",
    "tasks_per_step=4",
    "group_size=4",
    "env.max_turns=12",
    "env.template=react",
    "generation.max_new_tokens=12",
    "reward.weights={goal: 1.0}",
]  # fmt: skip; the model: learn_gridworld's quick SFT of tiny, which wins some episodes and loses others


def run(out: Path, threads: int, overrides: list[str], job: list[str]) -> dict:
    env = {**os.environ, "OMRL_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "omrl", "train", "--algo", "grpo", *job, "--output-dir", str(out)]
    started = time.perf_counter()
    subprocess.run([*command, *overrides], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = yaml.safe_load((out / "config.yaml").read_text())
    steady = records[1:]
    seconds = sum(r["step_time"] for r in steady)
    tokens = sum(r["generated_tokens"] for r in steady)
    episodes = len(steady) * config["tasks_per_step"] * config["group_size"]
    return {
        "wall_seconds": wall,
        "step_seconds": [r["step_time"] for r in records],
        "steady_seconds_per_step": seconds / len(steady),
        "steady_tokens_per_s": tokens / seconds,
        "steady_episodes_per_hour": episodes / seconds * 3600,
        "generation_wait_s": [r.get("generation_wait_s") for r in records],
        "rollout_time": [r.get("rollout_time") for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split in half when async)")
    parser.add_argument("--split", default="", help="async: the trainer's and the generation process's threads, T,G")
    parser.add_argument("--env-latency", type=float, default=0.0, help="seconds an env step takes (0: the default job)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    common = [f"steps={args.steps}", "eval_tasks=0", "logging.tensorboard=false", *args.overrides]
    half = max(1, args.threads // 2)
    trainer, generator = (int(n) for n in args.split.split(",")) if args.split else (half, half)
    ahead_overrides = [
        "rollout.async_generation=true",
        "rollout.max_staleness=1",
        f"rollout.generation_threads={generator}",
    ]
    with tempfile.TemporaryDirectory() as tmp, slow_env_server(args.env_latency) as job:
        sync = run(Path(tmp) / "sync", args.threads, common, job)
        ahead = run(Path(tmp) / "async", trainer, [*common, *ahead_overrides], job)
    ratio = ahead["steady_tokens_per_s"] / sync["steady_tokens_per_s"]
    result = {"steps": args.steps, "threads": args.threads, "async_threads": [trainer, generator]}
    result.update({"env_latency_s": args.env_latency, "job": job})
    result.update({"sync": sync, "async": ahead, "ratio": ratio})
    result["machine"] = machine(args.threads)
    for name, side in (("sync", sync), ("async", ahead)):
        print(
            f"{name:6} wall {side['wall_seconds']:7.1f} s   steady {side['steady_seconds_per_step']:6.1f} s/step   "
            f"{side['steady_tokens_per_s']:6.1f} tokens/s   {side['steady_episodes_per_hour']:6.0f} episodes/h"
        )
    print(f"async / sync throughput: {ratio:.2f}x (target >= 1.5)")
    path = args.json or default_json("async_latency" if args.env_latency else "async_overlap")
    save_json(path, result)
    print(f"wrote {path}")


@contextlib.contextmanager
def slow_env_server(latency: float) -> Iterator[list[str]]:
    """The job to run: the default one, or (``latency`` > 0) :data:`LATENCY_JOB` against gridworld
    served over HTTP from this process with every step taking ``latency`` seconds more."""
    if not latency:
        yield DEFAULT_JOB
        return
    from mixture_rollout import register_slow_envs
    from rich.console import Console
    from search_budget import gridworld_sft

    from omrl.serve import background_server, create_app

    register_slow_envs(latency)  # slow-gridworld: every step takes ``latency`` seconds longer
    # shared with benchmarks/search_budget.py and reward_models.py: made once
    model = gridworld_sft(
        Path(__file__).resolve().parents[1] / "runs" / "search-budget" / "gridworld-sft", 0, Console(stderr=True)
    )
    with background_server(create_app("slow-gridworld"), port=0) as url:
        yield [
            *LATENCY_JOB,
            f"--model={model}",
            f"plugins.agentgym.base_url={url}",
            "plugins.agentgym.env_name=slow-gridworld",
        ]


if __name__ == "__main__":
    main()
