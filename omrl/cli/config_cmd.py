"""``omrl config``: list presets and print a resolved config."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.syntax import Syntax

config_app = typer.Typer(help="Show config presets and resolved configs.", no_args_is_help=True)


def config_class_for(preset_data: dict):
    """The config dataclass a preset is for, from its ``command`` key (default: train)."""
    from omrl.config.options import CONFIG_CLASSES
    from omrl.errors import ConfigError

    command = preset_data.get("command", "train")
    if command not in CONFIG_CLASSES:
        raise ConfigError(f"unknown command {command!r} in preset; valid: {', '.join(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[command]


@config_app.command("show")
def show(
    preset: str = typer.Argument(..., help="A preset name (see `omrl config list`) or a YAML path."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. algorithm.gamma=0.99"),
) -> None:
    """Print the config that a preset plus overrides resolves to."""
    from omrl.config import command_line_config, read_preset, to_yaml

    data = read_preset(preset)
    cls = config_class_for(data)
    command = data.get("command", "train")
    args = [preset, *(overrides or [])]
    notes = Console(stderr=True)  # what the command changes is said on stderr; stdout is the YAML that runs
    if command == "train":  # what `omrl train` changes when it plays a preset elsewhere
        from omrl.cli.model_prompts import start_from_base_outside_its_env
        from omrl.cli.settings import agent_reward_weights, outside_the_presets_env

        cfg = command_line_config(cls, args)
        start_from_base_outside_its_env(cfg, list(overrides or []), None, notes)
        outside_the_presets_env(cfg, list(overrides or []), preset, notes)
        agent_reward_weights(cfg, list(overrides or []), notes)
    elif command in ("eval", "rollout", "sweep"):  # a run's model plays its env as it trained
        from omrl.cli.play_flags import config_with_select
        from omrl.cli.settings import play_settings

        cfg = config_with_select(cls, args, {}, None)
        play_settings(cfg, args, None, notes)
    else:
        cfg = command_line_config(cls, args)
    check_values(command, cfg)
    text = f"# {command} config\n" + to_yaml(cfg)
    console = Console()
    if console.is_terminal:
        console.print(Syntax(text, "yaml", word_wrap=True))
    else:  # a pipe or a file gets the YAML as it is, every line whole
        typer.echo(text, nl=False)


def check_values(command: str, cfg) -> None:
    """The checks the command itself runs before it loads a model (names, ranges, how settings combine,
    an online run's algorithms on a probe batch), so that a config ``show`` prints is one the command takes."""
    if command not in ("train", "eval", "rollout", "sweep"):
        return  # sft and rm: their types are checked; their data is read when they run
    if command == "train" and cfg.algorithm.name in ("grpo", "ppo"):  # the online recipes
        from omrl.training.algo_probe import check_run_algorithms

        check_run_algorithms(cfg)
    from omrl import registry
    from omrl.chat.history import check_history
    from omrl.cli.play_checks import check_before_loading
    from omrl.mixture import mix_members
    from omrl.rollout.spec import check_generation
    from omrl.supervisor import check_deadlines

    check_before_loading(cfg, model_made=False, reach=False)  # it only reads: no server is asked
    for member in mix_members(cfg):
        registry.templates.component(member.env.template)
    check_history(cfg.chat.history)
    check_deadlines(cfg.deadlines)
    check_generation(cfg.generation, cfg.env.max_turns)


@config_app.command("list")
def list_presets() -> None:
    """List the shipped presets."""
    from omrl.config import preset_names, read_preset

    for name in preset_names():
        data = read_preset(name)
        typer.echo(f"{name:20s} {data.get('command', 'train'):8s} {data.get('description', '')}")


@config_app.command("keys")
def keys(
    command: str = typer.Argument(
        "train", help="Which command's config: train, sft, rollout, eval, sweep, rm-train, rm-eval."
    ),
) -> None:
    """Every config key of a command with its type, default and help."""
    import textwrap

    from omrl.config import describe

    cls = config_class_for({"command": command})
    console = Console(highlight=False)
    width = max(console.width, 60)
    console.print(f"{command} config keys (set any as key=value):", markup=False)
    for key, kind, default, help_text in describe(cls):
        # a key whole on its line, its help wrapped below it: readable at 80 columns, greppable by key
        console.print(f"{key}  {kind} = {default}", markup=False, soft_wrap=True)
        wrapped = textwrap.fill(
            help_text,
            width,
            initial_indent="    ",
            subsequent_indent="    ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        console.print(wrapped, markup=False, soft_wrap=True)


def add_to(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
