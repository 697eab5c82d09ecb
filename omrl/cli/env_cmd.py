"""``omrl env``: list the registered envs, serve one over HTTP, play one in the terminal."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Prompt
from rich.table import Table
from rich.text import Text

from omrl.cli.env_options import OPTION_HELP, options_as_flags, parse_options

env_app = typer.Typer(help="List, serve and play environments.", no_args_is_help=True)


def describe_env(component, build: bool = False) -> dict[str, Any]:
    """One row of ``omrl env list``: where the env comes from and whether its package is installed,
    read from the class alone; with ``build``, also its splits (or why it would not build)."""
    from omrl.envs import install_command, package_installed

    cls = component.obj
    package, extra = getattr(cls, "package", ""), getattr(cls, "extra", "")
    installed = package_installed(cls) if isinstance(cls, type) else True
    row = {
        "name": component.name,
        "distribution": component.distribution,
        "package": package or None,
        "installed": installed,
        "install": None if installed or not extra else install_command(cls),
        "description": component.description,
    }
    if not build:
        return row
    from omrl.serve import open_env

    row.update(splits={}, error=None)
    try:
        env = open_env(component.name)
        try:
            row["splits"] = {split: len(env.split_of(split)) for split in env.splits}
        finally:
            env.close()
    except Exception as exc:  # noqa: BLE001 - a listing shows why an env is unavailable
        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return row


def select_envs(patterns: list[str] | None) -> list:
    """The env components named by ``patterns`` (names, or globs such as ``'babyai:*'``), in that order;
    every registered env when there are none."""
    from fnmatch import fnmatchcase

    from omrl.errors import ConfigError
    from omrl.registry import envs

    if not patterns:
        return sorted(envs.components(), key=lambda c: c.name)
    chosen: dict[str, Any] = {}
    for pattern in patterns:
        if not any(ch in pattern for ch in "*?["):
            component = envs.component(pattern)  # an unknown name lists close matches
            chosen.setdefault(component.name, component)
            continue
        matched = sorted((c for c in envs.components() if fnmatchcase(c.name, pattern)), key=lambda c: c.name)
        if not matched:
            families = sorted({c.name.split(":", 1)[0] for c in envs.components()})
            raise ConfigError(f"no env matches {pattern!r}; env families: {', '.join(families)}")
        for component in matched:
            chosen.setdefault(component.name, component)
    return list(chosen.values())


def family_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows grouped by family (the part of a name before ``:``) with their counts: a family is installed
    when every member is (``code:*`` wraps envs whose packages it does not bring), and ``installed_envs``
    counts those that are."""
    families: dict[str, dict[str, Any]] = {}
    for row in rows:
        family = row["name"].split(":", 1)[0]
        entry = families.setdefault(
            family,
            {
                "family": family,
                "envs": 0,
                "installed_envs": 0,
                "package": row["package"],
                "distribution": row["distribution"],
                "installed": True,
                "install": None,
            },
        )
        entry["envs"] += 1
        entry["installed_envs"] += bool(row["installed"])
        if not row["installed"]:
            entry["installed"] = False
            entry["install"] = entry["install"] or row["install"]
    return list(families.values())


