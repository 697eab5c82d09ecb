"""``omrl plugins``: every registered component, its kind and where it comes from."""

from __future__ import annotations

import inspect
import json
from typing import Any

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
    """List every registered env, reward, template, algorithm, rollout strategy and scorer. Exits 2, after
    the list, where two plugins' components of other kinds share a name (a run that uses either fails)."""
    from omrl.registry import all_components

    rows = sorted(all_components(), key=lambda c: (c.kind, c.name))
    _list(rows, as_json, kind, every)
    _refuse_clashes(rows)


def _refuse_clashes(rows: list[Any]) -> None:
    from omrl.errors import PluginError
    from omrl.registry import name_clashes

    clashes = name_clashes(rows)
    if clashes:
        raise PluginError("; ".join(clashes))


def _list(rows: list[Any], as_json: bool, kind: str | None, every: bool) -> None:
    if kind:
        kinds = sorted({c.kind for c in rows})
        rows = [c for c in rows if c.kind == kind]
        if not rows and kind not in kinds:
            import difflib

            from omrl.errors import UnknownNameError

            close = difflib.get_close_matches(kind, kinds, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(f"unknown kind {kind!r}.{hint} Valid: {', '.join(kinds)}")
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
                        **({"options": options_of(c)} if c.kind in OPTIONS_AFTER else {}),
                    }
                    for c in rows
                ],
                indent=2,
                default=str,  # an option's default JSON cannot hold: as text
            )
        )
        return
    shown = table_rows(rows, every)
    options = {(c.kind, c.name): options_line(c) for c in rows if c.kind in OPTIONS_AFTER}
    options.update(family_options(rows, shown))
    console = Console()
    if not console.is_terminal:  # piped (grep, a file): a whole line a component, no table cut to 80 columns
        for row in shown:
            typer.echo("  ".join(cell for cell in (*row, options.get(row[:2], "")) if cell))
        return
    table = Table(title="omrl plugins")
    for i, col in enumerate(("kind", "name", "distribution")):
        table.add_column(col, no_wrap=True, min_width=max((len(row[i]) for row in shown), default=0))
    table.add_column("description", no_wrap=True, overflow="ellipsis")  # one line a component: --json has it whole
    if options:
        table.add_column("options (plugins.NAME.*)")
    for row in shown:
        cells = (*row, options.get(row[:2], "")) if options else row
        table.add_row(*(Text(cell) for cell in cells))  # text, not markup
    console.print(table)


#: each kind that takes ``plugins.<name>.*`` options, and the parameters before them: an env's or a template's
#: are its ``__init__``'s, a reward's follow its episodes, a strategy's (ctx, tasks), a scorer's (nodes, ctx)
OPTIONS_AFTER = {"env": 0, "template": 0, "reward": 1, "strategy": 2, "scorer": 2}


def options_of(component: Any) -> dict[str, Any] | None:
    """The options a component takes (``plugins.<name>.*``) with their defaults, from its signature;
    None for one registered by an import path (listing imports nothing), without a signature, or taking any."""
    if isinstance(component.target, str):
        return None
    try:
        signature = inspect.signature(component.target)
    except (TypeError, ValueError):  # a builtin: its call decides
        return None
    params = list(signature.parameters.values())[OPTIONS_AFTER[component.kind] :]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name: None if p.default is p.empty else p.default for p in params if p.kind is not p.VAR_POSITIONAL}


def options_line(component: Any) -> str:
    """``options_of`` as one line in config syntax: ``width=2, stop_on_win=true, select=''``; "" for none."""
    taken = options_of(component)
    if taken is None:
        return ""
    if not taken:
        return "options: none"

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, str):
            return repr(value) if not value else value if len(value) <= 24 else f"{value[:23]}…"
        return str(value)

    return "options: " + ", ".join(f"{name}={shown(value)}" for name, value in taken.items())


def family_options(components: list, shown: list[tuple[str, ...]]) -> dict[tuple[str, str], str]:
    """The options line of each family row (``gem:* (12)``): its members', where they all take the same."""
    out = {}
    for kind, name, *_ in shown:
        if kind == "env" and name.endswith(")") and ":* (" in name:
            family = name.split(":", 1)[0]
            lines = {options_line(c) for c in components if c.kind == "env" and c.name.startswith(f"{family}:")}
            out[(kind, name)] = lines.pop() if len(lines) == 1 else "options: each env's own (--all)"
    return out


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
