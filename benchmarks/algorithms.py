"""A learning table: RL algorithms at the same budget, on gridworld from the same SFT model.

    python benchmarks/algorithms.py                       # every arm, the default budget (~45 min)
    python benchmarks/algorithms.py --arms grpo,rloo      # some arms (a rerun resumes: see below)
    python benchmarks/algorithms.py --smoke --arms grpo,rloo --out /tmp/algos   # a few minutes

Stage 1 builds the start of every arm as ``examples/learn_gridworld.py`` does (its expert data
and SFT stage, imported from the example, at its quick size by default): the ``tiny`` model
after SFT on the env's BFS expert. Stage 2 trains each arm from that model with the example's
GRPO stage (its env, generation, learning rate, KL, mini-batches, two epochs, gamma; reward:
reaching the goal) and the same steps, tasks a step, samples a task and seed; only the
``algorithm`` keys below differ:

- grpo: ``advantage=grpo``, the episode's return normalised in its group (Shao et al. 2024).
- dr_grpo: ``advantage=dr_grpo``, ``loss_agg_mode=seq-mean-token-sum-norm`` (Liu et al. 2025).
- rloo: ``advantage=rloo``, the leave-one-out baseline (Ahmadian et al. 2024).
- gigpo: ``advantage=gigpo``, episode plus step-level groups: the example's default.
- gspo: ``advantage=grpo``, ``policy_loss=gspo``, clip 3e-4 / 4e-4 (Zheng et al. 2025).
- cispo: ``advantage=grpo``, ``policy_loss=cispo``, IS weight clipped to [0, 1.28] (MiniMax-M1).
- dapo: ``advantage=grpo``, ``policy_loss=clip_higher``, ``dynamic_sampling=true`` (Yu et al. 2025).
- ppo: the ``ppo`` preset's algorithm section (``name=ppo``, ``advantage=gae``, value head).
- distill: on-policy distillation into the SFT model from a stronger tiny model, the grpo
  arm's result by default (``--teacher``): ``teacher=<model>``, ``teacher_coef=1``, and
  ``advantage=reinforce_plus_plus`` with ``gamma=0`` so the teacher's per-token reward stays
  per token (as omrl/training/distillation.py advises); the goal reward stays. It runs after the
  grpo arm, which it adds when that has no result yet. The grpo row shows whether the teacher
  is in fact stronger than the SFT model.

An arm that fails is recorded as not run, with the reason, and the others go on.

Each model is evaluated on the first ``eval_tasks`` held-out test tasks, seeded the same:
sampled (``eval_samples`` episodes a task at temperature 1, the policy RL optimises), with the
standard error over tasks of each task's mean success (a task's samples are not independent),
and greedy (one episode a task), with sqrt(p (1 - p) / n). "vs grpo" is the sampled
difference to the grpo arm; it is called a difference only when it exceeds twice the
combined standard error sqrt(se1^2 + se2^2), else "within noise". That error is evaluation
noise only: each arm is one training run (one seed), so run-to-run noise comes on top and
small differences that pass the test can still be luck. "minutes" is the training's wall time
(evaluation not included) on a machine others may be using: the JSON keeps its load average.

Resumable: the SFT model and each arm's result go to ``--out`` (``rows/<arm>.json``); a rerun
skips what is there (an arm that did not run is tried again) and refuses results of another
budget. The table of every result in ``--out`` is printed and written to ``--json``
(default benchmarks/results/algorithms.json; with ``--smoke``, ``<out>/algorithms.json``) and
beside it as ``.md``.

Timings here (2 CPU cores shared with other jobs, load average 0.1-2): the smoke budget of
every arm (``--smoke``, 2 steps x 4 tasks x 4 samples, evaluations of 8 tasks) took 3.7 minutes
in all: SFT 6 s; training 14-24 s an arm (grpo 14, gigpo 17, rloo 18, gspo 18, cispo 19, ppo 20,
distill 21, dr_grpo 24) and 29 s for dapo (its dynamic sampling drew 4 extra rollouts a step:
the smoke model never wins, so every group is uniform); each evaluation 2-7 s. The smoke's SFT
model learns no reply format, so each episode runs all 12 turns; the update is most of a step
(about 0.37 s an episode, two epochs), the rollout 0.15 s an episode in batches of 16.

The default budget was sized from those rates and the quick SFT model's earlier runs
(``benchmarks/tree_vs_chain.py``'s chain side, about 0.4 s a training episode), not run whole:
512 training episodes an arm (8 steps x 8 tasks x 8 samples, 64 optimizer steps) take about
3.5 minutes; dapo up to twice that, ppo and distill about 1.15x; ten evaluations of 320
episodes about 0.5 minutes each; expert data and SFT about 3 minutes. In all about 45 minutes
for every arm (an estimate: 40-50). The models and results go to ``runs/algorithms``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from _results import default_json, machine, save_json
from search_budget import learn_gridworld
from tree_vs_chain import mean_se

from omrl.atomic import atomic_write_text
from omrl.config.loading import read_preset
from omrl.env_errors import measured
from omrl.threads import configure_threads
from omrl.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    """One row of the table: the ``algorithm`` overrides on top of the example's GRPO stage."""

    name: str
    what: str
    overrides: tuple[str, ...]


