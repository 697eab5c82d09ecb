"""``omrl sweep``: test-time scaling curves, success against tokens for several strategies and budgets.

A command of its own rather than ``omrl eval --sweep``: it takes lists (strategies,
budgets) where eval takes one of each, and writes a folder (sweep.json, sweep.png)
where eval writes one report, so none of eval's flags would mean the same in a sweep.
"""

from __future__ import annotations

from typing import Any

import typer

from omrl.cli.play_flags import ARGS_HELP, ENV_HELP
from omrl.cli.settings import play_settings
from omrl.errors import ConfigError


def split_list(text: str | None, flag: str, example: str = "chain,beam") -> list[str] | None:
    """``"a, b,c"`` as ``["a", "b", "c"]`` (None when the flag was not given); ``example``: a valid value.

    >>> split_list("chain, beam", "--strategies")
    ['chain', 'beam']
    """
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ConfigError(f"{flag} {text!r} has an empty item; valid: items separated by commas, e.g. {example}")
    return items


def parse_budgets(text: str | None) -> list[int] | None:
    """``"500,1000"`` as ``[500, 1000]``; ConfigError naming an item that is not a positive whole number."""
    items = split_list(text, "--budgets", example="500,1000,2000")
    if items is None:
        return None
    for item in items:
        if not (item.isascii() and item.isdigit()) or int(item) < 1:
            raise ConfigError(
                f"--budgets {text!r}: {item!r} is not a positive whole number of tokens; valid: "
                "e.g. --budgets 500,1000,2000"
            )
    return [int(item) for item in items]


def check_sweep_outputs(cfg) -> None:
    """<out> holds sweep.json and sweep.png: neither may land on the model or in a run's own files."""
    from pathlib import Path

    from omrl.outputs import OutputError, check_outputs

    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file; give a folder for sweep.json and sweep.png (e.g. runs/sweep)")
    check_outputs(
        {"--out's sweep.json": out / "sweep.json", "--out's sweep.png": out / "sweep.png"},
        {"the --model": cfg.model.name},
    )


EVAL_PRESET = "eval"  # what `omrl eval` starts from when the command line names no preset


def sweep_config(args: list[str] | None, flags: dict, console) -> tuple[Any, float | None]:
    """The sweep's config and the temperature its searching cells sample at (None: the config's), resolved
    as `omrl eval` resolves the same flags: its preset's settings where the command line names no preset
    and sets none of them, a trained model's settings, and greedy decoding unless a cell searches (it
    then samples at 1.0, unless the command line chooses a temperature). So each cell plays what
    `omrl eval --strategy S --budget B` plays with the same flags."""
    from omrl.cli.eval_cmd import SAMPLING_TEMPERATURE
    from omrl.cli.play_checks import check_before_loading
    from omrl.cli.play_flags import config_with_select, with_flags
    from omrl.config import user_sets
    from omrl.config.options import SweepRunConfig
    from omrl.config.presets import split_preset
    from omrl.search.sweep import pass_at_1

    cfg = config_with_select(SweepRunConfig, list(args or []), flags, select=None)
    if split_preset(args[0] if args else None, [])[0] is None:  # eval too starts from a preset named
        take_eval_preset(cfg, args, flags)
    check_before_loading(cfg)  # each env of a mixture known and installed
    if all(pass_at_1(s) for s in cfg.strategies) and (flags.get("budgets") or user_sets(args, "budgets")):
        import warnings

        warnings.warn(
            f"budgets are not read: {', '.join(cfg.strategies)} play{'s' * (len(cfg.strategies) == 1)} once, "
            "without a budget (pass@1); a budget makes a cell of a strategy that searches, e.g. best_of_n",
            stacklevel=2,
        )
    play_settings(cfg, with_flags(args, flags), EVAL_PRESET, console)  # a run's model plays as it trained, as in eval
    if cfg.generation.temperature > 0 or user_sets(args, "generation.temperature"):
        return cfg, None
    searching = [strategy for strategy in cfg.strategies if not pass_at_1(strategy)]
    if searching:
        console.print(
            f"generation.temperature={SAMPLING_TEMPERATURE:g} for {', '.join(searching)}: a search samples its "
            "replies as in omrl eval (greedy decoding would repeat one; generation.temperature= chooses)",
            highlight=False,
            soft_wrap=True,
        )
    return cfg, SAMPLING_TEMPERATURE


