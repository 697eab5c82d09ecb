"""Agent reward models on gridworld: how well they score, select, guide search and stand in for the reward.

    python benchmarks/reward_models.py                     # every part (about 30-40 minutes on 2 cores)
    python benchmarks/reward_models.py --parts data orm     # some parts; later parts reuse earlier files

The policy is the ``tiny`` model after SFT on gridworld's BFS expert (learn_gridworld's quick
size, built once into ``--sft-dir`` as ``benchmarks/search_budget.py`` does), with
learn_gridworld's env and generation settings. Every reward model starts from that policy's
weights (same tokenizer: episodes are scored on their own token ids). Parts:

- ``data``: chains at temperature 1: ``--train-tasks`` train tasks x 8 samples (ORM training
  data) and ``--test-tasks`` test tasks x 16 samples (held out); Math-Shepherd trees
  (``mc_value``, 4 completions a turn) on ``--tree-tasks`` train tasks for the PRM, and on half
  as many test tasks to check it. Files already there are kept (``--fresh`` plays them again).
- ``orm``: ``omrl rm train`` (success, bce) on the train chains; ``omrl rm eval`` on the test
  chains: accuracy, AUC, calibration, and best-of-N for N = 1..16 by the ORM against random
  (pass@1) and the oracle (pass@N), with the paired standard error of the gain over random.
- ``prm``: ``omrl rm train`` (Monte Carlo values, bce) on the train trees; eval on the test trees.
- ``search``: at equal budgets, on the test tasks: best-of-N chains picked by the ORM, by a
  random pick, by the env (oracle), and beam search guided and answered by the PRM (and by the
  ORM), which never looks at the env's outcome (``stop_on_win=false``, ``select=rm``).
- ``grpo``: GRPO from the SFT model with the ORM as the only trained reward (``reward.weights=
  {rm: 1.0, goal: 0.0}``: the env's success is logged, not trained on), learn_gridworld's GRPO
  settings; held-out success before and after, and the ORM's mean score, tell learning from
  exploitation.

- ``webshop``: SmolLM2 after a short SFT on WebShop's expert (``--webshop-sft-episodes``, one
  epoch: it learns the reply format and buys something, rarely the right thing), chains on
  ``--webshop-goals`` train goals x 4 and test goals x 16 (two files of 8, seeds ``--seed`` and the
  next); an ORM on the env's score (partial credit), reported on the test goals (selection by score
  as well as success, N up to 16).
- ``webshop_search``: a PRM on Math-Shepherd trees of that SFT model (``--webshop-tree-goals``
  train goals, 2 completions a turn; ``mc_score`` labels: no path wins, so win-based ``mc``
  labels would all be 0 and are refused); then at one budget (``--webshop-budget``) on the test goals,
  best-of-N chains (played once, picked by the ORM, at random and by the oracle) against beam
  guided and answered by the PRM.

Writes ``<out>/results.json`` (every number) beside the data and models, and prints tables. After
each part the record, every part's numbers so far with the machine each part ran on, also goes to
``--json`` (default ``benchmarks/results/reward_models.json``).

Measured here (2 CPU cores shared with other jobs, seed 0; README "Reward models" has the tables;
JSON in benchmarks/results/reward_models/): gridworld held-out ORM AUC 0.966, ECE 0.021; best-of-8
by the ORM 53.1% against a random pick's 18.2% (+35.0 +- 4.7 points paired, 7.4 SE), oracle 56.2%;
the shortest episode alone gets 46.9%. At 384 tokens: best-of-4 by the ORM 40.6%, PRM-guided beam
37.5% (no difference), ORM-guided beam 21.9%. GRPO on the ORM alone: ORM score 0.25 -> 0.83 while
held-out success fell 16.0% -> 2.3% (empty replies end episodes early, which the ORM scores high).
WebShop, ORM on 12 test goals x 16 chains: AUC 0.963; best-of-8 score 0.593 against a random pick's
0.269 (+0.324 +- 0.041), success 0 at every N (the oracle's 25% at N=16). At 800 tokens a goal:
best-of-4 by the ORM scores 0.562 against a random pick's 0.209 and the oracle's 0.579; PRM-guided
beam 0.457 (+0.248 +- 0.079 over random, -0.106 +- 0.087 against the ORM's pick), no goal won.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import default_json, machine, save_json  # noqa: E402
from search_budget import gridworld_sft, learn_gridworld  # noqa: E402

PARTS = ("data", "orm", "prm", "search", "grpo", "webshop", "webshop_search")


def omrl(*args: str) -> None:
    """Run an omrl command as a user would; a failure stops the benchmark with its output."""
    command = [sys.executable, "-m", "omrl", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def settings(example) -> list[str]:
    return [*example.ENV, *example.GENERATION, "generation.temperature=1.0"]


def data_part(out: Path, model: Path, args, example) -> dict:
    """Chains and Math-Shepherd trees on train and test tasks."""
    common = [f"model.name={model}", *settings(example), f"seed={args.seed}"]
    plays = {
        "train_chains": ["env.split=train", f"num_tasks={args.train_tasks}", "group_size=8"],
        "test_chains": ["env.split=test", f"num_tasks={args.test_tasks}", "group_size=16"],
        "train_trees": ["env.split=train", f"num_tasks={args.tree_tasks}", "strategy=mc_value", "plugins.mc_value.k=4"],
        "test_trees": [
            "env.split=test",
            f"num_tasks={args.tree_tasks // 2}",
            "strategy=mc_value",
            "plugins.mc_value.k=4",
        ],
    }
    minutes = {}
    for name, extra in plays.items():
        output = out / "data" / name / "episodes.parquet"
        if output.exists() and not args.fresh:
            continue  # played by an earlier run with these settings
        started = time.perf_counter()
        omrl("rollout", *common, *extra, f"output={output}")
        minutes[name] = (time.perf_counter() - started) / 60
    return {"minutes": minutes}


def rm_part(out: Path, model: Path, kind: str, args) -> dict:
    """Train one reward model on the train data, report on the held-out data."""
    data, held_out = ("train_chains", "test_chains") if kind == "orm" else ("train_trees", "test_trees")
    label = "success" if kind == "orm" else "mc"
    started = time.perf_counter()
    omrl(
        "rm",
        "train",
        f"model.name={model}",
        f"kind={kind}",
        f"label={label}",
        "objective=bce",
        f"dataset={out / 'data' / data}",
        f"logging.output_dir={out / kind}",
        f"num_train_epochs={args.rm_epochs}",
        f"optim.learning_rate={args.rm_lr}",
        "optim.micro_batch_size=8",
        "optim.lr_schedule=cosine",
        "logging.tensorboard=false",
        "logging.logging_steps=20",
        f"seed={args.seed}",
    )
    train_minutes = (time.perf_counter() - started) / 60
    omrl(
        "rm",
        "eval",
        "--model",
        str(out / kind),
        "--data",
        str(out / "data" / held_out),
        "--report",
        str(out / f"{kind}_eval.json"),
    )
    report = json.loads((out / f"{kind}_eval.json").read_text())
    if kind == "orm":
        report["against_shortest"] = against_shortest(out)
    return {"train_minutes": train_minutes, **report}


def against_shortest(out: Path) -> list[dict]:
    """The ORM's best-of-N pick against a plain rule that needs no model: the shortest episode (a won
    gridworld episode ends before the turn cap). Paired by task."""
    from omrl.data import read_episodes
    from omrl.rm.evaluate import selection_curve
    from omrl.rm.labels import NO_OUTCOME
    from omrl.rm.model import RewardModel

    episodes = [
        ep
        for ep in read_episodes(out / "data" / "test_chains" / "episodes.parquet")
        if ep.turns and ep.end_reason not in NO_OUTCOME
    ]
    orm = RewardModel.load(out / "orm").score_episodes(episodes)
    # the length rule's pick scores 1 and the rest 0, so "selected" is the rule's success and its gain
    # over the ORM's pick is paired by task; both pick the first of equal scores, as rm eval does
    rows = []
    for row in selection_curve(episodes, [-len(ep.turns) for ep in episodes]):
        n = row["n"]
        rows.append({"n": n, "shortest": row["selected"], "shortest_se": row["selected_se"]})
    by_task: dict = {}
    for ep, score in zip(episodes, orm):
        by_task.setdefault(ep.task_id, []).append((ep, score))
    for row in rows:
        diffs = []
        for group in by_task.values():
            first = sorted(group, key=lambda pair: pair[0].sample)[: row["n"]]
            by_orm = max(range(len(first)), key=lambda i: (first[i][1], -i))
            by_length = max(range(len(first)), key=lambda i: (-len(first[i][0].turns), -i))
            diffs.append(float(first[by_orm][0].won) - float(first[by_length][0].won))
        mean = sum(diffs) / len(diffs)
        row["orm_minus_shortest"] = mean
        row["orm_minus_shortest_se"] = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    return rows


def search_part(out: Path, model: Path, args, example) -> dict:
    """Best-of-N by ORM / random / oracle and PRM-guided beam at equal budgets on the test tasks."""
    cells = {
        "best_of_n/random": ["strategy=best_of_n", "plugins.best_of_n.select=random"],
        "best_of_n/orm": ["strategy=best_of_n", "plugins.best_of_n.select=rm", f"plugins.rm.path={out / 'orm'}"],
        "best_of_n/env (oracle)": ["strategy=best_of_n", "plugins.best_of_n.select=env_reward"],
        # beam guided and answered by a reward model, never looking at the env's outcome (as best-of-N by the ORM)
        "beam/prm": [
            "strategy=beam",
            "plugins.beam.scorer=rm",
            "plugins.beam.select=rm",
            "plugins.beam.stop_on_win=false",
            f"plugins.rm.path={out / 'prm'}",
        ],
        "beam/orm": [
            "strategy=beam",
            "plugins.beam.scorer=rm",
            "plugins.beam.select=rm",
            "plugins.beam.stop_on_win=false",
            f"plugins.rm.path={out / 'orm'}",
        ],
    }
    results = {}
    for budget in args.budgets:
        n = max(1, budget // 96)  # a chain spends about 90 tokens here
        for name, extra in cells.items():
            report = out / "search" / f"{name.split(' ')[0].replace('/', '-')}-{budget}.json"
            started = time.perf_counter()
            omrl(
                "eval",
                f"model.name={model}",
                *settings(example),
                "env.split=test",
                f"num_tasks={args.test_tasks}",
                f"budget={budget}",
                f"plugins.best_of_n.n={n}",
                f"seed={args.seed}",
                *extra,
                f"report={report}",
            )
            got = json.loads(report.read_text())["metrics"]
            results[f"{name} @ {budget}"] = {
                "budget": budget,
                "success": got["success_rate"],
                "success_se": math.sqrt(got["success_rate"] * (1 - got["success_rate"]) / args.test_tasks),
                "tokens_per_task": got.get("search/generated_tokens_per_task"),
                "minutes": (time.perf_counter() - started) / 60,
            }
    return results


def grpo_part(out: Path, model: Path, args, example) -> dict:
    """GRPO on the ORM alone; the env's success logged beside the ORM's score."""
    budget = example.QUICK
    budget.grpo_steps, budget.eval_tasks, budget.eval_every = args.grpo_steps, 64, args.grpo_steps
    log: list[dict] = []
    started = time.perf_counter()
    example.grpo_stage(
        model,
        out / "grpo-orm",
        budget,
        args.seed,
        reward="{rm: 1.0, goal: 0.0}",
        on_step_end=lambda step, m: log.append({"step": step, **m}),
        overrides=(f"plugins.rm.path={out / 'orm'}",),
    )
    before = example.held_out_success(str(model), budget, args.seed)
    after = example.held_out_success(str(out / "grpo-orm"), budget, args.seed)
    keys = ("reward_rm", "reward_goal", "success", "score", "turns", "format_ok", "eval_success")
    return {
        "minutes": (time.perf_counter() - started) / 60,
        "before": before,
        "after": after,
        "steps": [{k: m[k] for k in ("step", *keys) if k in m} for m in log],
    }


def train_webshop_rm(out: Path, kind: str, label: str, dataset: Path, seed: int) -> None:
    """``omrl rm train`` of a WebShop reward model on the SFT model (``out/sft``) into ``out/<kind>``:
    bce, one epoch at 2e-5, one episode a micro-batch, no packing."""
    omrl(
        "rm",
        "train",
        f"model.name={out / 'sft'}",
        f"kind={kind}",
        f"label={label}",
        "objective=bce",
        f"dataset={dataset}",
        f"logging.output_dir={out / kind}",
        "num_train_epochs=1",
        "optim.learning_rate=2e-5",
        "optim.micro_batch_size=1",
        "packing=false",
        "logging.tensorboard=false",
        f"seed={seed}",
    )


def webshop_part(out: Path, args) -> dict:
    """WebShop: SmolLM2 after a short SFT on the expert, chains on train and test goals, an ORM on the
    env's score (partial credit: this policy rarely buys exactly right), its report on the test goals."""
    from dataclasses import replace

    sys.path.insert(0, str(ROOT / "examples"))
    import webshop_stages as ws

    out = out / "webshop"
    size = replace(
        ws.FULL, expert_episodes=args.webshop_sft_episodes, sft_epochs=1.0, sft_accumulation=1, save_steps=0
    )  # one episode a step: the reply format is learned within about 10 steps
    minutes: dict[str, float] = {}
    started = time.perf_counter()
    if not (out / "sft" / "config.json").exists():
        ws.expert_stage(out / "expert.parquet", size, args.seed)
        ws.sft_stage(out / "expert.parquet", out / "sft", size, args.seed)
    minutes["sft"] = (time.perf_counter() - started) / 60
    common = [f"model.name={out / 'sft'}", *ws.ENV, *ws.GENERATION, "generation.temperature=1.0", f"seed={args.seed}"]
    # the test goals' 16 chains come as two files of 8 (the second seeded apart): earlier runs made the first
    test_goals = ["env.split=test", f"num_tasks={args.webshop_goals}", "group_size=8"]
    for name, extra in (
        ("train/episodes", ["env.split=train", f"num_tasks={args.webshop_goals}", "group_size=4"]),
        ("test/episodes", test_goals),
        ("test/episodes-more", [*test_goals, f"seed={args.seed + 1}"]),
    ):
        output = out / "data" / f"{name}.parquet"
        if not output.exists():
            started = time.perf_counter()
            omrl("rollout", *common, *extra, f"output={output}")
            minutes[f"rollout_{name}"] = (time.perf_counter() - started) / 60
    if not (out / "orm" / "config.json").exists():
        started = time.perf_counter()
        train_webshop_rm(out, "orm", "score", out / "data" / "train", args.seed)
        minutes["rm_train"] = (time.perf_counter() - started) / 60
    started = time.perf_counter()
    omrl(
        "rm",
        "eval",
        "--model",
        str(out / "orm"),
        "--data",
        str(out / "data" / "test"),
        "--report",
        str(out / "orm_eval.json"),
    )
    minutes["rm_eval"] = (time.perf_counter() - started) / 60
    return {"minutes": minutes, **json.loads((out / "orm_eval.json").read_text())}


