"""``omrl plot``: a run's learning curves as PNG files, one per panel of the page.

matplotlib is an optional extra (``pip install 'omrl[plot]'``); it is imported only here,
when plotting, and its absence is one clear error.
"""

from __future__ import annotations

import os
from pathlib import Path

from omrl.atomic import atomic_save_figure
from omrl.errors import OmrlError
from omrl.view.metrics import columns, panels, read_metrics_file
from omrl.view.sources import Problem, discover


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or an OmrlError naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise OmrlError("omrl plot needs matplotlib, which is in the plot extra: pip install 'omrl[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(
    run: str | os.PathLike, out_dir: str | os.PathLike | None = None, only: list[str] | None = None, dpi: int = 150
) -> tuple[list[Path], list[Problem]]:
    """Write ``<panel>.png`` for each panel of ``run``'s metrics.jsonl into ``out_dir``
    (default ``<run>/plots``); ``only`` keeps the panels whose name or metric keys it lists.
    Returns the files written and the problems met reading the metrics."""
    source = discover(run)
    if source.metrics is None:
        raise OmrlError(
            f"{run}: no metrics.jsonl to plot (omrl train and omrl sft write one in their output directory)"
        )
    records, problems = read_metrics_file(source.metrics, source.label(source.metrics))
    curves = columns(records)
    if not curves["step"]:
        raise OmrlError(f"{source.metrics}: no step to plot" + "".join(f"; {p.message}" for p in problems))
    chosen = panels(list(curves["series"]))
    if only:
        chosen = [p for p in chosen if p["name"] in only or any(k in only for k in p["keys"])]
        if not chosen:
            names = sorted({p["name"] for p in panels(list(curves["series"]))} | set(curves["series"]))
            raise OmrlError(f"--metric {','.join(only)}: no such panel or metric; valid: {', '.join(names)}")
    plt = require_matplotlib()
    run_dir = source.path if source.path.is_dir() else source.path.parent
    target = Path(out_dir) if out_dir is not None else run_dir / "plots"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in chosen:
        figure, axes = plt.subplots(figsize=(5.5, 3.4))
        for key in panel["keys"]:
            points = [(s, v) for s, v in zip(curves["step"], curves["series"][key]) if v is not None]
            if points:
                steps, values = zip(*points)
                axes.plot(steps, values, marker="o" if len(points) <= 40 else None, markersize=3, label=key)
        axes.set_title(panel["title"])
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if len(panel["keys"]) > 1:
            axes.legend(fontsize=8)
        figure.tight_layout()
        path = target / f"{panel['name']}.png"
        atomic_save_figure(figure, path, dpi)  # a crash never leaves a half-written PNG
        plt.close(figure)
        written.append(path)
    return written, problems
