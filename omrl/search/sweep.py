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
the model's content, not only its path (:func:`model_content`): a model retrained at the same
path is refused rather than mixed into the table the earlier model started.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from omrl.atomic import atomic_write_bytes
from omrl.config.options import SweepRunConfig
from omrl.errors import ConfigError, EnvFailure, Interrupted, OmrlError
from omrl.evaluation import episodes_by_env

FORMAT = "omrl-sweep/1"
MARKERS = "osD^vP*X"  # lines that coincide (often all at 0% or 100%) stay told apart
# config keys that say which cells to play and where, not how: a resumed sweep may change them
NOT_SETUP = ("command", "description", "strategies", "budgets", "out", "resume")
CONTENT = "model_content"  # the setup key that says which model content the cells were played with
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
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


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend, or an OmrlError naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise OmrlError(
            "omrl sweep draws sweep.png with matplotlib, which is in the plot extra: pip install 'omrl[plot]'"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_strategies(session: Any, cfg: SweepRunConfig) -> None:
    """Run each strategy on no tasks: every check it makes before generating (its options, sampling,
    scorers, whether the env can fork for it) fails now, naming the env and what it lacks, rather
    than after the cells before it have played."""
    from omrl.rollout import PlaySpec
    from omrl.search.context import SearchContext, run_strategy

    for strategy, budget in dict(cells_of(cfg.strategies, cfg.budgets[:1])).items():
        for env in session.env_names:  # a mixture: each env
            spec = PlaySpec(cfg.env.split, seed=cfg.seed, strategy=strategy, budget=budget or 0)
            run_strategy(SearchContext.from_session(session, spec, env=env), [])


def setup_of(cfg: SweepRunConfig, tasks: Sequence[Any]) -> dict[str, Any]:
    """What every cell shares (the config less the cell list and output, plus the task ids; a
    mixture's tasks as [env, split, id]): a sweep resumes only cells played with the same setup."""
    from omrl.config import to_dict

    setup = {k: v for k, v in to_dict(cfg).items() if k not in NOT_SETUP}
    tasks = [list(t) if isinstance(t, tuple) else int(t) for t in tasks]
    setup = {**setup, CONTENT: model_content(cfg.model.name), "tasks": tasks}
    return json.loads(json.dumps(setup))  # as it reads back from the file


def model_content(name: str) -> dict[str, str]:
    """Which model a sweep plays, by content: a path names whatever is there now, and a model
    retrained at the same path must not add cells to the earlier model's table.

    For a local directory (a built-in name's included): ``manifest_sha256``, the sha256 of the
    :data:`~omrl.models.MODEL_MANIFEST` omrl writes beside a run's final model (itself the sha256 of
    every file, so any change to the weights changes it); for a directory without one (a Hugging
    Face download, an older omrl's model, a built-in), ``files_sha256``, the sha256 of its weights
    files' names, sizes and modification times (copying the model without keeping times counts as
    another model; a rewrite that keeps all three goes unseen). A hub id is identified by its name
    only (``hub_id``): the hub's cache keeps one revision a name.
    """
    from omrl.models import MODEL_MANIFEST, omrl_home
    from omrl.models.builtin import BUILTIN_MODELS

    path = omrl_home() / "models" / name if name in BUILTIN_MODELS else Path(name).expanduser()
    if not path.is_dir():
        return {"hub_id": name}
    manifest = path / MODEL_MANIFEST
    if manifest.is_file():
        return {"manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()}
    files = sorted(p for p in path.iterdir() if p.is_file())
    weights = [p for p in files if p.name.endswith(WEIGHTS_SUFFIXES)] or files
    listing = "".join(f"{p.name}\t{p.stat().st_size}\t{p.stat().st_mtime_ns}\n" for p in weights)
    return {"files_sha256": hashlib.sha256(listing.encode("utf-8")).hexdigest()}


def finished_cells(path: Path, setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells ``path`` holds when it was written with ``setup``; ConfigError when with another."""
    if not path.exists():
        return []
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        old, cells = record["setup"], record["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a sweep record ({exc}); give another --out, or resume=false to overwrite it"
        ) from exc
    _check_same_model(path, old, setup)
    changed = _differences(old, setup)
    if changed:
        raise ConfigError(
            f"{path} holds a sweep with other settings ({'; '.join(changed[:3])}); give another "
            "--out, or resume=false to start over there"
        )
    return list(cells)


def _check_same_model(path: Path, old: Any, setup: dict[str, Any]) -> None:
    """ConfigError when the cells in ``path`` were played by other model content than ``setup``'s,
    or when the record does not say (an older omrl wrote it): the two would share one table."""
    name = setup["model"]["name"]
    if not isinstance(old, dict) or CONTENT not in old:
        raise ConfigError(
            f"{path} does not record which model content its cells were played with (an older "
            f"omrl wrote it), so {name} now may not be the model they measured; give another "
            "--out, or resume=false to start over there"
        )
    if old[CONTENT] != setup[CONTENT]:
        raise ConfigError(
            f"{path} holds a sweep of another model at {name} ({_content_label(old[CONTENT])} "
            f"there, {_content_label(setup[CONTENT])} now: retrained or replaced since); its cells "
            "would mix two models in one table: give another --out, or resume=false to start over there"
        )


def _content_label(content: Any) -> str:
    """``{"manifest_sha256": "3f2a..."}`` as ``manifest sha256 3f2a...`` (12 hex digits tell models apart)."""
    if not isinstance(content, dict) or len(content) != 1:
        return _short(content)
    ((kind, value),) = content.items()
    return f"{kind.replace('_', ' ')} {str(value)[:12]}{'...' if len(str(value)) > 12 else ''}"


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(set(old) | set(new), key=str)
            for d in _differences(old.get(key), new.get(key), f"{path}.{key}" if path else key)
        ]
    return [] if old == new else [f"{path or 'setup'}: {_short(old)} there, {_short(new)} now"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def run_cell(
    session: Any, cfg: SweepRunConfig, tasks: Sequence[int], strategy: str, budget: int | None, progress: Any = None
) -> dict[str, Any]:
    """Play one cell: ``strategy`` at ``budget`` on ``tasks``, summarised as :func:`cell_summary` says."""
    from omrl.rollout import PlaySpec
    from omrl.search import play_strategy

    started = time.perf_counter()
    spec = PlaySpec(cfg.env.split, seed=cfg.seed, rewards=False, strategy=strategy, budget=budget or 0)
    trees = play_strategy(session, tasks, spec, progress).trees
    return cell_summary(trees, budget, time.perf_counter() - started, mixed=session.mixture)


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
            f"every task of {metrics['strategy']} at budget {budget} failed in the env, so nothing "
            f"was measured; the first reason: {chosen[0].error}"
        )
    n, p = len(trees), metrics["success_rate"]
    tokens = [tree.generated_tokens for tree in trees]
    cell = {
        "strategy": metrics["strategy"],
        "budget": budget,
        "tasks": n,
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
        "env_errors": sum(ep.end_reason == "env_error" for ep in chosen),
        "per_task": [
            {
                **({"env": ep.env} if mixed else {}),
                "task_id": ep.task_id,
                "won": ep.won,
                "score": ep.score,
                "generated_tokens": tree.generated_tokens,
                "exhausted": tree.exhausted,
            }
            for ep, tree in zip(chosen, trees)
        ],
    }
    if mixed:
        cell["per_env"] = {env: _success(eps) for env, eps in episodes_by_env(chosen).items()}
        cell["success_macro"] = sum(e["success_rate"] for e in cell["per_env"].values()) / len(cell["per_env"])
    return cell


def _success(chosen: Sequence[Any]) -> dict[str, Any]:
    """One env's part of a cell: its tasks, success of the chosen answers with its standard error, mean score."""
    n = len(chosen)
    p = sum(ep.won for ep in chosen) / n
    score = sum(ep.score for ep in chosen) / n
    return {"tasks": n, "success_rate": p, "success_se": math.sqrt(p * (1 - p) / n), "mean_score": score}


def run_sweep(
    cfg: SweepRunConfig, progress_bar: ProgressBar | None = None, log: Callable[[str], None] = lambda line: None
) -> dict[str, Any]:
    """Play every cell of ``cfg`` not finished yet, writing ``<out>/sweep.json`` and ``sweep.png`` after
    each; returns the record (``setup``, ``cells``). ``progress_bar(tasks, label)`` drives a display."""
    from omrl.rollout import RolloutSession

    check_sweep(cfg)
    out = Path(cfg.out)
    with RolloutSession.from_config(cfg) as session:
        tasks = session.task_ids(cfg.env.split, cfg.num_tasks)
        setup = setup_of(cfg, tasks)
        cells = finished_cells(out / "sweep.json", setup) if cfg.resume else []
        check_strategies(session, cfg)
        done = {(c["strategy"], c["budget"]) for c in cells}
        todo = [cell for cell in cells_of(cfg.strategies, cfg.budgets) if cell not in done]
        if cells:
            log(f"resuming {out / 'sweep.json'}: {len(cells)} cells done, {len(todo)} to play")
        for strategy, budget in todo:
            bar, progress = progress_bar(len(tasks), cell_label(strategy, budget)) if progress_bar else (None, None)
            try:
                with bar or contextlib.nullcontext():
                    cells.append(run_cell(session, cfg, tasks, strategy, budget, progress))
            except KeyboardInterrupt as stop:
                kept = f"the {len(cells)} finished cells are in {out / 'sweep.json'}" if cells else "no cell finished"
                raise Interrupted(
                    f"interrupted during {cell_label(strategy, budget)}; {kept}. The same command "
                    "again plays the cells not finished (resume=true)."
                ) from stop
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


def plot_png(record: dict[str, Any], dpi: int = 120) -> bytes:
    """Success (%) against tokens generated per task, one line per strategy with standard-error bars,
    each point labelled with its budget; chain (pass@1) is one point and a dashed line."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    strategies = list(dict.fromkeys(c["strategy"] for c in record["cells"]))
    for index, strategy in enumerate(strategies):
        color = f"C{index % 10}"
        mine = sorted(
            (c for c in record["cells"] if c["strategy"] == strategy), key=lambda c: c["generated_tokens_per_task"]
        )
        xs = [c["generated_tokens_per_task"] for c in mine]
        ys = [100 * c["success_rate"] for c in mine]
        errors = [100 * c["success_se"] for c in mine]
        if all(c["budget"] is None for c in mine):  # pass@1: no budget to vary
            axes.axhline(ys[0], color=color, linestyle="--", linewidth=1, alpha=0.6)
            label = f"{strategy} (pass@1, no budget)"
        else:
            label = strategy
        axes.errorbar(
            xs, ys, yerr=errors, color=color, marker=MARKERS[index % len(MARKERS)], markersize=5, capsize=3, label=label
        )
        for c, x, y in zip(mine, xs, ys):
            if c["budget"] is not None:
                axes.annotate(
                    str(c["budget"]), (x, y), textcoords="offset points", xytext=(3, 4), fontsize=7, color=color
                )
    tokens = [c["generated_tokens_per_task"] for c in record["cells"]]
    if tokens and min(tokens) > 0 and max(tokens) / min(tokens) > 4:  # budgets usually double: even steps
        from matplotlib.ticker import FuncFormatter, NullFormatter

        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
    setup = record["setup"]
    axes.set_xlabel("tokens generated per task (points: budget)")
    axes.set_ylabel(f"success on {len(setup['tasks'])} tasks (%)")
    axes.set_ylim(-5, 105)
    axes.set_title(
        f"{Path(setup['model']['name']).name} on {env_title(setup['env'])} ({setup['env']['split']}): success vs tokens",
        fontsize=10,
    )
    axes.grid(alpha=0.3)
    if strategies:
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    return buffer.getvalue()


def env_title(env: dict[str, Any]) -> str:
    """The env a sweep played, for titles: its name, or a mixture's envs joined by " + " (their weights
    say nothing here: a sweep plays the same tasks of each env)."""
    from omrl.mixture import parse_env_spec

    entries = [e if isinstance(e, str) else str(e.get("name")) for e in env.get("mix") or []] or [env["name"]]
    return " + ".join(name for entry in entries for name, _ in parse_env_spec(entry))


def sweep_table(record: dict[str, Any]):
    """A rich Table with one row per cell."""
    from rich import box
    from rich.table import Table

    setup = record["setup"]
    title = (
        f"sweep: {setup['model']['name']} on {env_title(setup['env'])} ({setup['env']['split']}, "
        f"{len(setup['tasks'])} tasks, seed {setup['seed']})"
    )
    caption = (
        "success of the chosen answers (se: its standard error), any: some path won, tok/task and max: tokens "
        "generated per task, used: tok/task / budget, exh: tasks that ran out of budget"
    )
    # no outer edge and one space between columns: eleven columns fit 80 characters
    table = Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True
    )
    for name in ("strategy", "budget", "success", "se", "any", "score", "tok/task", "max", "used", "exh", "sec"):
        table.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=True)
    for c in record["cells"]:
        budget = c["budget"]
        table.add_row(
            c["strategy"],
            "pass@1" if budget is None else str(budget),
            f"{100 * c['success_rate']:.1f}%",
            f"{100 * c['success_se']:.1f}",
            f"{100 * c['any_success_rate']:.1f}%",
            f"{c['mean_score']:.3f}",
            f"{c['generated_tokens_per_task']:.0f}",
            str(c["max_generated_tokens"]),
            "-" if c["budget_used"] is None else f"{100 * c['budget_used']:.0f}%",
            f"{c['budget_exhausted']}/{c['tasks']}",
            f"{c['wall_seconds']:.0f}",
        )
    return table