def ppo_overrides() -> tuple[str, ...]:
    """The ``ppo`` preset's algorithm section (name, advantage, policy loss, gamma, lambda) as overrides."""
    return tuple(f"algorithm.{key}={value}" for key, value in read_preset("ppo")["algorithm"].items())


ARMS = {
    arm.name: arm
    for arm in (
        Arm("grpo", "GRPO: episode return normalised in its group", ("algorithm.advantage=grpo",)),
        Arm(
            "dr_grpo",
            "Dr. GRPO: no std division, constant length normaliser",
            ("algorithm.advantage=dr_grpo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"),
        ),
        Arm("rloo", "RLOO: leave-one-out baseline", ("algorithm.advantage=rloo",)),
        Arm("gigpo", "GiGPO: episode + step-level groups (the example's)", ("algorithm.advantage=gigpo",)),
        Arm(
            "gspo",
            "GSPO: sequence-level ratio, clip 3e-4/4e-4",
            (
                "algorithm.advantage=grpo",
                "algorithm.policy_loss=gspo",
                "algorithm.clip_ratio_low=0.0003",
                "algorithm.clip_ratio_high=0.0004",
            ),
        ),
        Arm(
            "cispo",
            "CISPO: clipped IS weight on every token",
            (
                "algorithm.advantage=grpo",
                "algorithm.policy_loss=cispo",
                "algorithm.clip_ratio_low=1.0",
                "algorithm.clip_ratio_high=0.28",
            ),
        ),
        Arm(
            "dapo",
            "DAPO: clip-higher + dynamic sampling",
            ("algorithm.advantage=grpo", "algorithm.policy_loss=clip_higher", "algorithm.dynamic_sampling=true"),
        ),
        Arm("ppo", "PPO: value head + GAE (the ppo preset)", ppo_overrides()),
        Arm(
            "distill",
            "on-policy distillation from the grpo model",
            # the dense per-token reward kept dense (omrl/training/distillation.py); + algorithm.teacher=<model>
            ("algorithm.advantage=reinforce_plus_plus", "algorithm.gamma=0", "algorithm.teacher_coef=1.0"),
        ),
    )
}
SFT_ROW = "sft"


@dataclass
class Settings:
    """The budget: SFT size, the RL stage every arm gets, and the evaluation."""

    expert_episodes: int
    sft_epochs: float
    steps: int
    tasks_per_step: int
    group_size: int
    eval_tasks: int
    eval_samples: int
    # the example's Budget defaults the runs take (EXAMPLE_KEYS), recorded in the JSON
    example: dict = field(default_factory=dict)


EXAMPLE_KEYS = ("sft_learning_rate", "grpo_learning_rate", "mini_batch_size", "ppo_epochs", "kl_coef", "gamma")


DEFAULT = Settings(
    expert_episodes=300, sft_epochs=4.0, steps=8, tasks_per_step=8, group_size=8, eval_tasks=64, eval_samples=4
)
SMOKE = Settings(
    expert_episodes=48, sft_epochs=2.0, steps=2, tasks_per_step=4, group_size=4, eval_tasks=8, eval_samples=2
)