@env_app.command("list")
def list_envs(
    names: list[str] = typer.Argument(
        None, help="Only these envs: names or globs such as 'babyai:*' (default: every registered one)."
    ),
    splits: bool = typer.Option(
        False, "--splits", help="Also build each env and show its splits (starts engines: slower)."
    ),
    families: bool = typer.Option(False, "--families", help="One row per family with its env count."),
    every: bool = typer.Option(False, "--all", help="Every env, one row each (the default with no names: families)."),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON for scripts: every env, one object each (--families: one per family)."
    ),
) -> None:
    """Every registered env: its source package, whether that is installed, and (--splits) its splits."""
    from concurrent.futures import ThreadPoolExecutor

    components = select_envs(names)
    if splits:
        # envs start in parallel: some launch a JVM or index data, and a listing should not add them up
        with Console(stderr=True).status("starting the envs..."), ThreadPoolExecutor(max_workers=8) as pool:
            rows = list(pool.map(lambda c: describe_env(c, build=True), components))
    else:
        rows = [describe_env(c) for c in components]
    if families or not (names or every or splits or as_json):  # 330 rows would not fit a screen
        families, rows = True, family_rows(rows)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="omrl envs")
    columns = (
        ["family", "envs", "package", "installed"]
        if families
        else ["name", "package", "installed", "description"] + (["splits"] if splits else [])
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        installed = Text("yes") if row["installed"] else Text(f"no: {row['install'] or 'missing'}", style="yellow")
        if families and not row["installed"] and row["installed_envs"]:
            installed = Text(
                f"{row['installed_envs']} of {row['envs']}; the rest: {row['install'] or 'missing'}", style="yellow"
            )
        package = row["package"] or ("built in" if row["distribution"] == "omrl" else row["distribution"])
        if families:
            table.add_row(row["family"], str(row["envs"]), package, installed)
            continue
        cells = [Text(row["name"]), Text(package), installed, Text(row["description"])]
        if splits:
            cells.append(
                Text(", ".join(f"{name} {size}" for name, size in row["splits"].items()))
                if not row["error"]
                else Text(f"unavailable: {row['error']}", style="red")
            )
        table.add_row(*cells)
    Console().print(table)
    if families and not names:
        Console().print("one family: omrl env list 'babyai:*'; every env: omrl env list --all", highlight=False)


@env_app.command("serve")
def serve(
    name: str = typer.Argument(..., help="A registered env (see `omrl env list`)."),
    host: str = typer.Option(
        "127.0.0.1",
        help="Interface to listen on. The default takes connections "
        "from this machine only; any other (0.0.0.0: every one) "
        "is served with a warning.",
    ),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on (0: a free one, printed)."),
    token: str = typer.Option(
        None,
        "--token",
        envvar="OMRL_SERVE_TOKEN",
        show_default=False,
        help="Require `Authorization: Bearer <token>` on every request. Prefer the "
        "environment variable: a command line is visible to other users.",
    ),
    max_envs: int = typer.Option(256, "--max-envs", min=1, help="Most live envs at once (then HTTP 503)."),
    max_body: int = typer.Option(
        1 << 20, "--max-body", min=1, help="Largest request body in bytes (larger: HTTP 413)."
    ),
    idle_timeout: float = typer.Option(
        1800.0,
        "--idle-timeout",
        min=0,
        help="Close an env no call has touched for this many seconds (its "
        "client was likely killed); calls about it then get HTTP 410. "
        "0: never.",
    ),
    call_timeout: float = typer.Option(
        300.0,
        "--call-timeout",
        min=0,
        help="Give up on an env call (reset, step, ...) that has not returned after this many "
        "seconds: the request gets HTTP 504, and its env id answers 503 (busy) until the call "
        "returns or the id is closed; other ids play on. 0: never.",
    ),
    option: list[str] = typer.Option(None, "--option", "-o", help=OPTION_HELP),
) -> None:
    r"""Serve an env over HTTP for AgentGym clients: `id` dialect at the root, `env_idx` dialect under /env_idx (needs omrl\[server])."""
    from omrl.env_results import check_seats
    from omrl.errors import ConfigError
    from omrl.registry import envs
    from omrl.serve import create_app, exposure_warning, run_server

    seats = check_seats(envs.get(name), name)
    if seats:  # AgentGym's protocol has one agent an episode: a client would play every seat, each game's result lost
        raise ConfigError(
            f"env {name!r} is a game of seats ({', '.join(seats)}), and an AgentGym server plays one agent an "
            "episode, so each game's result would be lost; play its games with omrl rollout, eval or train (seats.*)"
        )
    _check_port(host, port)
    with options_as_flags(name):
        app = create_app(
            name,
            parse_options(option, name),
            token=token or None,
            max_envs=max_envs,
            max_body=max_body,
            idle_timeout=idle_timeout,
            call_timeout=call_timeout,
        )
    console = Console(stderr=True)
    warning = exposure_warning(host, token)
    if warning:
        console.print(Text(warning, style="bold red"), soft_wrap=True)
    needs = " (and the token: OMRL_SERVE_TOKEN or plugins.agentgym.token)" if token else ""

    def announce(bound: int) -> None:  # the port bound: with --port 0, the free one picked
        import socket

        # a wildcard address is no place to connect to: other machines reach this one by its name
        url = f"http://{socket.gethostname() if host in ('0.0.0.0', '::', '') else host}:{bound}"
        console.print(
            f"serving env [bold]{escape(name)}[/] on {url} (AgentGym id dialect; env_idx dialect at "
            f"{url}/env_idx); play it with "
            f"env.name=agentgym plugins.agentgym.base_url={url} plugins.agentgym.env_name={escape(name)}{needs}; "
            + (
                f"envs idle for {idle_timeout:g} s are closed (--idle-timeout)"
                if idle_timeout
                else "envs are never closed for idleness (--idle-timeout 0)"
            ),
            highlight=False,
            soft_wrap=True,
        )

    run_server(app, host, port, announce=announce)


@env_app.command("play")
def play(
    name: str = typer.Argument(..., help="A registered env (see `omrl env list`)."),
    task: int = typer.Option(None, "--task", help="Task id (default: the split's first)."),
    split: str = typer.Option(
        None, "--split", help="Split to take the task from (default: test; with --task, its own)."
    ),
    max_turns: int = typer.Option(0, "--max-turns", min=0, help="Turn cap; 0 uses the env's own."),
    option: list[str] = typer.Option(None, "--option", "-o", help=OPTION_HELP),
) -> None:
    """Play one episode yourself: type actions, `:expert` for the expert's, `:quit` to stop, `:help`."""
    from omrl.env_results import EMPTY_OBSERVATION, reset_problem, step_problem
    from omrl.errors import OmrlError
    from omrl.serve import open_env

    def check(method: str, problem: str | None) -> None:  # as a rollout would refuse it: the env's fault
        if problem:
            raise OmrlError(f"env {name!r}: its {method} {problem} (a bug in the env's plugin)")

    console = Console(highlight=False)
    with options_as_flags(name):
        env = open_env(name, parse_options(option, name))
    try:
        if task is None:
            split = split or "test"
            task = env.tasks_of(name, split)[0]
        else:  # a task id names its split: one --split names must hold it, not be passed over in silence
            holding = next((s for s in (split, *env.splits) if s in env.splits and task in env.split_of(s)), None)
            if split is not None and holding is not None and holding != split:
                raise OmrlError(
                    f"task {task} of {name} is in its {holding} split, not {split}; drop --split, or give a {split} task"
                )
            split = holding or split or "test"
        first = env.reset(task)
        check("reset", reset_problem(first))
        seats = tuple(getattr(env, "seats", ()) or ())
        console.print(
            Panel(
                Text(first.instruction or "(no separate instruction)"),
                title=f"{name} task {task} ({split} split): instruction",
            )
        )
        opens = f", {first.seat} to move" if seats and first.seat else ""
        console.print(Panel(Text(first.text or EMPTY_OBSERVATION), title=f"observation{opens}"))
        turns, total, played, result = max_turns or env.max_turns, 0.0, 0, None
        mover = first.seat if seats else None
        for turn in range(1, turns + 1):
            action = _ask_action(console, env, turn, turns, mover)
            if action is None:
                break
            result = env.step(action)
            check("step", step_problem(result, seated=bool(seats)))
            total, played = total + result.reward, turn
            flags = " (invalid action)" if result.info.get("invalid") else ""
            mover = result.seat if seats else None
            moves = f", {mover} to move" if mover else ""
            text = result.observation or EMPTY_OBSERVATION
            if not (seats and result.done):  # a game's end is each seat's view, below
                console.print(Panel(Text(text), title=f"observation: reward {result.reward:g}{flags}{moves}"))
            if result.done:
                break
        ended = "done" if result is not None and result.done else "not finished"
        if seats and result is not None and result.done:  # a game: each seat's own view and result
            for seat in seats:
                view = result.views.get(seat) or EMPTY_OBSERVATION
                console.print(Panel(Text(view), title=f"{seat}'s view: reward {result.seat_rewards.get(seat, 0.0):+g}"))
            said = ", ".join(f"{seat} {_outcome(result.seat_rewards.get(seat, 0.0))}" for seat in seats)
            console.print(f"game {ended}: {said}; turns {played}")
            return
        won, score = (result.won, result.score) if result is not None else (False, 0.0)
        console.print(
            f"episode {ended}: won {'yes' if won else 'no'}, score {score:.2f}, total reward {total:g}, turns {played}"
        )
    finally:
        env.close()


PLAY_COMMANDS = {":expert": "take the expert's action", ":quit": "end the episode", ":help": "this list"}


def _check_port(host: str, port: int) -> None:
    """Refuse, naming it, an address this machine will not let the server listen on (a port in use, an
    address it does not have): uvicorn logged its own line and exited 3 there, which said nothing of --port."""
    import socket

    from omrl.errors import OmrlError

    if port == 0:  # the system picks a free one
        return
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise OmrlError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}; give another --port, or --port 0 for a free one"
        ) from exc


