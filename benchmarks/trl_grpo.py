"""omrl vs TRL: ``omrl train --algo grpo`` and TRL's ``GRPOTrainer`` on the same single-turn job, in one run.

    python3 -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install -c constraints-cpu.txt -r benchmarks/requirements-trl.txt
    python benchmarks/trl_grpo.py [--trl-python /tmp/trl-venv/bin/python] [--steps 3] [--rounds 2] [--json out.json]
    python benchmarks/trl_grpo.py --threads 2 --async-split 1,1   # and omrl with its generation process

Peer: TRL (pinned in ``benchmarks/requirements-trl.txt``), run from its own venv as a
subprocess, so TRL never becomes a dependency of omrl's. omrl runs as the real CLI
(``python -m omrl train --algo grpo``) in a subprocess of its own. Both sides must run the same torch
and transformers (the same kernels): when TRL's python has other versions than omrl's, the run stops
before measuring anything and names both.

The job, the same on both sides: the same model directory (``--model``, default the built-in
SmolLM2-135M-Instruct), one turn per episode (gridworld with ``env.max_turns=1``, react
template), the very same prompt ids (the first prompts omrl's recipe plays, captured from
``omrl.rollout.collect``; TRL gets them in the same order, unshuffled, and the worker checks
that TRL's tokenizer turns them back into the same ids), ``--tasks`` prompts a step x group
size 4, 32 completion tokens at temperature 1, lr 1e-5 constant, no KL (TRL's default
``beta=0``), one optimizer step per generation (on-policy), float32, ``--steps`` steps. The
reward, on both sides the same function of the completion's text (:func:`text_reward`: react
tags present once, plus 0.001 per character), registered with omrl as a reward plugin and
given to TRL as a reward function; the samples of a prompt practically always differ, so
neither side skips an update (omrl skips a step whose advantages are all 0; the table warns
if that happened). Gradient checkpointing is off on both sides (TRL's default is on:
``--trl-gradient-checkpointing`` turns it on).

Reported: each step's wall time (TRL: from a callback's step begin to step end; omrl: the
``step_time`` it logs), generation seconds (TRL: time in ``model.generate``; omrl: its
``rollout_time``, which also steps the env), peak RSS (TRL: the worker's VmHWM; omrl: the
``peak_rss_gb`` it logs, in GB of 1e9 bytes, shown here in GiB like TRL's), for ``--rounds``
rounds with the two sides alternating. The ratio is omrl's median step time / TRL's, per round (min and median
over rounds); the first step of each run is left out of the median when there are more.
Target: omrl <= 0.5x TRL's step time. On a miss, one more omrl run goes under cProfile and
the time of its main parts is printed.

``--async-split T,G`` adds a third side to every round: omrl with ``rollout.async_generation``
(``max_staleness=1``), its trainer on T threads and its generation process on G (``--threads``
stays the other two sides'; give them the same cores in all, e.g. ``--threads 2 --async-split 1,1``
on 2 cores). Its step time (the trainer's, waiting for episodes included) is compared with TRL's
and with omrl's synchronous run. Its peak RSS is the trainer process's alone: the generation
process holds a second copy of the model beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

try:
    from omrl.hookspecs import hookimpl
except ImportError:  # TRL's venv runs the TRL side of this file only

    def hookimpl(function):
        return function


TARGET = 0.5
TAGS = (r"^Think:", r"^Act:")
REWARD_NAME = "bench_text"


def text_reward(text: str) -> float:
    """The reward of one completion, on both sides: the share of react tags present exactly once,
    plus 0.001 per character (so the samples of a prompt practically always differ).

    >>> text_reward("Think: go\nAct: up")
    1.017
    """
    share = sum(len(re.findall(tag, text, re.M)) == 1 for tag in TAGS) / len(TAGS)
    return round(share + 0.001 * len(text), 10)


# -- the TRL side (runs in TRL's venv: no omrl imports here) ---------------------------------------
def vm_hwm() -> int:
    """This process's peak RSS in bytes (VmHWM: unlike ru_maxrss, not inherited from the parent)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def trl_reward(completions, **kwargs) -> list[float]:
    """TRL's calling convention for :func:`text_reward`."""
    return [text_reward(text) for text in completions]


def trl_settings(spec: dict) -> dict:
    """The GRPOConfig both comparisons give TRL: omrl's GRPO settings (no KL, one update a step,
    constant learning rate), on the CPU, without saving."""
    return dict(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=bool(spec.get("bf16", False)),  # bfloat16 autocast, float32 weights: as omrl's bf16=true
        report_to="none",
        disable_tqdm=True,
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["tasks"] * spec["group_size"],
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        temperature=1.0,
        top_p=1.0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )


def trl_versions() -> dict[str, str]:
    import torch
    import transformers
    import trl

    return {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


KERNEL_PACKAGES = ("torch", "transformers")  # the two sides must run these at the same versions


def kernel_mismatch(omrl: dict[str, str], trl: dict[str, str]) -> str | None:
    """Why a ratio of omrl's to TRL's times would not compare like with like, or None: the message
    names each of torch and transformers whose version differs between the two sides.

    >>> kernel_mismatch({"torch": "2.13.0", "transformers": "5.25.0"}, {"torch": "2.13.0", "transformers": "5.24.0"})
    'transformers 5.25.0 (omrl) vs 5.24.0 (TRL)'
    """
    differ = [
        f"{name} {omrl[name]} (omrl) vs {trl.get(name)} (TRL)"
        for name in KERNEL_PACKAGES
        if omrl[name] != trl.get(name)
    ]
    return "; ".join(differ) or None


def require_same_kernels(trl_python: str) -> dict[str, str]:
    """``trl_python``'s versions (:func:`trl_versions`); exits, naming both sides' versions, when its torch or
    transformers is not the one this python (omrl's) runs: a ratio across other kernels is no comparison."""
    import torch
    import transformers

    probe = (
        "import json, trl, torch, transformers\n"
        "print(json.dumps({m.__name__: m.__version__ for m in (trl, torch, transformers)}))"
    )
    done = subprocess.run([trl_python, "-c", probe], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{trl_python} cannot import trl, torch and transformers:\n{done.stderr[-2000:]}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    why = kernel_mismatch({"torch": torch.__version__, "transformers": transformers.__version__}, theirs)
    if why:
        raise SystemExit(
            f"refusing to compare: the TRL side ({trl_python}) runs other kernels than omrl's: {why}. Install the "
            "versions omrl's venv has into TRL's (benchmarks/requirements-trl.txt pins them)."
        )
    return theirs


def trl_worker(spec_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts, ids = spec["prompt_texts"], spec["prompt_ids"]
    same_ids = tokenizer(text=texts)["input_ids"] == ids  # exactly what GRPOTrainer does with text prompts
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)

    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.append({"start": time.perf_counter(), "generate_s": 0.0})

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1]["step_time"] = time.perf_counter() - steps[-1].pop("start")

    generate = model.generate

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            if steps:
                steps[-1]["generate_s"] += time.perf_counter() - start

    model.generate = timed_generate
    config = GRPOConfig(
        **trl_settings(spec),
        max_completion_length=spec["max_new_tokens"],
        gradient_checkpointing=spec["gradient_checkpointing"],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": texts}),
        callbacks=[StepTimer()],
    )
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    logged = [
        {k: v for k, v in row.items() if k in ("reward", "reward_std", "loss", "grad_norm")}
        for row in trainer.state.log_history
        if "reward" in row
    ]
    print(
        json.dumps(
            {
                "steps": steps,
                "train_s": train_s,
                "same_prompt_ids": same_ids,
                "logged": logged,
                "peak_rss": vm_hwm(),
                "versions": trl_versions(),
                "config": {
                    "gradient_checkpointing": config.gradient_checkpointing,
                    "loss_type": config.loss_type,
                    "optim": str(config.optim),
                    "beta": config.beta,
                },
            }
        )
    )


# -- the omrl side ---------------------------------------------------------------------------------
def omrl_overrides(
    args,
    model_dir: str,
    env: str = "gridworld",
    template: str = "react",
    max_turns: int = 1,
    reward: str = REWARD_NAME,
    extra: tuple = (),
) -> list[str]:
    """``omrl train``'s settings matching TRL's (``extra`` before the user's ``--omrl-arg``, which win)."""
    return [
        f"model.name={model_dir}",
        f"env.name={env}",
        f"env.template={template}",
        f"env.max_turns={max_turns}",
        f"generation.max_new_tokens={args.max_new_tokens}",
        "generation.temperature=1.0",
        "generation.top_p=1.0",
        f"group_size={args.group_size}",
        f"tasks_per_step={args.tasks}",
        f"steps={args.steps}",
        f"optim.learning_rate={args.lr}",
        "optim.lr_schedule=constant",
        "optim.warmup_steps=0",
        "algorithm.kl_coef=0.0",
        "ppo_epochs=1",
        "mini_batch_size=0",
        "eval_tasks=0",
        "model.dtype=float32",
        f"reward.weights={{{reward}: 1.0}}",
        "model.gradient_checkpointing=false",
        *extra,
        *args.omrl_arg,
    ]


class BenchRewardPlugin:
    """Registers :func:`text_reward` with omrl as ``bench_text`` (omrl's calling convention). A class of
    this module, so omrl's generation process (``--async-split``) can register it too."""

    @staticmethod
    def bench_text(episodes) -> list[list[float]]:
        return [[text_reward(turn.response) for turn in ep.turns] for ep in episodes]

    @hookimpl
    def register_rewards(self, register):
        register(REWARD_NAME, self.bench_text)


def omrl_worker(argv: list[str]) -> None:
    """``omrl train ARGV`` through omrl's own CLI, with the benchmark's reward registered first."""
    from omrl.cli import main as omrl_main
    from omrl.plugins import pm

    pm.register(BenchRewardPlugin(), name="benchmark.trl_grpo")
    omrl_main(["train", *argv])


def omrl_prompts(args, model_dir: str) -> list[list[int]]:
    """The prompt ids ``omrl train`` generates from, in the order it plays them (steps x tasks)."""
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig

    cfg = load_config(TrainRunConfig, "grpo", omrl_overrides(args, model_dir))
    ids, _, _ = played_prompts(cfg, model_dir, demonstration=cfg.env.demonstration)
    return ids


def played_prompts(cfg, model_dir: str, **collect_options) -> tuple[list[list[int]], list[list[dict]], list[int]]:
    """What ``omrl train`` with ``cfg`` plays first, in its order (steps x tasks), captured instead of
    sampled: the prompts' ids, their chat messages and the task ids."""
    from omrl import registry
    from omrl.backends.base import Backend, Generation
    from omrl.models import load_tokenizer
    from omrl.rollout import EnvPool, RolloutLimits, collect
    from omrl.training.rl_data import TaskOrder

    tokenizer = load_tokenizer(model_dir)
    pool = EnvPool(registry.envs.get(cfg.env.name), cfg.plugins.get(cfg.env.name, {}), name=cfg.env.name)
    order = TaskOrder(list(pool.probe().split_of(cfg.env.split)), cfg.seed)  # as omrl.training.online does
    tasks = [task for _ in range(cfg.steps) for task in order.take(cfg.tasks_per_step)]
    ids: list[list[int]] = []
    chats: list[list[dict]] = []

    class Capture(Backend):
        name = "capture"

        def generate(self, prompts, params, messages=None):
            ids.extend(list(p) for p in prompts)
            chats.extend([{"role": m["role"], "content": m["content"]} for m in chat] for chat in messages or [])
            return [Generation([self.eos_token_id], [0.0], "stop") for _ in prompts]

    collect(
        pool,
        registry.templates.get(cfg.env.template)(),
        tokenizer,
        tasks,
        backend=Capture(tokenizer),
        limits=RolloutLimits(max_new_tokens=cfg.generation.max_new_tokens, max_turns=1),
        **collect_options,
    )
    pool.close()
    return ids, chats, tasks


def run_omrl(args, model_dir: str, out_dir: str, profile_path: str | None = None, split: str = "") -> dict:
    """One ``omrl train`` run; with ``split`` ("T,G") asynchronous, T trainer and G generation threads."""
    threads, extra = args.threads, []
    if split:
        trainer, generation = split.split(",")
        threads = int(trainer)
        extra = ["rollout.async_generation=true", "rollout.max_staleness=1", f"rollout.generation_threads={generation}"]
    env = {"OMRL_NUM_THREADS": str(threads)}
    rows, wall = train_omrl(__file__, out_dir, [*omrl_overrides(args, model_dir), *extra], env, profile_path)
    skipped = sum(1 for row in rows if row.get("skipped_updates"))
    return {
        "steps": [
            {"step_time": row["step_time"], "generate_s": row.get("rollout_time", 0.0), "reward": row.get("reward")}
            for row in rows
        ],
        "peak_rss": max(row.get("peak_rss_gb", 0.0) for row in rows) * 1e9,
        "wall_s": wall,
        "skipped_steps": skipped,
    }


def train_omrl(
    script: str, out_dir: str, arguments: list[str], env: dict[str, str], profile_path: str | None = None
) -> tuple[list[dict], float]:
    """``script --omrl-worker``'s ``omrl train`` (under cProfile with ``profile_path``) with ``env`` added:
    its per-step metrics rows and its wall seconds."""
    command = [
        sys.executable,
        *(["-m", "cProfile", "-o", profile_path] if profile_path else []),
        script,
        "--omrl-worker",
        "--algo",
        "grpo",
        "--output-dir",
        out_dir,
        *arguments,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"omrl train failed:\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in Path(out_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row for row in rows if "step_time" in row], wall


def train_trl(
    script: str, args, spec: dict, out_dir: str, env: dict[str, str] | None = None, profile_path: str | None = None
) -> dict:
    """``script --trl-worker``'s TRL run of ``spec`` in ``args.trl_python`` (under cProfile with
    ``profile_path``) with ``env`` added: its report and wall seconds."""
    spec_path = Path(out_dir, "spec.json")
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps({**spec, "output_dir": out_dir}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads), **(env or {})}
    profiler = ["-m", "cProfile", "-o", profile_path] if profile_path else []
    start = time.perf_counter()
    done = subprocess.run(
        [args.trl_python, *profiler, script, "--trl-worker", str(spec_path)], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the TRL run failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {**report, "wall_s": wall}


def run_trl(args, spec: dict, out_dir: str) -> dict:
    return train_trl(__file__, args, spec, out_dir)


def steady(steps: list[dict], key: str = "step_time") -> float:
    """Median over the steps after the first (all of them when there is only one)."""
    values = [s[key] for s in steps]
    return statistics.median(values[1:] if len(values) > 1 else values)


def each_run(sides: list[str], runs: dict[str, list[dict]]) -> Iterator[tuple[str, int, dict, str]]:
    """The rows of a results table: each side's runs in turn, with the round and the step times as text."""
    for side in sides:
        for r, run in enumerate(runs[side]):
            yield side, r, run, " ".join(f"{s['step_time']:.1f}" for s in run["steps"])


def print_profile(side: str, part: dict) -> None:
    """A profiled run's step times, and per step the seconds of what each of its main parts calls."""
    times = " ".join(f"{t:.1f}" for t in part["profiled_step_times"])
    print(f"\n{side} under cProfile (step times {times} s); seconds per step, the profiler adds overhead:")
    for title, rows in part["per_step_s"].items():
        print(f"  {title}:")
        for label, seconds in rows:
            print(f"    {seconds:7.2f}  {label}")


def callees(stats, file: str, function: str, count: int) -> list[tuple[str, float]]:
    """The functions ``file:function`` calls directly, with the cumulative seconds spent in them on its
    behalf (cProfile's caller records), most first."""
    parents = [key for key in stats.stats if Path(key[0]).name == file and key[2] == function]
    out: dict[str, float] = {}
    for (path, line, name), (_, _, _, _, callers) in stats.stats.items():
        for parent in parents:
            if parent in callers:
                label = f"{Path(path).name}:{name}" if line else name
                out[label] = out.get(label, 0.0) + callers[parent][3]
    return sorted(out.items(), key=lambda item: item[1], reverse=True)[:count]


# where to look inside omrl's step: the recipe's loop, then the two parts that call into torch
PROFILED = (
    ("the train loop (rl.py:train) calls", "rl.py", "train"),
    ("the rollout loop (loop.py:collect) calls", "loop.py", "collect"),
    ("the optimizer step (parallel/base.py:optimizer_step) calls", "base.py", "optimizer_step"),
)
ONCE = "online.py:_finish"  # the final checkpoint and model, once per run


def profile_omrl(args, model_dir: str, tmp: str) -> dict:
    """One more omrl run under cProfile: per step, the seconds of what the loop and its main parts call."""
    import pstats

    path = str(Path(tmp, "omrl.prof"))
    run = run_omrl(args, model_dir, str(Path(tmp, "omrl-profiled")), profile_path=path)
    stats = pstats.Stats(path)
    steps = max(1, len(run["steps"]))

    def per_step(label: str, seconds: float) -> tuple[str, float]:
        return (f"{label} (once a run, not per step)", seconds) if label == ONCE else (label, seconds / steps)

    return {
        "per_step_s": {
            title: [per_step(*row) for row in callees(stats, file, function, 8)] for title, file, function in PROFILED
        },
        "profiled_step_times": [s["step_time"] for s in run["steps"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", default="/tmp/trl-venv/bin/python", help="python of TRL's own venv")
    parser.add_argument("--model", default="smollm2-135m", help="built-in name or local HF directory")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one run per side, order alternating")
    parser.add_argument("--tasks", type=int, default=2, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trl-gradient-checkpointing", action="store_true", help="TRL's own default")
    parser.add_argument("--omrl-arg", action="append", default=[], help="extra key=value for omrl train")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="no cProfile run on a miss")
    parser.add_argument("--json", type=Path, help="where the results go (default: benchmarks/results/trl_grpo.json)")
    parser.add_argument("--async-split", default="", help="T,G: also omrl async, T trainer + G generation threads")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    if sys.argv[1:2] == ["--omrl-worker"]:
        omrl_worker(sys.argv[2:])
        return
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return

    from omrl.models import load_tokenizer, resolve_model_path

    if not Path(args.trl_python).exists():
        raise SystemExit(f"no TRL python at {args.trl_python}; install it as this file's docstring says")
    require_same_kernels(args.trl_python)
    model_dir = resolve_model_path(args.model)
    prompt_ids = omrl_prompts(args, model_dir)
    tokenizer = load_tokenizer(model_dir)
    prompt_texts = [
        tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in prompt_ids
    ]
    spec = {
        "model_dir": model_dir,
        "prompt_texts": prompt_texts,
        "prompt_ids": prompt_ids,
        "steps": args.steps,
        "tasks": args.tasks,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr,
        "threads": args.threads,
        "gradient_checkpointing": args.trl_gradient_checkpointing,
    }

    sides = ["trl", "omrl", *(["omrl-async"] if args.async_split else [])]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    profile = None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:  # each round starts with another side
                out = str(Path(tmp, f"{side}-{r}"))
                if side == "trl":
                    runs[side].append(run_trl(args, spec, out))
                else:
                    split = args.async_split if side == "omrl-async" else ""
                    runs[side].append(run_omrl(args, model_dir, out, split=split))
        ratios = [steady(o["steps"]) / steady(t["steps"]) for o, t in zip(runs["omrl"], runs["trl"])]
        async_ratios = [
            steady(a["steps"]) / steady(t["steps"]) for a, t in zip(runs.get("omrl-async", []), runs["trl"])
        ]
        speedups = [steady(o["steps"]) / steady(a["steps"]) for a, o in zip(runs.get("omrl-async", []), runs["omrl"])]
        met = statistics.median(ratios) <= TARGET
        if not met and args.profile:
            profile = profile_omrl(args, model_dir, tmp)

    print(
        f"omrl train --algo grpo vs TRL {runs['trl'][0]['versions']['trl']} GRPOTrainer: {args.model}, "
        f"{args.tasks} prompts x {args.group_size} completions of <= {args.max_new_tokens} tokens a step, "
        f"lr {args.lr}, {args.steps} steps, {args.rounds} rounds, {args.threads} thread(s); "
        f"identical prompt ids in TRL: {all(t['same_prompt_ids'] for t in runs['trl'])}"
    )
    print(
        f"{'side':10s} {'round':>5s} {'step times s':>24s} {'median*':>8s} {'generate s/step':>16s} "
        f"{'peak RSS GiB':>13s} {'wall s':>7s} {'episodes/h':>10s}"
    )
    for side, r, run, times in each_run(sides, runs):
        print(
            f"{side:10s} {r:5d} {times:>24s} {steady(run['steps']):8.2f} "
            f"{statistics.mean(s['generate_s'] for s in run['steps']):16.2f} "
            f"{run['peak_rss'] / 2**30:13.2f} {run['wall_s']:7.1f} "
            f"{3600 * args.tasks * args.group_size / steady(run['steps']):10.0f}"
        )
    print(
        f"* median over the steps after the first.  omrl/TRL step time: min {min(ratios):.2f}, median "
        f"{statistics.median(ratios):.2f}  (target <= {TARGET}: {'met' if met else 'MISSED'})"
    )
    if async_ratios:
        print(
            f"omrl async ({args.async_split} threads) / TRL step time: min {min(async_ratios):.2f}, median "
            f"{statistics.median(async_ratios):.2f} (target <= {TARGET}); async speed-up over omrl's "
            f"synchronous run: median {statistics.median(speedups):.2f}x"
        )
    skipped = sum(run["skipped_steps"] for side in sides[1:] for run in runs[side])
    if skipped:
        print(f"warning: omrl skipped {skipped} update(s) (every advantage 0): those steps did less work than TRL's")
    if profile:
        print_profile("omrl", profile)
    from _results import save_comparison  # here: the TRL worker's venv has no omrl

    save_comparison(
        args,
        "trl_grpo",
        f"omrl step time <= {TARGET} x TRL's",
        {
            "prompt_lengths": [len(ids) for ids in prompt_ids],
            "runs": runs,
            "ratios": ratios,
            "met": met,
            "async_ratios": async_ratios,
            "async_speedups": speedups,
            "profile": profile,
        },
    )


if __name__ == "__main__":
    main()