def example_budget(example, settings: Settings):
    """The example's Budget for these settings; no evaluation inside the runs (this file evaluates)."""
    return example.Budget(
        expert_episodes=settings.expert_episodes,
        sft_epochs=settings.sft_epochs,
        grpo_steps=settings.steps,
        tasks_per_step=settings.tasks_per_step,
        group_size=settings.group_size,
        eval_tasks=0,
        eval_every=0,
    )


def binomial_se(p: float, n: int) -> float:
    """sqrt(p (1 - p) / n): the standard error of a rate of ``n`` independent trials.

    >>> round(binomial_se(0.5, 100), 3)
    0.05
    """
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def held_out(model: str, example, settings: Settings, seed: int) -> dict:
    """Success of ``model`` on the first ``eval_tasks`` test tasks as the example's
    ``held_out_success`` measures it, kept per task: sampled (``eval_samples`` a task at
    temperature 1; SE over tasks) and greedy (one a task; binomial SE)."""
    result = {}
    for name, temperature, samples in (("sampled", 1.0, settings.eval_samples), ("greedy", 0.0, 1)):
        episodes = example.held_out_episodes(model, settings.eval_tasks, seed, temperature, samples)
        per_task: dict[int, list[bool]] = {}
        for ep in measured(episodes):  # an env failure is neither a win nor a loss
            per_task.setdefault(ep.task_id, []).append(bool(ep.won))
        means = {str(task): sum(won) / len(won) for task, won in per_task.items()}
        stats = mean_se(list(means.values()))
        if name == "greedy":
            stats["se"] = binomial_se(stats["mean"], len(means))
        result[name] = {**stats, "tasks": len(means), "samples": samples, "per_task": means}
    return result


def train_arm(arm: Arm, example, sft: Path, out: Path, settings: Settings, seed: int, teacher: str) -> dict:
    """The example's GRPO stage from ``sft`` with ``arm``'s overrides into ``out``: wall time and
    the per-step rollout success and reward."""
    overrides = list(arm.overrides)
    if arm.name == "distill":
        if not (Path(teacher) / "config.json").exists():
            raise FileNotFoundError(f"no teacher model in {teacher} (run the grpo arm first, or pass --teacher)")
        overrides.append(f"algorithm.teacher={teacher}")
    if out.exists():  # a run that stopped: its checkpoints would make the recipe refuse a fresh start
        shutil.rmtree(out)
    started = time.perf_counter()
    example.grpo_stage(sft, out, example_budget(example, settings), seed, overrides=tuple(overrides))
    seconds = time.perf_counter() - started
    records = read_metrics(out)
    return {
        "overrides": overrides,
        "train_seconds": seconds,
        "rollout_success": [r.get("success") for r in records],
        "reward": [r.get("reward") for r in records],
        "step_seconds": [r.get("step_time") for r in records],
    }


def sft_model(out: Path, example, settings: Settings, seed: int) -> tuple[Path, dict]:
    """Stage 1: the expert data and SFT model in ``out`` and the SFT model's evaluation, made once."""
    row_path = out / "rows" / f"{SFT_ROW}.json"
    sft = out / "sft"
    if row_path.exists():
        row = check_budget(row_path, settings)
        print(f"sft: reusing {sft} ({row['train_seconds'] / 60:.1f} min when trained)", flush=True)
        return sft, row
    budget = example_budget(example, settings)
    print(f"sft: {settings.expert_episodes} expert episodes, {settings.sft_epochs:g} epochs into {sft}", flush=True)
    if sft.exists():
        shutil.rmtree(sft)
    started = time.perf_counter()
    data = example.expert_data(out / "expert.parquet", settings.expert_episodes)
    example.sft_stage(data, sft, budget, seed)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    evaluation = held_out(str(sft), example, settings, seed)
    row = {
        "arm": SFT_ROW,
        "what": "the SFT model every arm starts from",
        "status": "ok",
        "model": str(sft),
        "train_seconds": seconds,
        "eval_seconds": time.perf_counter() - started,
        "settings": dataclasses.asdict(settings),
        **evaluation,
    }
    save_json(row_path, row)
    print(f"sft: {seconds / 60:.1f} min; {success_text(row)}", flush=True)
    return sft, row


