"""``omrl plot``: a run's learning curves as PNG files, one per panel of the page.

On a run over several envs, each metric logged per env (``success/<env>``) also gets
``by-env/<metric>.png``: its overall curve and one line per env (:func:`omrl.view.metrics.env_panels`).

matplotlib is an optional extra (``pip install 'omrl[plot]'``); it is imported only here,
when plotting, and its absence is one clear error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omrl.atomic import atomic_save_figure
from omrl.errors import OmrlError
from omrl.outputs import check_output_folder
from omrl.view.metrics import columns, env_panels, panels, read_metrics_file
from omrl.view.sources import Problem, discover

BY_ENV_DIR = "by-env"


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or an OmrlError naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise OmrlError("omrl plot needs matplotlib, which is in the plot extra: pip install 'omrl[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plan(keys: list[str], only: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(file, panel)`` for each PNG to write for these metric keys: ``<panel>.png`` per panel, then
    ``by-env/<metric>.png`` per metric logged per env. ``only`` keeps the panels whose name or metric keys
    it lists, and the by-env panels of the metrics it lists (``-m success``: ``success.png`` and
    ``by-env/success.png``) or whose per-env keys it lists (``-m success/gridworld``)."""
    planned = [(f"{p['name']}.png", p) for p in panels(keys)]
    planned += [(f"{BY_ENV_DIR}/{p['name']}.png", p) for p in env_panels(keys)]
    if not only:
        return planned
    chosen = [(f, p) for f, p in planned if p["name"] in only or p.get("metric") in only or set(p["keys"]) & set(only)]
    if not chosen:
        names = sorted({p["name"] for _, p in planned} | set(keys))
        raise OmrlError(f"--metric {','.join(only)}: no such panel or metric; valid: {', '.join(names)}")
    return chosen


def draw(panel: dict[str, Any], curves: dict[str, Any], plt: Any) -> Any:
    """The matplotlib figure of one panel: a line per key with data, labelled by the panel's labels
    (a by-env panel's: the envs) or keys."""
    figure, axes = plt.subplots(figsize=(5.5, 3.4))
    labels = panel.get("labels") or panel["keys"]
    for key, label in zip(panel["keys"], labels):
        points = [(s, v) for s, v in zip(curves["step"], curves["series"][key]) if v is not None]
        if points:
            steps, values = zip(*points)
            style = "--" if key == panel.get("metric") else "-"  # a by-env panel's overall curve, dashed
            axes.plot(steps, values, style, marker="o" if len(points) <= 40 else None, markersize=3, label=label)
    axes.set_title(panel["title"])
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if len(panel["keys"]) > 1 or "metric" in panel:  # a by-env panel names its env even when it draws one
        axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def plot_run(
    run: str | os.PathLike, out_dir: str | os.PathLike | None = None, only: list[str] | None = None, dpi: int = 150
) -> tuple[list[Path], list[Problem]]:
    """Write the PNG files :func:`plan` names for ``run``'s metrics.jsonl into ``out_dir``
    (default ``<run>/plots``). Returns the files written and the problems met reading the metrics."""
    if not Path(run).expanduser().exists():  # discover's own message names inputs the viewer reads, not plot
        raise OmrlError(
            f"{run}: no such file or directory; give a run directory of omrl train or sft (or its metrics.jsonl)"
        )
    source = discover(run)
    run_dir = source.path if source.path.is_dir() else source.path.parent
    target = Path(out_dir) if out_dir is not None else run_dir / "plots"
    check_output_folder("--out" if out_dir is not None else "the plots folder", target, f"{target}-plots")
    if source.metrics is None:
        raise OmrlError(
            f"{run}: no metrics.jsonl to plot (omrl train and omrl sft write one in their output directory)"
        )
    records, problems = read_metrics_file(source.metrics, source.label(source.metrics))
    curves = columns(records)
    if not curves["step"]:
        raise OmrlError(f"{source.metrics}: no step to plot" + "".join(f"; {p.message}" for p in problems))
    chosen = plan(list(curves["series"]), only)
    plt = require_matplotlib()
    written = []
    for name, panel in chosen:
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        figure = draw(panel, curves, plt)
        atomic_save_figure(figure, path, dpi)  # a crash never leaves a half-written PNG
        plt.close(figure)
        written.append(path)
    return written, problems