def webshop_search_part(out: Path, args) -> dict:
    """WebShop: a PRM on Math-Shepherd trees of the SFT model (``--webshop-tree-goals`` train goals, 2
    completions a turn), then at one budget on the test goals: best-of-N by the ORM (on score), by a
    random pick, by the env (oracle), and beam guided and answered by the PRM."""
    sys.path.insert(0, str(ROOT / "examples"))
    import webshop_stages as ws

    out = out / "webshop"
    sft = out / "sft"
    common = [f"model.name={sft}", *ws.ENV, *ws.GENERATION, "generation.temperature=1.0", f"seed={args.seed}"]
    minutes: dict[str, float] = {}
    trees = out / "data" / "train_trees" / "episodes.parquet"
    if not trees.exists():
        started = time.perf_counter()
        omrl(
            "rollout",
            *common,
            "env.split=train",
            f"num_tasks={args.webshop_tree_goals}",
            "strategy=mc_value",
            "plugins.mc_value.k=2",
            f"output={trees}",
        )
        minutes["rollout_trees"] = (time.perf_counter() - started) / 60
    if not (out / "prm" / "config.json").exists():
        started = time.perf_counter()
        train_webshop_rm(out, "prm", "mc_score", trees, args.seed)
        minutes["prm_train"] = (time.perf_counter() - started) / 60
    budget, n = args.webshop_budget, max(1, args.webshop_budget // 200)  # a WebShop chain spends ~150-250 tokens
    test = [*common, "env.split=test", f"num_tasks={args.webshop_goals}", f"budget={budget}"]
    results: dict = {"minutes": minutes, "budget": budget, "chains": n}
    # best-of-N: the chains are played once (all kept); the ORM, a random pick and the oracle choose among them
    chains = out / "search" / f"best_of_n-{budget}.parquet"
    if not chains.exists():
        started = time.perf_counter()
        omrl("rollout", *test, "strategy=best_of_n", f"plugins.best_of_n.n={n}", f"output={chains}")
        minutes["best_of_n"] = (time.perf_counter() - started) / 60
    from omrl.data import read_episodes
    from omrl.rm.evaluate import selection_curve
    from omrl.rm.model import RewardModel

    played = [ep for ep in read_episodes(chains) if ep.turns]
    orm = RewardModel.load(out / "orm").score_episodes(played)
    row = selection_curve(played, orm)[-1]
    results["best_of_n"] = {k: row[k] for k in row if k.startswith(("selected", "random", "oracle", "gain", "n"))}
    # beam guided and answered by the PRM, never reading the env's outcome
    report = out / "search" / f"beam-prm-{budget}.json"
    if not report.exists():
        started = time.perf_counter()
        omrl(
            "eval",
            *test,
            "strategy=beam",
            "plugins.beam.scorer=rm",
            "plugins.beam.select=rm",
            "plugins.beam.stop_on_win=false",
            f"plugins.rm.path={out / 'prm'}",
            f"report={report}",
        )
        minutes["beam/prm"] = (time.perf_counter() - started) / 60
    got = json.loads(report.read_text())
    scores = [e["score"] for e in got["episodes"]]
    results["beam_prm"] = {
        "success": got["metrics"]["success_rate"],
        "mean_score": sum(scores) / len(scores),
        "tokens_per_task": got["metrics"].get("search/generated_tokens_per_task"),
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--train-tasks", type=int, default=128)
    parser.add_argument("--test-tasks", type=int, default=64)
    parser.add_argument(
        "--tree-tasks", type=int, default=48, help="train tasks played as Math-Shepherd trees (half as many test tasks)"
    )
    parser.add_argument("--fresh", action="store_true", help="play the data again even where files exist")
    parser.add_argument("--budgets", type=int, nargs="+", default=[384])
    parser.add_argument("--rm-epochs", type=float, default=3.0)
    parser.add_argument("--rm-lr", type=float, default=5e-4)
    parser.add_argument("--grpo-steps", type=int, default=8)
    parser.add_argument(
        "--webshop-goals", type=int, default=12, help="train goals (4 samples each) and test goals (8 samples each)"
    )
    parser.add_argument("--webshop-tree-goals", type=int, default=6, help="train goals played as Math-Shepherd trees")
    parser.add_argument("--webshop-budget", type=int, default=800, help="generated tokens a test goal may use")
    parser.add_argument("--webshop-sft-episodes", type=int, default=16, help="expert episodes the short SFT sees")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "reward-models")
    parser.add_argument("--sft-dir", type=Path, default=ROOT / "runs" / "search-budget" / "gridworld-sft")
    parser.add_argument("--json", type=Path, default=default_json("reward_models"), help="where the record goes")
    args = parser.parse_args()

    console = Console()
    example = learn_gridworld()
    model = gridworld_sft(args.sft_dir, args.seed, console)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for part in args.parts:
        started = time.perf_counter()
        console.print(f"[bold]{part}[/bold] ...")
        if part == "data":
            results[part] = data_part(args.out, model, args, example)
        elif part in ("orm", "prm"):
            results[part] = rm_part(args.out, model, part, args)
        elif part == "search":
            results[part] = search_part(args.out, model, args, example)
        elif part == "webshop":
            results[part] = webshop_part(args.out, args)
        elif part == "webshop_search":
            results[part] = webshop_search_part(args.out, args)
        else:
            results[part] = grpo_part(args.out, model, args, example)
        results[part]["part_minutes"] = (time.perf_counter() - started) / 60
        results[part]["machine"] = machine()  # parts run apart (later ones reuse earlier files): each names its own
        save_json(results_path, results)
        save_json(
            args.json,
            {
                "benchmark": "reward_models",
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "machine": machine(),
                "results": results,
            },
        )
        console.print_json(json.dumps(results[part]))
    console.print(f"wrote {results_path} and {args.json}")


if __name__ == "__main__":
    main()
