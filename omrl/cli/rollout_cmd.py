"""``omrl rollout``: play episodes with a model (or the env's expert) and write trajectories."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from omrl.cli import play_flags as flags
from omrl.cli.play_checks import check_before_loading

#: how an episode's error says the scripted expert itself failed (an action that is no text, none at all);
#: an env server that could not answer its expert route ("GET /expert_action ... cannot connect") is the env's
EXPERTS_OWN = (".expert_action returned", "has no scripted expert action")


def check_rollout_outputs(cfg) -> None:
    """The parquet and its readable JSONL go to two paths, neither over the model nor a run's own files
    (``-o expert.jsonl`` once wrote the parquet, then the JSONL over it)."""
    from pathlib import Path

    from omrl.outputs import OutputError, check_outputs
    from omrl.rollout.convert import jsonl_path_for, unscored_path

    if not str(cfg.output).strip():
        raise OutputError("--output is empty; valid: a .parquet path, e.g. --output episodes.parquet")
    output = Path(cfg.output)
    if output.suffix.lower() != ".parquet":  # what view, sft and data read by its name
        which = (
            "the readable JSONL, which goes beside the trajectory parquet" if output.suffix.lower() == ".jsonl" else ""
        )
        raise OutputError(
            f"--output {output} names {which or 'no .parquet file'}; "
            f"valid: a .parquet path, e.g. --output {output.with_suffix('.parquet')}"
        )
    unscored = unscored_path(cfg.output)  # where the episodes go if a reward fails on them
    check_outputs(
        {
            "--output": cfg.output,
            "the readable JSONL": jsonl_path_for(cfg.output),
            "the unscored episodes": unscored,
            "their readable JSONL": jsonl_path_for(unscored),
        },
        {"the --model": cfg.model.name, **plugin_files(cfg)},
    )


def plugin_files(cfg) -> dict[str, str]:
    """Every file an env's or a plugin's options name (``plugins.dataset.path``): inputs no output may replace."""
    from pathlib import Path

    from omrl.mixture import mix_members

    files = {}
    for member in mix_members(cfg):
        for plugin, options in (member.plugins or {}).items():
            for key, value in options.items() if isinstance(options, dict) else ():
                if isinstance(value, str) and value.strip() and Path(value).expanduser().is_file():
                    files[f"plugins.{plugin}.{key}"] = value
    return files


def tasks_of_each_env(cfg, session, tasks) -> dict[str, int]:
    """How many of ``tasks`` each env of the run has (one env: its tasks are ids, all of them its)."""
    named = [session.env_task(task, cfg.env.split).env for task in tasks]
    return {env: named.count(env) for env in session.env_names}


def rollout(
    args: list[str] = typer.Argument(None, help=flags.ARGS_HELP, show_default=False),
    env: str = flags.ENV_OPTION,
    model: str = typer.Option(None, "--model", help="Model: built-in name, directory or hub id (model.name)."),
    template: str = flags.TEMPLATE_OPTION,
    num_tasks: int = typer.Option(None, "--num-tasks", min=1, help="Tasks to play from the start of the split."),
    group_size: int = typer.Option(None, "--group-size", min=1, help="Samples per task."),
    output: str = typer.Option(None, "--output", "-o", help="Trajectory parquet; a .jsonl goes beside it."),
    expert: bool = typer.Option(False, "--expert", help="Play the env's scripted expert instead of a model."),
    strategy: str = flags.STRATEGY_OPTION,
    budget: int = flags.BUDGET_OPTION,
    select: str = flags.SELECT_OPTION,
    agent: str = flags.AGENT_OPTION,
    agent_cmd: str = flags.AGENT_CMD_OPTION,
    reward: str = flags.REWARD_OPTION,
) -> None:
    """Play episodes and write them as a trajectory parquet plus a readable JSONL.

    With --strategy, every root-to-leaf path of each task's search tree is written, with node and parent ids.
    """
    from rich.console import Console
    from rich.text import Text

    from omrl.cli import err_console, stop_on_interrupt
    from omrl.cli.eval_cmd import env_errors_of_each_env
    from omrl.cli.settings import env_label, play_settings, played_settings, settings_block
    from omrl.config.options import RolloutRunConfig
    from omrl.env_errors import check_max_env_error_rate, env_error_reasons, failed_in
    from omrl.errors import EnvFailure
    from omrl.evaluation import env_table, evaluate, evaluate_by_env, held_warnings, metrics_table, replay_warnings
    from omrl.mixture import is_mixture
    from omrl.rollout import RolloutSession
    from omrl.rollout.convert import keep_unscored, unscored_path, write_trajectories, write_unscored
    from omrl.rollout.outcomes import seat_metrics, self_play_note
    from omrl.view import view_command

    given = {
        "env.name": env,
        "model.name": model,
        "env.template": template,
        "num_tasks": num_tasks,
        "group_size": group_size,
        "output": output,
        "use_expert": True if expert else None,
        "rollout.strategy": strategy,
        "rollout.budget": budget,  # 0 is a budget (no limit), not "not given"
        **flags.agent_flags(agent, agent_cmd, reward),
    }
    cfg = flags.config_with_select(RolloutRunConfig, args, given, select)
    strategy, budget = cfg.rollout.strategy, cfg.rollout.budget
    flags.check_strategy(strategy, budget, cfg.generation.max_new_tokens)
    check_before_loading(cfg)
    check_rollout_outputs(cfg)
    check_max_env_error_rate(cfg.max_env_error_rate)
    console = Console()
    play_settings(cfg, flags.with_flags(args, given), None, console)
    console.print(settings_block(cfg), highlight=False, soft_wrap=True)
    from omrl.supervisor import supervise

    with (
        keep_unscored(unscored_path(cfg.output)),
        # beside its parquet and named for it, as its JSONL is: the folder may be the user's own
        supervise(cfg.deadlines, os.path.dirname(os.path.abspath(cfg.output)), beat_file=heartbeat_name(cfg.output)),
        held_warnings() as caught,
        RolloutSession.from_config(cfg, expert=cfg.use_expert) as session,
    ):
        tasks = session.task_ids(cfg.env.split, cfg.num_tasks)  # a mixture: num_tasks of each env
        for name, count in tasks_of_each_env(cfg, session, tasks).items():
            if count < cfg.num_tasks:
                console.print(Text(f"{name} has only {count} tasks in split {cfg.env.split!r}", style="yellow"))
        from omrl.rollout import PlaySpec
        from omrl.search import play_strategy, plays_batched, search_metrics

        bar, progress = flags.progress_bar(len(tasks), f"rollout ({strategy}, tasks)", sampled=not cfg.use_expert)
        with bar:
            spec = PlaySpec(cfg.env.split, cfg.group_size, cfg.seed, cfg.use_expert, strategy=strategy, budget=budget)
            played = stop_on_interrupt(
                lambda: play_strategy(session, tasks, spec, progress),
                err_console,
                lambda: flags.played_so_far(
                    progress,
                    len(tasks),
                    session.agent is not None or plays_batched(strategy, budget),
                    lambda kept: write_unscored(
                        kept, unscored_path(cfg.output), session.tokenizer, played_settings(cfg)
                    ),
                    "--output is written once every task is played",
                ),
            )
            trees, episodes = played.trees, played.episodes
        if not plays_batched(strategy, budget):  # the batched rollout's samples were no search
            console.print(metrics_table(search_metrics(trees), title=f"search: {strategy}"))
    replay_warnings(caught, episodes)
    if episodes and all(ep.end_reason == "env_error" for ep in episodes):
        reasons = env_error_reasons(episodes)
        # the expert's own failure (no action, not text) is the expert's; a reset or step that raised is the env's
        expert = cfg.use_expert and any(words in reason for reason in reasons for words in EXPERTS_OWN)
        where = f"the {env_label(cfg)} expert" if expert else failed_in(episodes, env_label(cfg))
        raise EnvFailure(f"every episode failed in {where} (nothing written); the first reasons: {'; '.join(reasons)}")
    parquet, readable = write_trajectories(episodes, cfg.output, session.tokenizer, played_settings(cfg))
    metrics = {**evaluate(episodes), **seat_metrics(episodes)}  # a game of seats: how the policy's fared
    if not plays_batched(strategy, budget):  # a search's rows are its trees' paths, not samples: no pass@k of them
        metrics = {k: v for k, v in metrics.items() if not k.startswith("pass@") and k != "samples_per_task"}
    console.print(metrics_table(metrics, title=f"rollout: {env_label(cfg)}"))
    if note := self_play_note(metrics):
        console.print(note, highlight=False, soft_wrap=True)
    if is_mixture(cfg.env):
        console.print(env_table(evaluate_by_env(episodes, metrics), title="rollout per env"))
    console.print(f"wrote {len(episodes)} episodes to {parquet} and {readable}", soft_wrap=True)
    console.print(f"look at them: {view_command(parquet)}", highlight=False, soft_wrap=True)
    env_errors_of_each_env(console, cfg, episodes, "they are written, as end_reason env_error")
    cut = sum(ep.end_reason == "max_context" for ep in episodes)
    if cfg.use_expert and cut:  # SFT data: a demonstration cut short teaches the start of a task, never its end
        console.print(
            Text(
                f"{cut} of {len(episodes)} expert episodes ended at generation.max_context={cfg.generation.max_context} "
                "tokens before the expert finished, so they demonstrate no success; give them room with a larger "
                f"generation.max_context (e.g. {4 * cfg.generation.max_context})",
                style="yellow",
            ),
            soft_wrap=True,
        )


def heartbeat_name(output: str) -> str:
    """``r1.heartbeat.json`` for ``-o r1.parquet``."""
    return f"{Path(output).stem}.heartbeat.json"


def add_to(app: typer.Typer) -> None:
    app.command("rollout")(rollout)
