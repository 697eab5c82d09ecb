"""``omrl eval``: success rate, pass@k and friends of a model on an env split."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer

from omrl.cli.play_checks import check_before_loading
from omrl.cli.play_flags import (
    AGENT_CMD_OPTION,
    AGENT_OPTION,
    ARGS_HELP,
    BUDGET_OPTION,
    ENV_OPTION,
    REWARD_OPTION,
    SELECT_OPTION,
    STRATEGY_OPTION,
    TEMPLATE_OPTION,
    agent_flags,
    check_strategy,
    config_with_select,
    played_so_far,
    progress_bar,
    with_flags,
)
from omrl.cli.settings import env_folder_name, env_label, play_settings, played_settings, settings_block
from omrl.errors import ConfigError
from omrl.outputs import check_outputs


def default_output_dir(model_name: str, env_name: str) -> Path:
    """``evals/<model>-<env>-<time>``: a fresh folder per evaluation, never the model's own."""
    import re

    from omrl.outputs import fresh_dir

    def slug(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"

    model = Path(model_name.rstrip("/")).name or model_name
    return Path(fresh_dir("evals", f"{slug(model)}-{slug(env_name)}"))


def eval_outputs(cfg) -> tuple[Path, Path]:
    """Where the report and the episodes go: ``<output_dir>/report.json`` and ``episodes.parquet`` (with its
    readable JSONL); a ``--report`` path alone puts the episodes beside it as ``<name>.episodes.parquet``.
    Refused before any model loads: a model directory as the destination, or files that must stay."""
    from omrl.outputs import OutputError
    from omrl.rollout.convert import jsonl_path_for, unscored_path

    if cfg.report and not cfg.output_dir:
        report = Path(cfg.report)
        episodes = report.with_name(f"{report.stem}.episodes.parquet")
    else:
        folder = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg.model.name, env_folder_name(cfg))
        report = Path(cfg.report) if cfg.report else folder / "report.json"
        episodes = folder / "episodes.parquet"
    unscored = unscored_path(episodes)  # where they go if a reward fails on them
    check_outputs(
        {
            "--report": report,
            "the episodes": episodes,
            "their readable JSONL": jsonl_path_for(episodes),
            "the unscored episodes": unscored,
            "the unscored episodes' JSONL": jsonl_path_for(unscored),
        },
        {"the --model": cfg.model.name},
    )
    folder = episodes.parent
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        raise OutputError(
            f"the eval output {folder} is a model directory: the report and episodes go elsewhere; "
            "valid: --output-dir DIR (default: a new folder under evals/)"
        )
    return report, episodes


def say_env_errors(console, episodes, env: str) -> None:
    """Episodes that failed in the env are no result of the model: say how many and why, beside the table."""
    from rich.markup import escape

    from omrl.env_errors import env_error_reasons, failed_in

    reasons = env_error_reasons(episodes)
    if reasons:
        failed = sum(ep.end_reason == "env_error" for ep in episodes)
        console.print(
            f"[yellow]env errors:[/] {failed} of {len(episodes)} episodes failed in {escape(failed_in(episodes, env))} "
            "and are left out of success, scores and pass@k; the first reasons:",
            highlight=False,
            soft_wrap=True,
        )
        for reason in reasons:
            console.print(f"  {escape(reason)}", highlight=False, soft_wrap=True)


def env_errors_of_each_env(console, cfg, episodes, where: str) -> None:
    """Say, then check against max_env_error_rate, the env errors of each env of the run on its own: one
    env of a mixture that fails is not hidden by the others playing well. ``where`` ends the message.
    An env whose every episode failed exits 2 (EnvFailure) whatever max_env_error_rate allows: nothing
    measured it, and a clean exit would read as a result."""
    from omrl.env_errors import check_env_errors, env_error_reasons, failed_in
    from omrl.errors import EnvFailure
    from omrl.evaluation import episodes_by_env
    from omrl.mixture import is_mixture

    by_env = episodes_by_env(episodes) if is_mixture(cfg.env) else {cfg.env.name: list(episodes)}
    for env, mine in by_env.items():
        say_env_errors(console, mine, env)
    for env, mine in by_env.items():
        check_env_errors(mine, cfg.max_env_error_rate, env, where)
    for env, mine in by_env.items():
        if mine and all(ep.end_reason == "env_error" for ep in mine):
            raise EnvFailure(
                f"every one of the {len(mine)} episodes of {env!r} failed in {failed_in(mine, env)}, so it was not measured "
                f"({where}, its rates null); the first reasons: {'; '.join(env_error_reasons(mine))}"
            )
    check_model_turns(console, cfg, episodes)


