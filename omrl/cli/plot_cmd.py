"""``omrl plot``: a run's learning curves as PNG, for papers and READMEs."""

from __future__ import annotations

import typer


def plot(
    run: str = typer.Argument(..., help="A run directory (or its metrics.jsonl)."),
    out: str = typer.Option(None, "--out", "-o", help="Folder for the PNG files (default: RUN/plots)."),
    metric: list[str] = typer.Option(
        None,
        "--metric",
        "-m",
        help="Only these panels or metrics (repeatable), e.g. -m reward -m kl; on a run over several envs "
        "-m success also draws by-env/success.png (success and success/<env> for each env).",
    ),
    dpi: int = typer.Option(150, "--dpi", min=1, help="Resolution of the PNG files."),
) -> None:
    """Write one PNG per group of curves (reward and its components, success, KL, entropy, loss,
    lengths, step time, throughput, ...) from metrics.jsonl. On a run over several envs, each metric
    logged per env also gets by-env/<metric>.png: the overall curve and one line per env (e.g.
    by-env/success.png draws success and success/<env> for each env). Needs the plot extra (matplotlib)."""
    from rich.console import Console
    from rich.markup import escape

    from omrl.view.plot import plot_run, require_matplotlib

    require_matplotlib()  # before reading anything: a missing extra is the first thing to say
    console = Console()
    written, problems = plot_run(run, out, metric or None, dpi)
    for problem in problems:
        console.print(f"[yellow]warning:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    for path in written:
        console.print(f"wrote {escape(str(path))}", highlight=False, soft_wrap=True)


def add_to(app: typer.Typer) -> None:
    app.command("plot")(plot)
