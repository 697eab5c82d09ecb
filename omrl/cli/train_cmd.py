"""``omrl train``: online RL (grpo, ppo, dpo) in an env, e.g. ``omrl train --algo grpo --env webshop``."""

from __future__ import annotations

import typer

from omrl.cli.play_flags import AGENT_CMD_OPTION, AGENT_OPTION, ENV_OPTION, REWARD_OPTION, agent_flags


def eval_hint(cfg) -> str:
    """The command that evaluates the run's model on its envs, quoted for a shell: ``--env NAME`` (a
    mixture's list too), or for a mixture in env.mix that list as an override, less each env's split
    (eval plays its own, the test split)."""
    import json
    import shlex

    from omrl.cli.settings import mix_less_splits

    words = ["omrl", "eval", "--model", cfg.logging.output_dir]
    if cfg.env.mix:
        words.append(f"env.mix={json.dumps(mix_less_splits(cfg.env.mix))}")
    else:
        words += ["--env", cfg.env.name]
    flags = {"--agent": cfg.agent.callable, "--agent-cmd": cfg.agent.command, "--reward": cfg.agent.reward}
    words += [word for flag, value in flags.items() if value for word in (flag, value)]
    return shlex.join(str(word) for word in words)


def train(
    args: list[str] = typer.Argument(
        None,
        help="An optional preset (see `omrl config list`) or YAML path, default "
        "the --algo preset, then key=value overrides, e.g. group_size=8 "
        "optim.learning_rate=1e-6 (see `omrl config keys train`).",
        show_default=False,
    ),
    algo: str = typer.Option(None, "--algo", help="grpo, ppo or dpo (algorithm.name)."),
    env: str = ENV_OPTION,
    model: str = typer.Option(None, "--model", help="Built-in name, local directory or hub id."),
    steps: int = typer.Option(None, "--steps", min=1, help="RL steps (rollout + update each)."),
    output_dir: str = typer.Option(
        None, "--output-dir", "-o", help="Run directory (default: runs/<algo>-<env>-<time>)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --output-dir from its last checkpoint."),
    agent: str = AGENT_OPTION,
    agent_cmd: str = AGENT_CMD_OPTION,
    reward: str = REWARD_OPTION,
) -> None:
    """Train a model with online RL in a multi-turn environment."""
    from rich.console import Console

    from omrl.algos import RECIPES
    from omrl.cli import err_console, stop_on_interrupt
    from omrl.cli.model_prompts import start_from_base_outside_its_env
    from omrl.cli.play_checks import check_before_loading
    from omrl.cli.settings import (
        agent_reward_weights,
        env_folder_name,
        env_label,
        outside_the_presets_env,
        settings_block,
    )
    from omrl.config import command_line_config
    from omrl.config.options import TrainRunConfig
    from omrl.config.presets import preset_inputs, resumed_preset, split_preset, user_sets
    from omrl.errors import ConfigError
    from omrl.mixture import mix_members
    from omrl.outputs import check_run_dir, fresh_dir
    from omrl.parallel import is_main_process
    from omrl.training.rl import run_rl
    from omrl.view import view_command

    if algo is not None and algo not in RECIPES:
        import difflib

        close = difflib.get_close_matches(algo, RECIPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown --algo {algo!r}{hint}; valid: {', '.join(RECIPES)}")
    flags = {
        "algorithm.name": algo,
        "env.name": env,
        "model.name": model,
        "steps": steps,
        "logging.output_dir": output_dir,
        "resume": True if resume else None,
        **agent_flags(agent, agent_cmd, reward),
    }
    own_config = resumed_preset(output_dir, resume, None)  # with --resume, the run's config.yaml
    cfg = command_line_config(TrainRunConfig, args, flags, own_config or algo or "grpo")
    asked = output_dir is not None or user_sets(args, "logging.output_dir")  # runs/train said is runs/train
    if not asked and cfg.logging.output_dir in ("", "runs/train"):  # the default: a fresh directory per run
        cfg.logging.output_dir = fresh_dir("runs", f"{cfg.algorithm.name}-{env_folder_name(cfg)}")
    inputs = {"--model": cfg.model.name, **preset_inputs(args, resume)}
    check_run_dir(cfg.logging.output_dir, inputs, cfg.resume)  # before loading
    check_before_loading(cfg)
    untested = build_envs_first(cfg)
    console = Console(stderr=True, quiet=not is_main_process())  # one report, not one per process
    start_from_base_outside_its_env(cfg, list(args or []), model, console)
    named = split_preset(args[0] if args else None, [])[0]
    if named or not own_config:  # from a preset, as the first run was; a run's config.yaml has them settled
        preset = named or algo or "grpo"
        outside_the_presets_env(cfg, list(args or []), preset, console)
        agent_reward_weights(cfg, list(args or []), console)
    console.print(
        f"omrl train: {cfg.algorithm.name} on {env_label(cfg)} with {cfg.model.name}, {cfg.steps} "
        f"step{'s' * (cfg.steps != 1)} x {cfg.tasks_per_step} tasks x {cfg.group_size} samples -> {cfg.logging.output_dir}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(settings_block(cfg), highlight=False, soft_wrap=True)
    summary = stop_on_interrupt(lambda: run_rl(cfg, console=console), err_console)
    for table in summary_tables(summary, [member.name for member in mix_members(cfg)]):
        Console(quiet=not is_main_process()).print(table)
    # eval reads the run's config.yaml and plays the prompts the run trained on
    label, hint = "evaluate it", eval_hint(cfg)
    if untested and not cfg.env.mix:  # eval's test split holds no task: a command that runs, said as what it is
        label, hint = (
            "evaluate it (the env has no test split: on the tasks it trained on)",
            f"{hint} --split {cfg.env.split}",
        )
    console.print(f"{label}: {hint}", highlight=False, soft_wrap=True)
    console.print(f"look at it: {view_command(cfg.logging.output_dir)}", highlight=False, soft_wrap=True)


def build_envs_first(cfg) -> list[str]:
    """Build one instance of each env of the run and close it, before the model loads (seconds to
    minutes): an env that cannot be built (options it does not take, an MCP server that cannot start)
    is refused at once, as rollout and eval refuse it. The recipe builds its own envs after its models.
    Returns the envs with no test task (eval's split)."""
    from omrl import registry
    from omrl.envs import create_env
    from omrl.mixture import mix_members

    untested = []
    for member in mix_members(cfg):
        env = create_env(registry.envs.get(member.name), member.plugins.get(member.name, {}), member.name)
        try:
            if "test" in env.splits and not len(env.split_of("test")):
                untested.append(member.name)
        finally:
            env.close()
    return untested


def summary_tables(summary: dict, envs: list[str]) -> list:
    """The run's summary: one table of its metrics, and where it logged metrics by env (``metric/env``
    keys, ``env`` one of ``envs``: not ``time/generate``) one more with a column per env and a row per
    metric, not a row for each pair."""
    from rich.table import Table

    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    plain = Table(title="omrl train: done")
    plain.add_column("metric")
    plain.add_column("value")
    per_env: dict[str, dict[str, object]] = {}
    for key, value in summary.items():
        metric, _, env = key.partition("/")
        if env in envs:
            per_env.setdefault(metric, {})[env] = value
        else:
            plain.add_row(key, cell(value))
    if not per_env:
        return [plain]
    envs = sorted({env for values in per_env.values() for env in values})
    by_env = Table(title="per env")
    by_env.add_column("metric")
    for env in envs:
        by_env.add_column(env, justify="right")
    for metric, values in per_env.items():
        by_env.add_row(metric, *(cell(values[env]) if env in values else "-" for env in envs))
    return [plain, by_env]


def add_to(app: typer.Typer) -> None:
    app.command("train")(train)
