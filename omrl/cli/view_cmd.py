"""``omrl view``: look at a run, a trajectory file or an eval report in the browser, or compare two evals."""

from __future__ import annotations

import typer


def read_by(store, side: str = "") -> dict[str, object]:
    """The files a store read, by their label: none of them may be what ``--out`` writes."""
    source = store.source
    files = [source.metrics, source.config, source.tokenizer, *source.trajectories, *source.records, *source.reports]
    of = f" of {side}" if side else ""
    return {f"the shown {source.label(path)}{of}": path for path in files if path is not None}


def view(
    paths: list[str] = typer.Argument(
        ...,
        help="A run directory, a trajectory .parquet or .jsonl, or an eval report .json; "
        "two of them (e.g. two eval folders) to compare them side by side.",
        metavar="PATH",
    ),
    port: int = typer.Option(
        None, "--port", min=0, max=65535, help="Port to serve on (default 8765, or the next free one; 0: any free one)."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to serve on. Loopback by default: anyone who can reach another address can read the run.",
    ),
    out: str = typer.Option(
        None,
        "--out",
        "-o",
        help="Write one self-contained HTML file instead of serving (opens offline; holds --max-episodes episodes).",
    ),
    max_episodes: int = typer.Option(
        200,
        "--max-episodes",
        min=1,
        help="With --out: how many episodes the file holds (the first ones; comparing, of each side, the changed "
        "ones first; the overview and curves are always whole).",
    ),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json, model directory or built-in model name for token text (default: the run's own).",
    ),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
) -> None:
    """Serve a page on loopback (or write one HTML file) showing the run's config, learning curves,
    episodes turn by turn, the tokens trained on, groups and search trees. On a run over several envs
    the episodes filter by env and each metric logged per env has a curve per env beside the overall one.
    Given two paths (two evals), the page compares them: their metrics side by side with the difference,
    and per task the episodes whose outcome changed, each a link to its own side's pages."""
    from pathlib import Path

    from rich.console import Console
    from rich.markup import escape

    from omrl.errors import OmrlError
    from omrl.view import open_run

    if len(paths) > 2:
        raise OmrlError(f"omrl view takes one path, or two to compare; got {len(paths)}: {' '.join(paths)}")
    console = Console()
    stores = [open_run(path, tokenizer) for path in paths]
    sides = ["A", "B"] if len(stores) == 2 else [""]  # the compare page's names of the two
    for side, store in zip(sides, stores):
        where = f"{side}: " if side else ""
        for problem in store.overview()["problems"]:
            colour = "red" if problem["level"] == "error" else "yellow"
            console.print(
                f"[{colour}]{problem['level']}:[/] {escape(where + problem['file'])}: {escape(problem['message'])}",
                highlight=False,
                soft_wrap=True,
            )
    if len(stores) == 2:
        from omrl.view.compare import Comparison

        shown = Comparison(*stores)
        for problem in shown.problems():
            console.print(f"[yellow]warning:[/] {escape(problem.message)}", highlight=False, soft_wrap=True)
        what = f"{' vs '.join(shown.names().values())}: " + " and ".join(str(len(s.summaries)) for s in stores)
    else:
        shown, what = stores[0], str(len(stores[0].summaries))
    total = sum(len(store.summaries) for store in stores)
    if out:
        from omrl.outputs import check_outputs
        from omrl.view.page import write_page

        names = ["the viewed path"] if len(paths) == 1 else ["the first viewed path", "the second viewed path"]
        inputs: dict[str, object] = dict(zip(names, paths))
        for side, store in zip(sides, stores):
            inputs.update(read_by(store, side))
        check_outputs({"--out": out}, inputs)
        if Path(out).suffix.lower() not in (".html", ".htm"):  # not a trajectory file or a report it would replace
            raise OmrlError(f"--out {out}: the page is one HTML file; give a path ending in .html, e.g. page.html")
        written, kept = write_page(shown, out, max_episodes)
        console.print(
            f"wrote {escape(str(written))} ({kept} of {total} episodes; opens offline)",
            highlight=False,
            soft_wrap=True,
        )
        return
    from omrl.view.server import LOOPBACK, make_server, serve_forever

    server = make_server(shown, host, port)
    if host not in LOOPBACK:
        console.print(
            f"[yellow]warning:[/] serving on {escape(host)}: anyone who can reach it can read this run", highlight=False
        )
    console.print(f"omrl view: {server.url} ({escape(what)} episodes; Ctrl-C stops)", highlight=False, soft_wrap=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    serve_forever(server)


def add_to(app: typer.Typer) -> None:
    app.command("view")(view)
