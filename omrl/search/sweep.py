"""Test-time scaling: success against generated tokens, for several strategies at several budgets.

A sweep plays every (strategy, budget) *cell* on the same tasks with the same model,
seed and settings, through :func:`~omrl.search.play_strategy` (exactly what ``omrl eval
--strategy S --budget B`` plays), and records per cell the success rate of the chosen
answers with its standard error, the mean score, the tokens generated per task against
the budget, and the wall time. A strategy that plays the batched rollout without a budget
(it declares ``batched_without_budget``, as ``chain`` does: :class:`~omrl.search.StrategyTraits`)
is pass@1, one sample a task with no budget: it is one cell (``budget`` null), drawn as one
point and a dashed line across the plot.

Strategies also stop at their own limits (``best_of_n``'s ``n``, ``mcts``'s
``iterations``, ``dfsdt``'s ``max_expansions``, a won episode), so at large budgets the
tokens used can stay well below the budget; the curve's x axis is the tokens actually
generated. Their options (``plugins.<name>``) are the same at every budget.

``<out>/sweep.json`` and ``<out>/sweep.png`` are rewritten atomically after every cell,
so a run that stops keeps what it finished, and running it again with the same settings
(``resume``, on by default) plays only the cells not in the JSON yet. The same settings include
the model's content, not only its path (:func:`~omrl.search.sweep_resume.model_content`): a model
retrained at the same path is refused rather than mixed into the table the earlier model started.

Which cells may resume is :mod:`omrl.search.sweep_resume`; the picture and the table are
:mod:`omrl.search.sweep_display`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from omrl.atomic import atomic_write_bytes
from omrl.config.options import SweepRunConfig
from omrl.env_errors import measured
from omrl.errors import ConfigError, EnvFailure, Interrupted, OmrlError
from omrl.evaluation import episodes_by_env
from omrl.search.sweep_display import plot_png, require_matplotlib, sweep_table
from omrl.search.sweep_resume import finished_cells, model_content, read_record, setup_of

__all__ = [
    "SweepRunConfig",
    "cell_label",
    "cell_spec",
    "cell_summary",
    "cells_of",
    "check_strategies",
    "check_sweep",
    "model_content",
    "pass_at_1",
    "run_cell",
    "run_sweep",
    "sweep_table",
    "write_sweep",
]

FORMAT = "omrl-sweep/1"
ProgressBar = Callable[[int, str], tuple[Any, Any]]  # (total, label) -> (context manager, RolloutProgress)


def cells_of(strategies: Sequence[str], budgets: Sequence[int]) -> list[tuple[str, int | None]]:
    """The (strategy, budget) cells of a sweep, in play order; a pass@1 strategy's one cell has budget None.

    >>> cells_of(["chain", "beam"], [500, 1000])
    [('chain', None), ('beam', 500), ('beam', 1000)]
    """
    once = [s for s in strategies if pass_at_1(s)]
    return [(s, None) for s in once] + [(s, b) for s in strategies if s not in once for b in budgets]


def pass_at_1(strategy: str) -> bool:
    """Whether ``strategy`` is swept once, with no budget: it plays the batched rollout without one."""
    from omrl.search.context import plays_batched

    return plays_batched(strategy, 0)


def check_sweep(cfg: SweepRunConfig) -> None:
    """Fail before any model loads: unknown strategies, bad budgets, no tasks, no matplotlib."""
    from omrl import registry

    if not cfg.strategies:
        raise ConfigError(f"no strategies to sweep; valid: {', '.join(registry.strategies.names())}")
    for name, values in (("strategies", cfg.strategies), ("budgets", cfg.budgets)):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(f"{name} lists {', '.join(twice)} more than once; give each once")
    for strategy in cfg.strategies:
        registry.strategies.get(strategy)  # an unknown name lists the valid ones
    if not all(pass_at_1(s) for s in cfg.strategies):
        if not cfg.budgets:
            raise ConfigError("no budgets to sweep; valid: positive whole numbers, e.g. budgets=[500,1000,2000]")
        reply = cfg.generation.max_new_tokens
        for budget in cfg.budgets:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise ConfigError(
                    f"budget {budget!r} is invalid; valid: a whole number of tokens >= {reply} "
                    "(generation.max_new_tokens: one whole reply)"
                )
            if budget < reply:  # search would stop before its first reply
                raise ConfigError(
                    f"budget {budget} is smaller than one reply (generation.max_new_tokens={reply}); "
                    f"valid: budgets of at least {reply} tokens"
                )
    if cfg.num_tasks < 1:
        raise ConfigError(f"num_tasks={cfg.num_tasks} is invalid; valid: a whole number >= 1")
    require_matplotlib()


def check_strategies(session: Any, cfg: SweepRunConfig, search_temperature: float | None = None) -> None:
    """Run each strategy on no tasks: every check it makes before generating (its options, sampling,
    scorers, whether the env can fork for it) fails now, naming the env and what it lacks, rather
    than after the cells before it have played."""
    from omrl.search.context import SearchContext, run_strategy

    for strategy, budget in dict(cells_of(cfg.strategies, cfg.budgets[:1])).items():
        for env in session.env_names:  # a mixture: each env
            spec = cell_spec(session, cfg, strategy, budget, search_temperature)
            run_strategy(SearchContext.from_session(session, spec, env=env), [])


def cell_spec(
    session: Any, cfg: SweepRunConfig, strategy: str, budget: int | None, search_temperature: float | None = None
) -> Any:
    """How a cell plays (a :class:`~omrl.rollout.PlaySpec`): the session's limits, except that a cell that
    searches samples at ``search_temperature`` where one is given (as ``omrl eval`` samples a search whose
    decoding is greedy by default; the chain's pass@1 stays greedy)."""
    from omrl.rollout import PlaySpec
    from omrl.search.context import plays_batched

    searching = not plays_batched(strategy, budget or 0)
    limits = (
        dataclasses.replace(session.limits, temperature=search_temperature)
        if searching and search_temperature is not None
        else None
    )
    return PlaySpec(cfg.env.split, seed=cfg.seed, rewards=False, strategy=strategy, budget=budget or 0, limits=limits)


def run_cell(
    session: Any,
    cfg: SweepRunConfig,
    tasks: Sequence[int],
    strategy: str,
    budget: int | None,
    progress: Any = None,
    search_temperature: float | None = None,
) -> dict[str, Any]:
    """Play one cell: ``strategy`` at ``budget`` on ``tasks`` (as :func:`cell_spec` says), summarised as
    :func:`cell_summary` says, with the temperature it sampled at."""
    from omrl.search import play_strategy

    started = time.perf_counter()
    spec = cell_spec(session, cfg, strategy, budget, search_temperature)
    trees = play_strategy(session, tasks, spec, progress).trees
    cell = cell_summary(trees, budget, time.perf_counter() - started, mixed=session.mixture)
    return {**cell, "temperature": (spec.limits or session.limits).temperature}


def cell_summary(trees: Sequence[Any], budget: int | None, seconds: float, mixed: bool = False) -> dict[str, Any]:
    """A cell's numbers: success of the chosen answers with its standard error (sqrt(p(1 - p) / n)
    over the tasks), mean score, tokens generated per task (mean and most) against the budget,
    wall seconds, and each task's outcome (for paired comparisons between cells). On a mixture
    (``mixed``) each task names its env, and ``per_env`` and ``success_macro`` (the mean of the
    envs' success, each env alike) are added."""
    from omrl.search import chosen_episodes, search_metrics

    metrics = search_metrics(trees)
    chosen = chosen_episodes(trees)
    if all(ep.end_reason == "env_error" for ep in chosen):  # a broken env, not a model scoring 0
        raise EnvFailure(
            f"every task of {cell_label(metrics['strategy'], budget)} failed in the env, so nothing "
            f"was measured; the first reason: {chosen[0].error}"
        )
    n, p = len(trees) - metrics["env_errors"], metrics["success_rate"]  # the tasks that measured the model
    tokens = [tree.generated_tokens for tree in trees]
    cell = {
        "strategy": metrics["strategy"],
        "budget": budget,
        "tasks": len(trees),
        "success_rate": p,
        "success_se": math.sqrt(p * (1 - p) / n),
        "any_success_rate": metrics["any_success_rate"],
        "mean_score": metrics["mean_score"],
        "generated_tokens_per_task": metrics["generated_tokens_per_task"],
        "max_generated_tokens": max(tokens),
        "budget_used": metrics["generated_tokens_per_task"] / budget if budget else None,
        "budget_exhausted": metrics["budget_exhausted"],
        "nodes_per_task": metrics["nodes_per_task"],
        "wall_seconds": seconds,
        "env_errors": metrics["env_errors"],
        "per_task": [
            {
                **({"env": ep.env} if mixed else {}),
                "task_id": ep.task_id,
                "won": ep.won,
                "score": ep.score,
                "env_error": ep.end_reason == "env_error",  # not measured: no win, no loss, in pairings too
                "generated_tokens": tree.generated_tokens,
                "exhausted": tree.exhausted,
            }
            for ep, tree in zip(chosen, trees)
        ],
    }
    if mixed:
        cell["per_env"] = {env: _success(eps) for env, eps in episodes_by_env(chosen).items()}
        rates = [e["success_rate"] for e in cell["per_env"].values() if e["success_rate"] is not None]
        cell["success_macro"] = sum(rates) / len(rates) if rates else None  # an env nothing measured: no rate
    return cell


def _success(chosen: Sequence[Any]) -> dict[str, Any]:
    """One env's part of a cell: its tasks, success of the chosen answers with its standard error, mean
    score, over the answers the env did not fail in (as ``omrl eval`` counts them)."""
    answers = measured(chosen)
    n = len(answers)
    p = sum(ep.won for ep in answers) / n if n else None  # none measured: no rate, and out of the macro
    return {
        "tasks": len(chosen),
        "success_rate": p,
        "success_se": math.sqrt(p * (1 - p) / n) if n else None,
        "mean_score": sum(ep.score for ep in answers) / n if n else None,
        "env_errors": len(chosen) - n,
    }


def run_sweep(
    cfg: SweepRunConfig,
    progress_bar: ProgressBar | None = None,
    log: Callable[[str], None] = lambda line: None,
    search_temperature: float | None = None,
) -> dict[str, Any]:
    """Play every cell of ``cfg`` not finished yet, writing ``<out>/sweep.json`` and ``sweep.png`` after
    each; returns the record (``setup``, ``cells``). ``progress_bar(tasks, label)`` drives a display;
    ``search_temperature``: the temperature of the cells that search (None: ``cfg``'s, as every cell's;
    ``omrl sweep`` gives one when decoding is greedy by default, as ``omrl eval`` samples a search)."""
    from omrl.rollout import RolloutSession

    check_sweep(cfg)
    out = Path(cfg.out)
    if cfg.resume:
        read_record(out / "sweep.json")  # a damaged record is refused before the model loads
    with RolloutSession.from_config(cfg) as session:
        tasks = session.task_ids(cfg.env.split, cfg.num_tasks)
        setup = setup_of(cfg, tasks)
        if search_temperature is not None:  # cells played at another temperature are not these cells
            setup["search_temperature"] = search_temperature
        cells = finished_cells(out / "sweep.json", setup) if cfg.resume else []
        check_strategies(session, cfg, search_temperature)
        wanted = cells_of(cfg.strategies, cfg.budgets)
        # a cell the env failed in on some tasks did not measure them: played again, whole
        again = [c for c in cells if c["env_errors"] and (c["strategy"], c["budget"]) in wanted]
        cells = [c for c in cells if c not in again]
        done = {(c["strategy"], c["budget"]) for c in cells}
        todo = [cell for cell in wanted if cell not in done]
        if cells or again:
            replay = f" ({len(again)} again: the env failed on some of their tasks)" if again else ""
            log(f"resuming {out / 'sweep.json'}: {len(cells)} cells done, {len(todo)} to play{replay}")
        for strategy, budget in todo:
            bar, progress = progress_bar(len(tasks), cell_label(strategy, budget)) if progress_bar else (None, None)
            try:
                with bar or contextlib.nullcontext():
                    cells.append(run_cell(session, cfg, tasks, strategy, budget, progress, search_temperature))
            except KeyboardInterrupt as stop:
                kept = f"the {len(cells)} finished cells are in {out / 'sweep.json'}" if cells else "no cell finished"
                raise Interrupted(
                    f"interrupted during {cell_label(strategy, budget)}; {kept}. The same command "
                    "again plays the cells not finished (resume=true)."
                ) from stop
            except OmrlError as failed:  # a cell that failed: what was kept, as a stop says
                if not cells:
                    raise
                raise type(failed)(
                    f"{failed} (in {cell_label(strategy, budget)}); the {len(cells)} finished cells are in "
                    f"{out / 'sweep.json'}: once that is fixed, the same command plays the cells not finished"
                ) from failed
            write_sweep(out, {"format": FORMAT, "setup": setup, "cells": _ordered(cells, cfg.strategies)})
    record = {"format": FORMAT, "setup": setup, "cells": _ordered(cells, cfg.strategies)}
    if not todo:  # every cell was done already: only the picture is drawn again
        write_sweep(out, record)
    return record


def cell_label(strategy: str, budget: int | None) -> str:
    return f"{strategy} (pass@1)" if budget is None else f"{strategy} @ {budget} tokens"


def _ordered(cells: list[dict[str, Any]], strategies: Sequence[str]) -> list[dict[str, Any]]:
    """Cells by strategy (in the order asked, then any others the file held), then budget."""
    rank = {s: i for i, s in enumerate(strategies)}
    return sorted(cells, key=lambda c: (rank.get(c["strategy"], len(rank)), c["strategy"], c["budget"] or 0))


def write_sweep(out: Path, record: dict[str, Any]) -> tuple[Path, Path]:
    """``<out>/sweep.json`` and ``<out>/sweep.png``, each written whole or not at all."""
    from omrl.atomic import atomic_write_text
    from omrl.data.trajectory import to_json

    json_path, png_path = out / "sweep.json", out / "sweep.png"
    atomic_write_text(json_path, to_json(record, indent=2) + "\n")  # strict JSON: no NaN
    atomic_write_bytes(png_path, plot_png(record))
    return json_path, png_path