def take_eval_preset(cfg: Any, args: list[str] | None, flags: dict) -> None:
    """Set what the eval preset sets on ``cfg`` where neither the command line (an override or a flag) nor
    a trained model's env chose a value: ``cfg`` then holds what `omrl eval` starts from (its preset is
    for `omrl eval`, so the config loader cannot start a sweep from it)."""
    import dataclasses

    from omrl.cli.settings import set_value, value_at
    from omrl.config import read_preset, user_sets

    defaults = type(cfg)()

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            if dotted in ("command", "description") or not hasattr(value_at(cfg, prefix[:-1]) if prefix else cfg, key):
                continue  # description: eval writes its own
            if isinstance(value, dict) and dataclasses.is_dataclass(value_at(cfg, dotted)):
                walk(value, f"{dotted}.")
            elif (
                flags.get(dotted) is None
                and not user_sets(args, dotted)
                and value_at(cfg, dotted) == value_at(defaults, dotted)
            ):
                set_value(cfg, dotted, value)

    walk(read_preset(EVAL_PRESET), "")


def sweep_command(
    args: list[str] = typer.Argument(None, help=ARGS_HELP.replace("rollout", "sweep"), show_default=False),
    env: str = typer.Option(None, "--env", help=ENV_HELP),
    model: str = typer.Option(None, "--model", help="Model: built-in name, directory or hub id (model.name)."),
    strategies: str = typer.Option(
        None,
        "--strategies",
        help="Strategies to compare, comma-separated, e.g. "
        "chain,best_of_n,beam,dfsdt,mcts (chain: pass@1, one point); options in "
        "plugins.NAME.",
    ),
    budgets: str = typer.Option(
        None,
        "--budgets",
        help="Generated tokens per task, comma-separated, e.g. "
        "500,1000,2000: each strategy but chain plays once at each.",
    ),
    split: str = typer.Option(None, "--split", help="Task split (env.split)."),
    num_tasks: int = typer.Option(
        None, "--num-tasks", min=1, help="Tasks every cell plays, from the start of the split."
    ),
    seed: int = typer.Option(None, "--seed", help="Random seed, the same for every cell."),
    out: str = typer.Option(None, "--out", "-o", help="Folder for sweep.json and sweep.png (out)."),
) -> None:
    """Play each strategy at each budget on the same tasks: a table, <out>/sweep.json and <out>/sweep.png.

    Each cell is what `omrl eval --strategy S --budget B` measures; on a mixture (--env a,b) each cell
    plays num_tasks of each env, and sweep.json adds each env's success. Run it again with the same
    settings to play only the cells not finished yet (resume=false starts over).
    """
    from rich.console import Console

    from omrl.cli import err_console, stop_on_interrupt
    from omrl.cli.play_flags import progress_bar
    from omrl.search.sweep import run_sweep, sweep_table

    console = Console()
    cfg, search_temperature = sweep_config(
        args,
        {
            "env.name": env,
            "model.name": model,
            "strategies": split_list(strategies, "--strategies"),
            "budgets": parse_budgets(budgets),
            "env.split": split,
            "num_tasks": num_tasks,
            "seed": seed,
            "out": out,
        },
        console,
    )
    check_sweep_outputs(cfg)
    # soft_wrap: a long --out path is not broken over lines
    log = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    record = stop_on_interrupt(
        lambda: run_sweep(cfg, progress_bar=progress_bar, log=log, search_temperature=search_temperature),
        err_console,
    )
    console.print(sweep_table(record))
    console.print(f"wrote {cfg.out}/sweep.json and {cfg.out}/sweep.png", highlight=False, soft_wrap=True)


def add_to(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
