"""omrl learns several envs at once: the `tiny` model through expert data of three envs, SFT on the
mixture, then GRPO on the mixture, against GRPO on each env alone.

    python examples/learn_generalist.py            # the full run (33 minutes on 2 CPU cores)
    python examples/learn_generalist.py --quick    # a small budget (about 8 minutes)
    python examples/learn_generalist.py --smollm2  # SmolLM2-135M-Instruct at what 2 cores allow

Stages, each written under ``--out`` and skipped when its result is there (so a stopped run goes on
from the stage it was in; a GRPO stage resumes from its last checkpoint):

1. EXPERT: each env's scripted expert plays training tasks; one trajectory file, rows naming their env.
2. SFT of the model (random-init ``tiny``, or SmolLM2) on the mixture.
3. GRPO from the SFT model on the mixture (equal weights; each env with its own turn cap).
4. GRPO from the SFT model on each env alone, with as many episodes of that env as the mixture run
   gave it (the same steps, ``tasks_per_step`` times the env's weight): the specialists.

Held-out success per env (the first ``eval_tasks`` test tasks of each) is measured before SFT, after
SFT, after the mixture's GRPO and for each specialist, two ways: sampled (``eval_samples`` episodes a
task at temperature 1, the policy GRPO optimises) and greedy (one episode a task), each with its
standard error over tasks. The macro average weighs every env alike. ``summary.json`` holds every
number and whether the targets held; ``success.png`` draws them. Everything is seeded.

Both models of a comparison play the same test tasks, so a difference's standard error is the
paired one, over tasks (:func:`targets`).

Measured here (2 CPU cores, 33 minutes): sampled macro success 0% -> 57.1 +- 2.6% after SFT ->
62.1 +- 3.3% after GRPO on the mixture (letter counting +19.6 points, gridworld and BabyAI level);
the one-env specialists 65.1 +- 3.1%. The macro gain is +5.0 +- 2.4 points, 2.1 paired standard
errors (docs/learning.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from omrl.atomic import atomic_write_text
from omrl.config import load_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig, SftRunConfig, TrainRunConfig
from omrl.data import write_episodes
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.rl import run_rl
from omrl.training.sft import run_sft

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
from common import grpo_settings, save_figure, sft_settings  # noqa: E402

#: the envs and each one's own settings (a YAML list for env.mix)
ENVS = {
    "gridworld": "{name: gridworld, max_turns: 12, demonstration: false}",
    "babyai:GoToRedBallNoDists": "{name: 'babyai:GoToRedBallNoDists', max_turns: 10, demonstration: false}",
    "reasoning-gym:letter_counting": "{name: 'reasoning-gym:letter_counting', demonstration: false}",
}
GENERATION = ["generation.max_new_tokens=12", "generation.max_context=1024", "generation.batch_size=64"]


@dataclass
class Budget:
    """How much work each stage does, and the GRPO settings."""

    expert_episodes: int  # per env
    sft_epochs: float
    grpo_steps: int
    tasks_per_step: int  # of the mixture; a specialist plays tasks_per_step / len(ENVS) of its env
    group_size: int
    eval_tasks: int  # per env
    eval_samples: int = 4
    sft_learning_rate: float = 2e-3
    grpo_learning_rate: float = 5e-4
    mini_batch_size: int = 16
    ppo_epochs: int = 2
    kl_coef: float = 0.02
    advantage: str = "gigpo"  # step-level credit for the multi-turn envs; plain GRPO for one-turn tasks
    gamma: float = 0.9
    model: str = "tiny"  # what SFT starts from
    micro_batch_size: int = 16  # rows a forward pass, SFT and GRPO
    specialists: bool = True  # also GRPO on each env alone, to compare


FULL = Budget(expert_episodes=1000, sft_epochs=8.0, grpo_steps=24, tasks_per_step=12, group_size=8, eval_tasks=60)
# a specialist plays 2 tasks x 6 samples a step: one mini-batch of 12
QUICK = Budget(
    expert_episodes=150, sft_epochs=3.0, grpo_steps=4, tasks_per_step=6, group_size=6, eval_tasks=20, mini_batch_size=12
)
# a pretrained model: fine-tuning learning rates, and what 2 CPU cores get through in about an hour
# (its untrained evaluation alone takes 20 minutes: it rambles to every turn cap); no specialists
SMOLLM2 = Budget(
    model="smollm2-135m",
    micro_batch_size=2,
    specialists=False,
    expert_episodes=200,
    sft_epochs=1.0,
    sft_learning_rate=5e-5,
    grpo_steps=4,
    tasks_per_step=6,
    group_size=4,
    grpo_learning_rate=1e-5,
    mini_batch_size=8,
    ppo_epochs=1,
    eval_tasks=20,
    eval_samples=2,
)


def mix(envs: list[str]) -> str:
    """The env.mix override of ``envs`` (equal weights)."""
    return f"env.mix=[{', '.join(ENVS[env] for env in envs)}]"


def expert_data(path: Path, budget: Budget, envs: list[str] | None = None) -> Path:
    """Each env's expert (of ``envs``, default all) plays ``expert_episodes`` training tasks, all in one
    batched rollout."""
    cfg = load_config(
        RolloutRunConfig,
        None,
        [f"model.name={budget.model}", "env.name=gridworld", mix(envs or list(ENVS)), *GENERATION],
    )
    with RolloutSession.from_config(cfg, expert=True) as session:
        episodes = session.play(session.task_ids("train", budget.expert_episodes), PlaySpec(expert=True)).episodes
    write_episodes([ep for ep in episodes if ep.won], path)  # the expert's wins are the demonstrations
    return path


def held_out(model: str, budget: Budget, seed: int) -> dict[str, dict[str, dict]]:
    """{sampled|greedy: {env: {success, se, tasks, per_task}}} on each env's first ``eval_tasks`` test
    tasks (``per_task``: each task's success, by task id, for paired comparisons)."""
    out = {}
    for name, temperature, samples in (("sampled", 1.0, budget.eval_samples), ("greedy", 0.0, 1)):
        cfg = load_config(
            EvalRunConfig,
            None,
            [f"model.name={model}", "env.name=gridworld", mix(list(ENVS)), *GENERATION]
            + [f"generation.temperature={temperature}", f"seed={seed}"],
        )
        with RolloutSession.from_config(cfg) as session:
            episodes = session.play(
                session.task_ids("test", budget.eval_tasks), PlaySpec(group_size=samples, seed=seed)
            ).episodes
        out[name] = {env: success_with_se([ep for ep in episodes if ep.env == env]) for env in ENVS}
        out[name]["macro"] = macro(out[name])
    return out


def success_with_se(episodes: list) -> dict:
    """Success over tasks (each task's mean over its samples), its standard error over tasks, and each
    task's success; an episode that failed in the env is not counted (none should: these envs run in
    process)."""
    by_task: dict[str, list[float]] = {}
    for ep in episodes:
        if ep.end_reason != "env_error":
            by_task.setdefault(str(ep.task_id), []).append(float(ep.won))
    per_task = {task: sum(v) / len(v) for task, v in by_task.items()}
    mean, se = mean_and_se(list(per_task.values()))
    return {"success": mean, "se": se, "tasks": len(per_task), "per_task": per_task}


def in_se(diff: float, se: float) -> float:
    """``diff`` in standard errors (a change with no spread at all is infinitely many)."""
    return diff / se if se else math.copysign(math.inf, diff) if diff else 0.0


def mean_and_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def macro(per_env: dict[str, dict[str, float]]) -> dict[str, float]:
    """The mean over envs, each alike; its SE from the envs' (independent test sets)."""
    values = [per_env[env] for env in ENVS]
    return {
        "success": sum(v["success"] for v in values) / len(values),
        "se": math.sqrt(sum(v["se"] ** 2 for v in values)) / len(values),
    }


def sft_stage(data: Path, out: Path, budget: Budget, seed: int) -> Path:
    """SFT of ``budget.model`` on every env's expert turns; resumed when stopped."""
    overrides = [
        *sft_settings(out, budget, seed, data, warmup_steps=30),
        f"resume={str((out / 'checkpoints').exists()).lower()}",
    ]
    run_sft(load_config(SftRunConfig, None, overrides))
    return out


def grpo_stage(
    model: Path,
    out: Path,
    envs: list[str],
    budget: Budget,
    seed: int,
    reward: str = "{goal: 1.0}",
    overrides: tuple[str, ...] = (),
) -> Path:
    """GRPO from ``model`` on ``envs`` (a mixture of equal weights when several), ``tasks_per_step``
    scaled by their share of the envs; checkpointed every 2 steps and resumed when stopped."""
    tasks = max(1, budget.tasks_per_step * len(envs) // len(ENVS))
    run_rl(
        load_config(
            TrainRunConfig,
            "grpo",
            [
                f"model.name={model}",
                "env.name=gridworld",
                mix(envs),
                *GENERATION,
                *grpo_settings(out, budget, seed, reward, tasks_per_step=tasks),
                "logging.save_steps=2",
                f"resume={str(latest_checkpoint(out) is not None).lower()}",
                f"mini_batch_size={budget.mini_batch_size}",
                f"ppo_epochs={budget.ppo_epochs}",
                f"algorithm.advantage={budget.advantage}",
                f"algorithm.gamma={budget.gamma}",
                "eval_tasks=0",
                *overrides,
            ],
        )
    )
    return out


def stage(out: Path, name: str, run, budget: Budget):
    """``run()``'s JSON result, kept in ``out/stages/<name>.json``: a stage done before is not run again.
    One done with another budget is refused (its result would be passed off as this budget's)."""
    path = out / "stages" / f"{name}.json"
    if path.exists():
        record = json.loads(path.read_text())
        if {**asdict(budget), **record.get("budget", {})} != asdict(budget):  # a setting added since: as now
            raise SystemExit(
                f"{path} was made with another budget ({record['budget']}); use another --out for this one"
            )
        return record
    started = time.perf_counter()
    result = run()
    print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"result": result, "seconds": time.perf_counter() - started, "budget": asdict(budget)}
    atomic_write_text(path, json.dumps(record))
    return json.loads(path.read_text())


def main(out: Path, budget: Budget, seed: int = 0) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    seconds = {}

    def done(name: str, run):
        record = stage(out, name, run, budget)
        seconds[name] = record["seconds"]
        return record["result"]

    data = done("expert", lambda: str(expert_data(out / "expert.parquet", budget)))
    results = {"before_sft": done("held_out_before_sft", lambda: held_out(budget.model, budget, seed))}
    sft = done("sft", lambda: str(sft_stage(Path(data), out / "sft", budget, seed)))
    results["after_sft"] = done("held_out_after_sft", lambda: held_out(sft, budget, seed))
    mixed = done("grpo_mixture", lambda: str(grpo_stage(Path(sft), out / "grpo-mixture", list(ENVS), budget, seed)))
    results["after_rl"] = done("held_out_after_rl", lambda: held_out(mixed, budget, seed))
    alone = {}
    for i, env in enumerate(ENVS if budget.specialists else []):
        run = done(
            f"grpo_alone_{i}",
            lambda env=env, i=i: str(grpo_stage(Path(sft), out / f"grpo-alone-{i}", [env], budget, seed)),
        )
        alone[env] = done(f"held_out_alone_{i}", lambda run=run: held_out(run, budget, seed))
    if alone:
        results["alone"] = {kind: {env: alone[env][kind][env] for env in ENVS} for kind in ("sampled", "greedy")}
        for kind in ("sampled", "greedy"):
            results["alone"][kind]["macro"] = macro(results["alone"][kind])
    summary = {
        "envs": list(ENVS),
        "budget": asdict(budget),
        "results": results,
        "targets": targets(results),
        "minutes": sum(seconds.values()) / 60,
        "stage_minutes": {name: s / 60 for name, s in seconds.items()},
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    plot(summary, out / "success.png")
    return summary


def targets(results: dict) -> dict:
    """After RL against after SFT (sampled): the macro gain in standard errors of the difference, and
    each env's change; and the mixture against the specialists, per env.

    Both models play the same test tasks, so the difference's standard error is the paired one: over
    tasks, of each task's success after RL minus after SFT (a task's own difficulty, shared by both,
    cancels). The unpaired one, sqrt(se_a^2 + se_b^2), treats the two as separate samples of tasks
    and is kept beside it as ``se_unpaired``; the envs' test sets are independent, so a macro SE is
    sqrt(sum of the envs' squared SEs) / the number of envs either way."""

    def gap(a: dict, b: dict) -> dict:
        """a - b per env, paired over their common tasks."""
        common = sorted(set(a["per_task"]) & set(b["per_task"]))
        diff, se = mean_and_se([a["per_task"][t] - b["per_task"][t] for t in common])
        unpaired = math.sqrt(a["se"] ** 2 + b["se"] ** 2)
        return {
            "diff": diff,
            "se": se,
            "in_se": in_se(diff, se),
            "se_unpaired": unpaired,
            "tasks": len(common),
        }

    def macro_gap(gaps: dict) -> dict:
        diff = sum(g["diff"] for g in gaps.values()) / len(gaps)
        se = math.sqrt(sum(g["se"] ** 2 for g in gaps.values())) / len(gaps)
        unpaired = math.sqrt(sum(g["se_unpaired"] ** 2 for g in gaps.values())) / len(gaps)
        return {"diff": diff, "se": se, "in_se": in_se(diff, se), "se_unpaired": unpaired}

    rl, sft = results["after_rl"]["sampled"], results["after_sft"]["sampled"]
    per_env = {env: gap(rl[env], sft[env]) for env in ENVS}
    macro_rl = macro_gap(per_env)
    out = {
        "macro_rl_minus_sft": macro_rl,
        "macro_above_sft_by_2se": macro_rl["in_se"] > 2,
        "rl_minus_sft": per_env,
        "no_env_worse_by_2se": all(g["in_se"] >= -2 for g in per_env.values()),
    }
    if "alone" in results:  # the specialists ran
        alone = results["alone"]["sampled"]
        out["mixture_minus_alone"] = {env: gap(rl[env], alone[env]) for env in ENVS}
        out["macro_mixture_minus_alone"] = macro_gap(out["mixture_minus_alone"])
    return out


def plot(summary: dict, path: Path) -> None:
    """Sampled held-out success per env and macro, per stage, with standard-error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["results"]
    groups = [*summary["envs"], "macro"]
    stages = [("before_sft", "before SFT"), ("after_sft", "after SFT"), ("after_rl", "GRPO on the mixture")]
    if "alone" in results:
        stages.append(("alone", "GRPO on the env alone"))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(stages)
    for i, (key, label) in enumerate(stages):
        values = [results[key]["sampled"][g] for g in groups]
        xs = [j + (i - (len(stages) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, [100 * v["success"] for v in values], width, yerr=[100 * v["se"] for v in values], label=label)
    ax.set_xticks(range(len(groups)), [g.replace(":", ":\n") for g in groups])
    ax.set_ylabel(f"held-out success, {summary['budget']['eval_samples']} samples a task (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{summary['budget']['model']}, three envs: SFT then GRPO on the mixture")
    ax.legend(loc="upper right", fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/learn-generalist"))
    budgets = parser.add_mutually_exclusive_group()
    budgets.add_argument("--quick", action="store_true", help="a small budget")
    budgets.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct, at what 2 cores allow")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = main(args.out, QUICK if args.quick else SMOLLM2 if args.smollm2 else FULL, args.seed)
    print(json.dumps({k: result[k] for k in ("targets", "minutes", "stage_minutes")}, indent=2))