def run_arm(arm: Arm, out: Path, example, sft: Path, settings: Settings, seed: int, teacher: str) -> dict:
    """Stage 2 for one arm, unless ``rows/<arm>.json`` holds its result: train, evaluate, record.
    An arm that fails is recorded as not run, with the error."""
    row_path = out / "rows" / f"{arm.name}.json"
    if row_path.exists():
        row = check_budget(row_path, settings)
        if row["status"] == "ok":
            print(f"{arm.name}: reusing {row_path}", flush=True)
            return row
    print(f"{arm.name}: {' '.join(arm.overrides)}", flush=True)
    what = (
        arm.what if arm.name != "distill" or teacher == str(out / "grpo") else f"on-policy distillation from {teacher}"
    )
    row = {"arm": arm.name, "what": what, "settings": dataclasses.asdict(settings), "model": str(out / arm.name)}
    try:
        row.update(train_arm(arm, example, sft, out / arm.name, settings, seed, teacher))
        started = time.perf_counter()
        row.update(held_out(str(out / arm.name), example, settings, seed))
        row["eval_seconds"] = time.perf_counter() - started
        row["status"] = "ok"
        print(f"{arm.name}: {row['train_seconds'] / 60:.1f} min of training; {success_text(row)}", flush=True)
    except Exception as exc:  # a method not there yet (or broken): recorded, and the other arms go on
        row.update(
            status="not run",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=-6).splitlines(),
        )
        print(f"{arm.name}: not run: {row['error']}", flush=True)
    save_json(row_path, row)
    return row


def check_budget(path: Path, settings: Settings) -> dict:
    """The row in ``path``, refused when it was measured with other settings."""
    row = json.loads(path.read_text(encoding="utf-8"))
    if row.get("settings") != dataclasses.asdict(settings):
        raise SystemExit(
            f"{path} was measured with {row.get('settings')}, not {dataclasses.asdict(settings)}: "
            "use another --out (or delete it) to start over"
        )
    return row


def success_text(row: dict) -> str:
    return (
        f"sampled {100 * row['sampled']['mean']:.1f} ± {100 * row['sampled']['se']:.1f}%, "
        f"greedy {100 * row['greedy']['mean']:.1f} ± {100 * row['greedy']['se']:.1f}%"
    )


def versus(row: dict, base: dict) -> dict:
    """``row - base`` for sampled and greedy success: the difference, the combined standard error
    sqrt(se1^2 + se2^2), and whether the difference exceeds twice it.

    >>> v = versus({"sampled": {"mean": 0.5, "se": 0.03}, "greedy": {"mean": 0.4, "se": 0.04}},
    ...            {"sampled": {"mean": 0.4, "se": 0.04}, "greedy": {"mean": 0.4, "se": 0.03}})
    >>> round(v["sampled"]["diff"], 3), round(v["sampled"]["se"], 3), v["sampled"]["beyond_noise"]
    (0.1, 0.05, False)
    """
    out = {}
    for kind in ("sampled", "greedy"):
        diff = row[kind]["mean"] - base[kind]["mean"]
        se = math.hypot(row[kind]["se"], base[kind]["se"])
        out[kind] = {"diff": diff, "se": se, "beyond_noise": abs(diff) > 2 * se}
    return out


