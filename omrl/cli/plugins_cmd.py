"""``omrl plugins``: every registered component, its kind and where it comes from."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    kind: str = typer.Option(
        None,
        "--kind",
        help="Only this kind: env, reward, template, advantage, policy_loss, kl, rollout_correction, strategy, scorer.",
    ),
    every: bool = typer.Option(False, "--all", help="Every env of a family, one row each (default: a row a family)."),
) -> None:
    """List every registered env, reward, template, algorithm, rollout strategy and scorer."""
    from omrl.registry import all_components

    rows = sorted(all_components(), key=lambda c: (c.kind, c.name))
    if kind:
        kinds = sorted({c.kind for c in rows})
        rows = [c for c in rows if c.kind == kind]
        if not rows and kind not in kinds:
            from omrl.errors import UnknownNameError

            raise UnknownNameError(f"unknown kind {kind!r}; valid: {', '.join(kinds)}")
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "kind": c.kind,
                        "name": c.name,
                        "plugin": c.plugin,
                        "distribution": c.distribution,
                        "description": c.description,
                    }
                    for c in rows
                ],
                indent=2,
            )
        )
        return
    shown = table_rows(rows, every)
    console = Console()
    if not console.is_terminal:  # piped (grep, a file): a whole line a component, no table cut to 80 columns
        for row in shown:
            typer.echo("  ".join(cell for cell in row if cell))
        return
    table = Table(title="omrl plugins")
    for i, col in enumerate(("kind", "name", "distribution")):
        table.add_column(col, no_wrap=True, min_width=max((len(row[i]) for row in shown), default=0))
    table.add_column("description", no_wrap=True, overflow="ellipsis")  # one line a component: --json has it whole
    for row in shown:
        table.add_row(*(Text(cell) for cell in row))  # text, not markup
    console.print(table)


def table_rows(components: list, every: bool) -> list[tuple[str, str, str, str]]:
    """(kind, name, distribution, description) a row; envs named ``family:member`` as one row per
    family unless ``every`` (330 env rows once came before the rest)."""
    rows: list = []
    families: dict[str, list] = {}  # family -> its members, the first at the family's row
    for c in components:
        if every or c.kind != "env" or ":" not in c.name:
            rows.append((c.kind, c.name, c.distribution, c.description))
            continue
        family = c.name.split(":", 1)[0]
        if family not in families:
            families[family] = []
            rows.append(families[family])  # the family's place, filled in once it is counted
        families[family].append(c)
    for i, row in enumerate(rows):
        if isinstance(row, list):
            first, family, count = row[0], row[0].name.split(":", 1)[0], len(row)
            rows[i] = (
                ("env", f"{family}:* ({count})", first.distribution, f"{count} envs: omrl env list '{family}:*'")
                if count > 1
                else ("env", first.name, first.distribution, first.description)
            )
    return rows


def add_to(app: typer.Typer) -> None:
    app.command("plugins")(plugins)