def check_model_turns(console, cfg, episodes) -> None:
    """A command whose episodes (those the env did not fail) all ended before one model turn measured no
    model. Where their prompts left no room (end_reason max_context) its 0% is no result: it exits 2
    naming the limit (after writing what it played). Games that another seat ended before the policy's
    seat moved were played as asked: that is said, with no advice about the context."""
    from rich.markup import escape

    from omrl.rollout.spec import SHORTEN_PROMPT, no_room, overlong
    from omrl.training.rollout_health import ended_before_a_turn

    played = [ep for ep in episodes if ep.end_reason != "env_error"]
    if not played or any(ep.turns for ep in played):
        return
    too_long = [ep for ep in played if overlong(ep)]
    if too_long:
        longest = max(ep.prompt_length for ep in too_long)
        raise ConfigError(
            "no episode got a single model turn (they are written, as end_reason max_context): the "
            f"{no_room(longest, cfg.generation.max_context)}; raise it, or {SHORTEN_PROMPT}"
        )
    console.print(
        f"[yellow]warning:[/] no episode got a model turn: {escape(ended_before_a_turn(played))}",
        highlight=False,
        soft_wrap=True,
    )


def each_envs_extra(played, trees, searched: bool) -> dict[str, dict]:
    """A mixture's metrics per env beyond :func:`~omrl.evaluation.evaluate`: its reward terms and, after a
    search (``played.episodes`` then the answers of ``trees``, in order), its search metrics."""
    from omrl.search import search_metrics

    episodes = played.episodes
    extra = {env: {f"reward/{k}": v for k, v in terms.items()} for env, terms in played.env_rewards.items()}
    if searched:
        for env, metrics in extra.items():
            mine = [tree for tree, ep in zip(trees, episodes) if ep.env == env]
            metrics.update({f"search/{k}": v for k, v in search_metrics(mine).items()})
    return extra


SAMPLING_TEMPERATURE = 1.0


def sample_when_asked(cfg, args: list[str] | None, console) -> None:
    """Evaluation decodes greedily by default, but several samples per task (pass@k) or a search are
    only worth running when replies differ: they sample at temperature 1.0 unless the command line
    chooses a temperature, and say so."""
    from omrl.config import user_sets
    from omrl.search.context import strategy_traits

    # a chain under a budget is still one chain a sample: greedy, as a sweep plays its chain cells
    searching = not strategy_traits(cfg.rollout.strategy).batched_without_budget
    if cfg.generation.temperature > 0 or user_sets(args, "generation.temperature"):
        return
    if cfg.samples_per_task > 1 or searching:
        cfg.generation.temperature = SAMPLING_TEMPERATURE
        why = f"strategy {cfg.rollout.strategy}" if searching else f"--samples {cfg.samples_per_task}"
        console.print(
            f"generation.temperature={SAMPLING_TEMPERATURE:g}: {why} samples its replies "
            "(greedy decoding would repeat one; generation.temperature= chooses)",
            highlight=False,
            soft_wrap=True,
        )


WHOLE_SPLIT_UP_TO = 100  # a split this small is evaluated whole when --num-tasks is not given


def split_size(session, split: str) -> int:
    """How many tasks ``split`` holds (a mixture: over every env, each asked for its own split)."""
    return sum(len(env.task_ids(env.split if split == session.split else split, 10**9)) for env in session.envs)