def _outcome(reward: float) -> str:
    """A seat's result from its reward in [-1, 1]: +1 a win, -1 a loss, 0 a draw."""
    return "won" if reward > 0 else "lost" if reward < 0 else "drew"


def _ask_action(console: Console, env, turn: int, turns: int, seat: str | None = None) -> str | None:
    """The next action from the person (None: quit); ``:expert`` asks the env's expert (in a game, where it
    has none, its scripted player for ``seat``, the seat to move, as ``omrl rollout --expert`` does). Any
    other line starting with ``:`` is a command, never an action: ``:help`` (or an unknown one) lists them
    and costs no turn."""
    actions = env.admissible_actions()
    if actions:
        console.print(Text("actions: " + " | ".join(actions), style="dim"))
    while True:
        try:
            typed = Prompt.ask(f"[bold]turn {turn}/{turns}[/] action", console=console).strip()
        except EOFError:
            return None
        if typed == ":quit":
            return None
        if typed == ":expert":
            expert = env.expert_action()
            if expert is None and seat:
                expert = env.scripted_action(seat)
            if expert is None:
                console.print("this env has no expert action here; type an action")
                continue
            thought = env.expert_thought()
            console.print(Text(f"expert: {expert}" + (f" ({thought})" if thought else ""), style="cyan"))
            return expert
        if typed.startswith(":"):
            unknown = "" if typed == ":help" else f"unknown command {typed}; "
            from omrl.envs import Env

            has_expert = any(getattr(type(env), m) is not getattr(Env, m) for m in ("expert_action", "scripted_action"))
            shown = {name: what for name, what in PLAY_COMMANDS.items() if has_expert or name != ":expert"}
            listed = ", ".join(f"{name} ({what})" for name, what in shown.items())
            console.print(Text(f"{unknown}commands: {listed}; anything else is an action"))
            continue
        if typed:
            return typed


def add_to(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")
