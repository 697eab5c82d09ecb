"""How a sweep record is shown: ``sweep.png`` (success against tokens generated per task, one line per
strategy) and the terminal table, one row per cell."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from omrl.errors import OmrlError

MARKERS = "osD^vP*X"  # lines that coincide (often all at 0% or 100%) stay told apart


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
    failed = any(c.get("env_errors") for c in record["cells"])  # a column only when some task was not measured
    if failed:
        caption += ", err: tasks the env failed in (no win, no loss)"
    # no outer edge and one space between columns: eleven columns (twelve with err) fit 80 characters
    table = Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True
    )
    names = ("strategy", "budget", "success", "se", "any", "score", "tok/task", "max", "used", "exh", "sec")
    for name in (*names, *(["err"] if failed else [])):
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
            *([str(c.get("env_errors", 0))] if failed else []),
        )
    return table