def evaluate_command(
    args: list[str] = typer.Argument(None, help=ARGS_HELP.replace("rollout", "eval"), show_default=False),
    env: str = ENV_OPTION,
    model: str = typer.Option(None, "--model", help="Model: built-in name, directory or hub id (model.name)."),
    split: str = typer.Option(None, "--split", help="Task split (env.split)."),
    template: str = TEMPLATE_OPTION,
    num_tasks: int = typer.Option(None, "--num-tasks", min=1, help="Tasks to evaluate from the start of the split."),
    samples: int = typer.Option(None, "--samples", min=1, help="Samples per task, for pass@k and best-of-N."),
    report: str = typer.Option(None, "--report", help="JSON report path (default: <output dir>/report.json)."),
    output_dir: str = typer.Option(
        None,
        "--output-dir",
        "-o",
        help="Folder for the report and every episode played (of a search, each task's chosen path; `omrl rollout --strategy` keeps whole trees) (default: evals/<model>-<env>-<time>).",
    ),
    strategy: str = STRATEGY_OPTION,
    budget: int = BUDGET_OPTION,
    select: str = SELECT_OPTION,
    agent: str = AGENT_OPTION,
    agent_cmd: str = AGENT_CMD_OPTION,
    reward: str = REWARD_OPTION,
) -> None:
    """Evaluate a model on an env split: a table of metrics plus a JSON report.

    With --strategy, each task's answer is the episode its search chose; the report adds the tokens generated.
    """
    from rich.console import Console

    from omrl.backends.base import generation_metrics
    from omrl.cli import err_console, stop_on_interrupt
    from omrl.config import to_dict, user_sets
    from omrl.config.options import EvalRunConfig
    from omrl.env_errors import check_max_env_error_rate
    from omrl.evaluation import (
        env_table,
        evaluate,
        evaluate_by_env,
        held_warnings,
        metrics_table,
        replay_warnings,
        write_report,
    )
    from omrl.mixture import is_mixture
    from omrl.rollout import RolloutSession
    from omrl.rollout.convert import keep_unscored, unscored_path, write_trajectories, write_unscored
    from omrl.rollout.outcomes import seat_metrics, self_play_note
    from omrl.training.metrics import peak_memory
    from omrl.view import view_command

    given = {
        "env.name": env,
        "model.name": model,
        "env.split": split,
        "env.template": template,
        "num_tasks": num_tasks,
        "samples_per_task": samples,
        "report": report,
        "output_dir": output_dir,
        "rollout.strategy": strategy,
        "rollout.budget": budget,  # 0 is a budget (no limit), not "not given"
        **agent_flags(agent, agent_cmd, reward),
    }
    cfg = config_with_select(EvalRunConfig, args, given, select, "eval")
    console = Console()
    check_before_loading(cfg)  # first: the settings below name a mixture's envs
    play_settings(cfg, with_flags(args, given), "eval", console)
    strategy, budget = cfg.rollout.strategy, cfg.rollout.budget
    check_strategy(strategy, budget, cfg.generation.max_new_tokens)
    sample_when_asked(cfg, args, console)
    if not user_sets(list(args or []), "description"):  # the report says how this eval was played
        decoding = (
            "Greedy" if cfg.generation.temperature <= 0 else f"Sampled (temperature {cfg.generation.temperature:g})"
        )
        cfg.description = f"{decoding} evaluation on the {cfg.env.split} split"
    if cfg.samples_per_task < 1:
        raise ConfigError(f"samples_per_task must be >= 1 (samples of each task), got {cfg.samples_per_task}")
    if cfg.samples_per_task > 1 and cfg.generation.temperature <= 0:
        raise ConfigError(
            f"--samples {cfg.samples_per_task} with greedy decoding gives the same sample every time; "
            "valid: --samples 1, or sampling, e.g. generation.temperature=1.0"
        )
    report_path, episodes_path = eval_outputs(cfg)
    check_max_env_error_rate(cfg.max_env_error_rate)
    console.print(settings_block(cfg), highlight=False, soft_wrap=True)
    searched: dict = {}
    mixed = is_mixture(cfg.env)
    from omrl.outputs import no_folder_left_empty
    from omrl.supervisor import supervise

    with (
        no_folder_left_empty(episodes_path.parent),
        keep_unscored(unscored_path(episodes_path)),
        supervise(cfg.deadlines, episodes_path.parent),
        held_warnings() as caught,
        RolloutSession.from_config(cfg) as session,
    ):
        size = split_size(session, cfg.env.split)
        count = cfg.num_tasks
        if num_tasks is None and not user_sets(list(args or []), "num_tasks") and size <= WHOLE_SPLIT_UP_TO:
            count = max(1, size)  # a small split is evaluated whole unless asked otherwise
        tasks = session.task_ids(cfg.env.split, count)  # a mixture: count of each env
        cut = f" (num_tasks {count}: the split has only {size})" if not mixed and count > size else ""
        console.print(f"eval: {len(tasks)} of {size} tasks of the {cfg.env.split} split{cut}", highlight=False)
        from omrl.rollout import PlaySpec
        from omrl.search import chosen_episodes, play_strategy, plays_batched, search_metrics

        every_sample = plays_batched(strategy, budget)  # the batched rollout's samples: each one counts (pass@k)
        if not every_sample and cfg.samples_per_task > 1:  # a chain's samples under a budget: one search a task
            warnings.warn(
                f"--samples {cfg.samples_per_task} under --budget: each task's samples are one search, whose answer "
                "(the first sample) is scored, so eval reports no pass@k (any-path success counts the others); "
                f"drop --budget for pass@k over {cfg.samples_per_task} samples",
                stacklevel=1,
            )
        playing = f"{len(session.env_names)} envs" if mixed else cfg.env.name  # a bar's label is one short line
        bar, progress = progress_bar(len(tasks), f"eval {playing} ({strategy}, tasks)")
        with bar:
            spec = PlaySpec(
                cfg.env.split, cfg.samples_per_task, cfg.seed, rewards=every_sample, strategy=strategy, budget=budget
            )
            played = stop_on_interrupt(
                lambda: play_strategy(session, tasks, spec, progress),
                err_console,
                lambda: played_so_far(
                    progress,
                    len(tasks),
                    every_sample or session.agent is not None,
                    lambda kept: write_unscored(
                        kept, unscored_path(episodes_path), session.tokenizer, played_settings(cfg)
                    ),
                    "the report is written once every task is played",
                ),
            )
        trees = played.trees
        if not every_sample:
            played = session.compose(chosen_episodes(trees))  # each search's answer is what is evaluated
            searched = search_metrics(trees)
        episodes, rewards = played.episodes, played.rewards
        env_extra = each_envs_extra(played, trees, searched=not every_sample) if mixed else {}
        generation = session.backend.take_stats() if session.backend is not None else {}
    replay_warnings(caught, episodes)
    metrics = evaluate(episodes)
    metrics["split_tasks"] = size  # what "tasks" is a part of
    metrics.update(generation_metrics(generation), **peak_memory())
    metrics.update({f"reward/{name}": value for name, value in rewards.items()})
    metrics.update({f"search/{name}": value for name, value in searched.items()})
    metrics.update(seat_metrics(episodes))  # games of several seats: win/draw/loss per seat and opponent
    by_env = evaluate_by_env(episodes, metrics, env_extra) if mixed else None
    path = write_report(report_path, metrics, episodes, to_dict(cfg), by_env)
    # as omrl rollout writes them, and what they were played with (SFT on them keeps it)
    parquet, readable = write_trajectories(episodes, episodes_path, session.tokenizer, played_settings(cfg))
    console.print(metrics_table(metrics, title=f"eval: {cfg.model.name} on {env_label(cfg)} ({cfg.env.split})"))
    if note := self_play_note(metrics):
        console.print(note, highlight=False, soft_wrap=True)
    if by_env:
        console.print(env_table(by_env, title=f"eval per env ({len(by_env['per_env'])} envs)"))
    console.print(f"report: {path}", highlight=False, soft_wrap=True)
    console.print(f"episodes: {parquet} and {readable}", highlight=False, soft_wrap=True)
    console.print(f"look at them: {view_command(parquet)}", highlight=False, soft_wrap=True)
    env_errors_of_each_env(console, cfg, episodes, "the report lists them")


def add_to(app: typer.Typer) -> None:
    app.command("eval")(evaluate_command)