def table(record: dict) -> str:
    """The markdown table of ``record``'s rows, then which differences to grpo are within noise."""
    lines = [
        "| arm | what it is | sampled success ± SE | greedy ± SE | vs grpo (sampled) | minutes |",
        "|---|---|---|---|---|---|",
    ]
    within, beyond = [], []
    for row in record["rows"]:
        if row["status"] != "ok":
            reason = row["error"].splitlines()[0][:90].replace("|", "/")
            lines.append(f"| {row['arm']} | {row['what']} | not run: {reason} | - | - | - |")
            continue
        vs = row.get("vs_grpo", {}).get("sampled")
        if vs is None:
            cell = "-"
        elif vs["beyond_noise"]:
            cell = f"{100 * vs['diff']:+.1f} ({abs(vs['diff']) / vs['se']:.1f} SE)"
            beyond.append(f"{row['arm']} ({100 * vs['diff']:+.1f})")
        else:
            cell = f"{100 * vs['diff']:+.1f}, within noise"
            within.append(row["arm"])
        lines.append(
            f"| {row['arm']} | {row['what']} | {100 * row['sampled']['mean']:.1f} ± {100 * row['sampled']['se']:.1f}% "
            f"| {100 * row['greedy']['mean']:.1f} ± {100 * row['greedy']['se']:.1f}% | {cell} "
            f"| {row['train_seconds'] / 60:.1f} |"
        )
    s = record["settings"]
    lines += [
        "",
        f"Same budget per arm: {s['steps']} steps x {s['tasks_per_step']} tasks x {s['group_size']} samples, seed "
        f"{record['seed']}, from the SFT model ({s['expert_episodes']} expert episodes, {s['sft_epochs']:g} epochs; "
        f"its minutes are the SFT's). Held-out: {s['eval_tasks']} test tasks, {s['eval_samples']} sampled a task "
        "(SE over tasks) and 1 greedy (binomial SE). Minutes: training wall time.",
    ]
    if within or beyond:
        lines.append(
            "Against grpo (sampled; a difference counts beyond twice the combined SE, and one training run an arm "
            "adds noise the SE does not hold): "
            + (f"within noise: {', '.join(within)}" if within else "none within noise")
            + (f"; beyond: {', '.join(beyond)}." if beyond else "; no arm differs beyond noise.")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="a tiny budget (a few minutes for two arms): the test's")
    parser.add_argument("--out", type=Path, help="models and per-arm results (default: runs/algorithms[-smoke])")
    parser.add_argument(
        "--json",
        type=Path,
        help="the record (default: benchmarks/results/algorithms.json; "
        "with --smoke, <out>/algorithms.json); the table goes beside it as .md",
    )
    parser.add_argument("--teacher", help="distill's teacher model (default: the grpo arm's model in --out)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; valid: {', '.join(ARMS)}")
    if "distill" in arms and not args.teacher and "grpo" not in arms[: arms.index("distill")]:
        arms.insert(arms.index("distill"), "grpo")  # its teacher (reused when already trained)
    settings = SMOKE if args.smoke else DEFAULT
    out = args.out or ROOT / "runs" / ("algorithms-smoke" if args.smoke else "algorithms")
    json_path = args.json or (out / "algorithms.json" if args.smoke else default_json("algorithms"))

    threads = configure_threads()  # as the omrl commands do: a busy machine must not be oversubscribed
    example = learn_gridworld()
    budget = dataclasses.asdict(example_budget(example, settings))
    settings = dataclasses.replace(settings, example={key: budget[key] for key in EXAMPLE_KEYS})
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sft, sft_row = sft_model(out, example, settings, args.seed)
    teacher = args.teacher or str(out / "grpo")
    for name in arms:
        run_arm(ARMS[name], out, example, sft, settings, args.seed, teacher)

    rows = [sft_row] + [
        check_budget(out / "rows" / f"{name}.json", settings)
        for name in ARMS
        if (out / "rows" / f"{name}.json").exists()
    ]
    grpo = next((r for r in rows if r["arm"] == "grpo" and r["status"] == "ok"), None)
    for row in rows:
        if grpo is not None and row is not grpo and row["status"] == "ok":
            row["vs_grpo"] = versus(row, grpo)
    record = {
        "benchmark": "algorithms",
        "command": " ".join(["python", "benchmarks/algorithms.py", *sys.argv[1:]]),
        "smoke": args.smoke,
        "seed": args.seed,
        "settings": dataclasses.asdict(settings),
        "out": str(out),
        "this_run_minutes": (time.perf_counter() - started) / 60,
        "machine": machine(threads),
        "rows": rows,
    }
    text = table(record)
    save_json(json_path, record)
    atomic_write_text(json_path.with_suffix(".md"), text + "\n")
    print(text)
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
