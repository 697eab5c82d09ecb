"""``omrl plugins``: every registered component, its kind and where it comes from."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    kind: str = typer.Option(None, "--kind", help="Only this kind: env, reward, template, advantage, policy_loss, kl."),
) -> None:
    """List every registered env, reward, template and algorithm."""
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
    table = Table(title="omrl plugins")
    for col in ("kind", "name", "distribution", "description"):
        table.add_column(col)
    for c in rows:
        table.add_row(*(Text(cell) for cell in (c.kind, c.name, c.distribution, c.description)))  # text, not markup
    Console().print(table)


def add_to(app: typer.Typer) -> None:
    app.command("plugins")(plugins)
