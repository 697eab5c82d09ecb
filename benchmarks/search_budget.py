"""Test-time scaling: success against generated tokens for each rollout strategy, on gridworld and webshop.

    python benchmarks/search_budget.py                                  # both envs, default sizes
    python benchmarks/search_budget.py --envs gridworld --gridworld-tasks 16
    python benchmarks/search_budget.py --envs webshop --webshop-tasks 2 --webshop-budgets 256 plugins.mcts.iterations=8

Each env is one ``omrl sweep`` (:func:`omrl.search.sweep.run_sweep`): every strategy at
every budget on the same tasks, sampled at temperature 1 (search draws several candidates
of one prompt), strategies at their default options unless overridden (``key=value``
arguments go to both envs' configs):

- gridworld: the ``tiny`` model after SFT on the env's BFS expert, built with
  ``examples/learn_gridworld.py``'s expert data and SFT stage (its quick size) into
  ``--sft-dir`` once and reused after; learn_gridworld's env and generation settings
  (12 turns, 12 new tokens a reply, so a whole chain is at most 144 tokens).
- webshop: the default model (smollm2-135m-webshop, SmolLM2 after omrl's WebShop SFT) with the
  WebShop presets' settings (8 turns, 48 new tokens a reply, 2,048 tokens of context, no worked
  example). Slow on a CPU: the default size (8 tasks) takes about 15 minutes on 2 busy cores.

Writes ``<out>/<env>/sweep.json``, ``sweep.png`` and ``machine.json`` (the machine the run measured
on, and its minutes; ``<out>`` defaults to benchmarks/results/search_budget) and prints the table. Each run measures afresh;
``--resume`` instead finishes a sweep that stopped, playing only the cells its JSON lacks.
``best_of_n``, ``beam``, ``dfsdt`` and ``mcts`` pick or prune by the ``env_reward`` scorer
by default, i.e. the env's own reward acts as the verifier (``any`` in the table is what
a perfect verifier would get); ``plugins.best_of_n.select=logprob`` etc. use the model alone.

Measured here (2 CPU cores shared with other jobs, seed 0); the README's "Search rollouts"
section has the tables:

- gridworld, 64 test tasks, budgets 192 and 384 (``--gridworld-tasks 64 --gridworld-budgets
  192,384``, results in ``gridworld-64/``): 23 min on cores shared with a CI run (2026-12-05, after
  MCTS's answer-rule fix). Chain (pass@1) 26.6%; at 384 tokens best_of_n 53.1%, beam 42.2%, dfsdt
  45.3%, mcts 54.7% (standard errors about 6 points): no search beats best_of_n, on success or on
  mean score (mcts +0.003 paired). The mean-score lead mcts showed before the fix came from the bug.
- gridworld, all 500 test tasks at 384 (``--gridworld-tasks 500 --gridworld-budgets 384 --strategies
  chain,best_of_n,mcts``, results in ``gridworld-500/``, before the fix): 40 min. best_of_n 39.2%, mcts
  37.8% (-1.4 +- 2.4 paired): no difference on success; its mean-score figure is withdrawn.
- webshop, the default size (8 tasks, every strategy at 160 and 320 tokens; results in
  ``webshop/``): 15 min of cells. Chain (pass@1) 12.5%; at 320 tokens best_of_n 50%, beam 0%,
  dfsdt 62.5%, mcts 75% (standard errors 15-18 points: a curve's shape, not a verdict).
- webshop, the first 100 test tasks at 320 (``--webshop-tasks 100 --webshop-budgets 320 --strategies
  best_of_n,mcts generation.kv_cache_mb=3072``, results in ``webshop-100/``): 69 min. best_of_n 41.0%,
  mcts 54.0%; paired +13.0 +- 4.9 points (2.7 SE; 2.3 SE without the first 8 tasks), with 7% fewer
  tokens (its mean-score figure predates MCTS's answer-rule fix).
  (Before the first 8 tasks were run with the default size, an earlier webshop table was of the
  untuned smollm2-135m, which never buys the right product: every cell 0.)
- webshop, best-of-3 on the same 100 tasks at 320 (``--webshop-tasks 100 --webshop-budgets 320 --strategies
  best_of_n plugins.best_of_n.n=3 generation.kv_cache_mb=3072 --out runs/search-bo3``, results
  copied to ``webshop-100-bo3/``): 43 min. best_of_n 41.0% with 212 tokens a task (fewer chains cut by the
  budget: 30 tasks, against all 100 at n=4); mcts against it, paired: +13.0 +- 4.9 points (2.7 SE).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from _results import machine, save_json
from rich.console import Console

from omrl.cli.play_flags import progress_bar
from omrl.cli.sweep_cmd import parse_budgets, split_list
from omrl.config import load_config
from omrl.search.sweep import SweepRunConfig, run_sweep, sweep_table
from omrl.threads import configure_threads

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "learn_gridworld.py"
ALL_STRATEGIES = "chain,best_of_n,beam,dfsdt,mcts"
# the WebShop presets' settings, on the prompts the default model was tuned on (no worked example)
WEBSHOP = [
    "env.name=webshop",
    "env.template=react",
    "env.max_turns=8",
    "env.demonstration=false",
    "generation.max_new_tokens=48",
    "generation.max_context=2048",
]
WEBSHOP_MODEL = "smollm2-135m-webshop"  # the default model of `omrl train --algo grpo --env webshop`


def learn_gridworld():
    """examples/learn_gridworld.py as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("learn_gridworld", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def gridworld_sft(sft_dir: Path, seed: int, console: Console) -> Path:
    """The SFT model of learn_gridworld's quick size: reused when ``sft_dir`` holds one, else trained (minutes)."""
    if (sft_dir / "config.json").exists() and (sft_dir / "model.safetensors").exists():
        console.print(f"gridworld: reusing the SFT model in {sft_dir}")
        return sft_dir
    example = learn_gridworld()
    budget = example.QUICK
    console.print(
        f"gridworld: training the SFT model into {sft_dir} ({budget.expert_episodes} expert episodes, "
        f"{budget.sft_epochs:g} epochs)"
    )
    started = time.perf_counter()
    data = example.expert_data(sft_dir.parent / "gridworld-expert.parquet", budget.expert_episodes)
    example.sft_stage(data, sft_dir, budget, seed)
    console.print(f"gridworld: SFT took {(time.perf_counter() - started) / 60:.1f} min")
    return sft_dir


def sweep(env: str, model: str, settings: list[str], args: argparse.Namespace, console: Console) -> dict:
    """One env's sweep, through the same function as `omrl sweep`."""
    tasks, budgets = getattr(args, f"{env}_tasks"), getattr(args, f"{env}_budgets")
    cfg = load_config(
        SweepRunConfig,
        None,
        [*settings, *args.overrides],
        {
            "model.name": model,
            "env.name": env,
            "num_tasks": tasks,
            "budgets": parse_budgets(budgets),
            "strategies": split_list(args.strategies, "--strategies"),
            "generation.temperature": 1.0,
            "seed": args.seed,
            "out": str(args.out / env),
            "resume": args.resume,
        },
    )
    started = time.perf_counter()
    log = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731 (paths stay whole)
    record = run_sweep(cfg, progress_bar=progress_bar, log=log)
    minutes = (time.perf_counter() - started) / 60
    run = {"benchmark": "search_budget", "env": env, "minutes": minutes, "machine": machine(args.threads)}
    save_json(Path(cfg.out) / "machine.json", run)
    console.print(sweep_table(record))
    console.print(
        f"{env}: {minutes:.1f} min (this run); wrote {cfg.out}/sweep.json, sweep.png and machine.json",
        highlight=False,
        soft_wrap=True,
    )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for both envs")
    parser.add_argument("--envs", nargs="+", default=["gridworld", "webshop"], choices=["gridworld", "webshop"])
    parser.add_argument("--strategies", default=ALL_STRATEGIES, help="comma-separated (default: %(default)s)")
    parser.add_argument("--gridworld-tasks", type=int, default=50)
    parser.add_argument(
        "--gridworld-budgets",
        default="48,96,192,384,768",
        help="tokens per task (a whole chain is at most 144; default: %(default)s)",
    )
    parser.add_argument("--webshop-tasks", type=int, default=8)
    parser.add_argument("--webshop-budgets", default="160,320", help="tokens per task (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "search_budget")
    parser.add_argument(
        "--sft-dir",
        type=Path,
        default=ROOT / "runs" / "search-budget" / "gridworld-sft",
        help="where the gridworld SFT model is built once and reused (default: %(default)s)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish the sweeps in --out that stopped (same settings) instead of starting over",
    )
    args = parser.parse_args()

    console = Console()
    args.threads = configure_threads()  # as the omrl commands do: a busy machine must not be oversubscribed
    for env in args.envs:
        if env == "gridworld":
            example = learn_gridworld()
            model = gridworld_sft(args.sft_dir, args.seed, console)
            sweep(env, str(model), [*example.ENV, *example.GENERATION], args, console)
        else:
            sweep(env, WEBSHOP_MODEL, WEBSHOP, args, console)


if __name__ == "__main__":
    main()
