"""``omrl rollout``: play episodes with a model (or the env's expert) and write trajectories."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer

ARGS_HELP = "\\[PRESET] \\[key=value ...]: a preset name or YAML path, then config overrides (see `omrl config keys rollout`)."


def build_config(cls: type, args: list[str] | None, flags: dict[str, Any]):
    """The config from an optional preset, ``key=value`` overrides, then the friendly flags that were given."""
    from omrl.config import load_config, read_preset
    from omrl.errors import ConfigError

    args = list(args or [])
    preset = args.pop(0) if args and "=" not in args[0] else None
    command = cls().command
    if preset is not None:
        wanted = read_preset(preset).get("command", "train")
        if wanted != command:
            raise ConfigError(f"preset {preset!r} is for `omrl {wanted}`, not `omrl {command}`")
    # flags win over the preset and the overrides; JSON-quoted so a value is never re-typed by YAML
    args += [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]
    return load_config(cls, preset, args, base=section_defaults(cls()))


def section_defaults(cfg: Any) -> dict[str, Any]:
    """The scalar defaults of ``cfg`` and its sections, without its mappings.

    Used as the base of a config so that overriding one key of a section
    (``env.name``) keeps the section's command-specific defaults (eval's
    ``env.split=test``, ``generation.temperature=0``); mappings such as
    ``reward.weights`` are left out so that setting one replaces it whole.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = section_defaults(value)
        elif not isinstance(value, dict):
            out[f.name] = value
    return out


def progress_bar(total: int, label: str):
    """A rich progress bar plus the RolloutProgress that drives it: episodes, success so far, tokens/s."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from omrl.rollout import RolloutProgress

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("success {task.fields[success]}"), TextColumn("{task.fields[speed]} tok/s"),
                   TimeElapsedColumn(), transient=False)
    task = bar.add_task(label, total=total, success="-", speed="-")

    class BarProgress(RolloutProgress):
        def generated(self, tokens: int) -> None:
            super().generated(tokens)
            bar.update(task, speed=f"{self.tokens_per_second:.0f}")

        def finished(self, episode) -> None:
            super().finished(episode)
            bar.update(task, advance=1, success=f"{100 * self.success_rate:.0f}%")

    return bar, BarProgress()


def rollout(
    args: list[str] = typer.Argument(None, help=ARGS_HELP, show_default=False),
    env: str = typer.Option(None, "--env", help="Env name (env.name)."),
    model: str = typer.Option(None, "--model", help="Model: built-in name, directory or hub id (model.name)."),
    template: str = typer.Option(None, "--template", help="Action template (env.template)."),
    num_tasks: int = typer.Option(None, "--num-tasks", help="Tasks to play from the start of the split."),
    group_size: int = typer.Option(None, "--group-size", help="Samples per task."),
    output: str = typer.Option(None, "--output", "-o", help="Trajectory parquet; a .jsonl goes beside it."),
    expert: bool = typer.Option(False, "--expert", help="Play the env's scripted expert instead of a model."),
) -> None:
    """Play episodes and write them as a trajectory parquet plus a readable JSONL."""
    from rich.console import Console

    from omrl.data import write_episodes
    from omrl.errors import OmrlError
    from omrl.evaluation import evaluate, metrics_table
    from omrl.options import RolloutRunConfig
    from omrl.rollout import RolloutSession, write_jsonl
    from omrl.rollout.convert import jsonl_path_for

    cfg = build_config(RolloutRunConfig, args, {
        "env.name": env, "model.name": model, "env.template": template, "num_tasks": num_tasks,
        "group_size": group_size, "output": output, "use_expert": True if expert else None,
    })
    console = Console()
    with RolloutSession.from_config(cfg, expert=cfg.use_expert) as session:
        tasks = session.task_ids(cfg.env.split, cfg.num_tasks)
        if len(tasks) < cfg.num_tasks:
            console.print(f"[yellow]{cfg.env.name} has only {len(tasks)} tasks in split {cfg.env.split!r}[/]")
        bar, progress = progress_bar(len(tasks) * cfg.group_size, "rollout")
        with bar:
            episodes = session.play(tasks, split=cfg.env.split, group_size=cfg.group_size, seed=cfg.seed,
                                    expert=cfg.use_expert, progress=progress)
    if cfg.use_expert and all(ep.end_reason == "env_error" for ep in episodes):
        raise OmrlError(f"the {cfg.env.name} expert failed on every task (nothing written): {episodes[0].error}")
    parquet = write_episodes(episodes, cfg.output)
    readable = write_jsonl(episodes, jsonl_path_for(parquet))
    console.print(metrics_table(evaluate(episodes), title=f"rollout: {cfg.env.name}"))
    console.print(f"wrote {len(episodes)} episodes to {parquet} and {readable}")


def add_to(app: typer.Typer) -> None:
    app.command("rollout")(rollout)
