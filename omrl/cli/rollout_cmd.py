"""``omrl rollout``: play episodes with a model (or the env's expert) and write trajectories."""

from __future__ import annotations

import inspect
import os

import typer

ARGS_HELP = (
    "\\[PRESET] \\[key=value ...]: a preset name or YAML path, then config overrides (see `omrl config keys rollout`)."
)
STRATEGY_HELP = (
    "Rollout strategy: chain, best_of_n, beam, dfsdt, mcts, mc_value (process labels) or a plugin's "
    "(`omrl plugins --kind strategy`); its options in plugins.NAME (e.g. plugins.beam.width=3). "
    "Default: rollout.strategy (chain: the batched rollout)."
)
BUDGET_HELP = "With --strategy: model tokens each task's search may generate, scorer prompts included (0: no limit)."
SELECT_HELP = (
    "With a strategy that has a select option (best_of_n, beam): what picks each task's answer (plugins.<strategy>.select): env (the env's "
    "reward, an oracle), random, majority (the most common final action), rm (a reward model, "
    "plugins.rm.path=DIR), logprob, self_eval or a plugin's scorer."
)
SELECT_ALIASES = {"env": "env_reward"}
ENV_HELP = (
    "Env name (env.name; see `omrl env list`), or a mixture: gridworld:0.5,textcraft:0.5 "
    "(env.mix: each env's own settings)."
)

AGENT_HELP = "An agent program that plays each episode through omrl's OpenAI-compatible endpoint: module:function (agent.callable)."
AGENT_CMD_HELP = "The same as a command, e.g. 'python my_agent.py' (agent.command; OPENAI_BASE_URL and OMRL_TASK in its environment)."
REWARD_HELP = "With an agent: module:function scoring its episodes (agent.reward); default: the env scores its answer."

# the flags rollout, eval and train share, declared once
ENV_OPTION = typer.Option(None, "--env", help=ENV_HELP)
STRATEGY_OPTION = typer.Option(None, "--strategy", help=STRATEGY_HELP)
BUDGET_OPTION = typer.Option(None, "--budget", help=BUDGET_HELP)
SELECT_OPTION = typer.Option(None, "--select", help=SELECT_HELP)
AGENT_OPTION = typer.Option(None, "--agent", help=AGENT_HELP)
AGENT_CMD_OPTION = typer.Option(None, "--agent-cmd", help=AGENT_CMD_HELP)
REWARD_OPTION = typer.Option(None, "--reward", help=REWARD_HELP)


def agent_flags(agent: str | None, agent_cmd: str | None, reward: str | None) -> dict[str, str | None]:
    """The config keys the --agent, --agent-cmd and --reward flags set."""
    return {"agent.callable": agent, "agent.command": agent_cmd, "agent.reward": reward}


def select_scorer(select: str | None) -> str | None:
    """The scorer a --select name means (``env`` is ``env_reward``); None when the flag was not given."""
    return SELECT_ALIASES.get(select, select) if select else None


def check_select(select: str | None, strategy: str) -> None:
    """--select sets how a strategy picks its answer (its ``select`` option), so it means nothing
    to a strategy without one."""
    from omrl import registry
    from omrl.errors import ConfigError

    if not select or "select" in _options_of(registry.strategies.get(strategy)):
        return
    kind = registry.strategies.kinds[0]
    takers = [c.name for c in registry.strategies.components(kind) if "select" in _options_of(c.obj)]
    raise ConfigError(
        f"--select {select} is for --strategy {' or '.join(takers) or '(none installed)'} (how it picks its "
        f"answer), but the strategy is {strategy!r}; valid: --strategy {takers[0] if takers else '...'} "
        f"--select {select}, or no --select"
    )


def _options_of(strategy_fn) -> set[str]:
    return set(inspect.signature(strategy_fn).parameters)


def config_with_select(cls: type, args: list[str], flags: dict, select: str | None, preset: str | None = None):
    """The command's config (``preset`` when the command line names none), with --select as the
    ``select`` option of the strategy it plays (``plugins.<strategy>.select``), which must have one."""
    from omrl.cli.settings import trained_env
    from omrl.config import command_line_config

    cfg = command_line_config(cls, args, flags, preset)
    trained = trained_env(cfg.model.name, args, flags.get("env.name"))
    if trained:  # a run's model plays the env it trained on unless the command line names one
        flags = {**flags, **trained}
        cfg = command_line_config(cls, args, flags, preset)
    if not select:
        return cfg
    check_select(select, cfg.rollout.strategy)
    return command_line_config(
        cls, args, {**flags, f"plugins.{cfg.rollout.strategy}.select": select_scorer(select)}, preset
    )


def check_strategy(strategy: str, budget: int, max_new_tokens: int) -> None:
    """Fail before any model loads: an unknown strategy, or a budget too small for one reply."""
    from omrl import registry
    from omrl.search.context import check_budget

    registry.strategies.get(strategy)
    check_budget(budget, max_new_tokens)


def check_before_loading(cfg) -> None:
    """What can be refused before a model loads (seconds to minutes): an unknown env, an env whose
    package is not installed (naming its extra), each env of a mixture alike (and the mixture itself:
    weights, an env named twice), the reward settings, and for training, the whole train config
    (:func:`omrl.training.config_checks.check_config`)."""
    from omrl import registry, rewards
    from omrl.envs import install_command, package_installed
    from omrl.errors import ConfigError
    from omrl.mixture import mix_members

    members = mix_members(cfg)  # one member for a single env
    for member in members:
        env_class = registry.envs.get(member.name)
        if isinstance(env_class, type) and not package_installed(env_class):
            raise ConfigError(
                f"the {member.name} env needs the package {env_class.package}, not installed: "
                f"{install_command(env_class)}"
            )
        check_plugin_blocks(member.plugins)  # the run's block with the env's own merged in
        check_family_block(member.name, member.plugins, {m.name for m in members})
        rewards.check_weights(member.reward_weights)
        rewards.check_options(member.reward_weights, member.plugins)
    rewards.check_allocation(cfg.reward.allocation, cfg.reward.gamma)
    check_agent(cfg)
    algorithm = getattr(cfg, "algorithm", None)
    if algorithm is not None:
        registry.algorithms.component(algorithm.advantage, kind="advantage")
        registry.algorithms.component(algorithm.policy_loss, kind="policy_loss")
        registry.algorithms.component(algorithm.kl_estimator, kind="kl")
        if algorithm.rollout_correction != "auto":
            registry.algorithms.component(algorithm.rollout_correction, kind="rollout_correction")
        from omrl.training.config_checks import check_config

        check_config(cfg)


def check_plugin_blocks(plugins: dict) -> None:
    """Each ``plugins.<name>`` block is read by the component of that whole name (colon and all:
    ``reasoning-gym:letter_counting``); one that names no component would be ignored, silently."""
    import difflib

    from omrl import registry
    from omrl.errors import ConfigError

    if not plugins:
        return
    known = {name for found in registry.ALL.values() for kind in found.kinds for name in found.names(kind)}
    for name in plugins:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(f'plugins.{match}' for match in close)}?" if close else ""
            raise ConfigError(
                f"plugins.{name}: no env, template, reward, strategy, scorer or algorithm is named {name}, so no "
                f"plugin would read these options{hint} (`omrl plugins` lists the names)"
            )


def check_family_block(env: str, plugins: dict, played: set[str]) -> None:
    """A family's block (``plugins.verifiers``) is read by the env of that name alone, not by a member of the
    family (``verifiers:vf_sums`` reads ``plugins."verifiers:vf_sums"``): where only members play, its
    options would be ignored, silently."""
    from omrl import registry
    from omrl.errors import ConfigError

    family = env.partition(":")[0]
    if family != env and family in plugins and family not in played and family in registry.envs.names():
        raise ConfigError(
            f"plugins.{family} is read by the env {family!r} alone, which this run does not play; the env "
            f"{env!r} reads its options from its own block: plugins.{env}.NAME=VALUE"
        )


def check_agent(cfg) -> None:
    """An agent program (``agent.*``) is refused where it cannot play: beside the scripted expert, in a
    mixture, under a search strategy or async generation; and its callable and reward must import.
    Any backend serves it (the gateway gives each backend token ids and records the ids it returns)."""
    from omrl.config.sections import AGENT_SAMPLING
    from omrl.errors import ConfigError
    from omrl.rollout.session import agent_of

    agent = getattr(cfg, "agent", None)
    if agent is None or agent_of(cfg) is None:
        return
    if agent.sampling not in AGENT_SAMPLING:
        raise ConfigError(f"agent.sampling is {agent.sampling!r}; valid: {', '.join(AGENT_SAMPLING)}")
    if getattr(cfg, "use_expert", False):
        raise ConfigError("--expert plays the env's scripted expert; an agent program plays with the model (drop one)")
    from omrl.mixture import is_mixture

    if is_mixture(cfg.env):
        raise ConfigError("an agent program plays one env's tasks; a mixture of envs is not supported with agent.*")
    from omrl.search.context import plays_batched

    rollout = getattr(cfg, "rollout", None)  # a sweep names its strategies apart
    strategy, budget = (rollout.strategy, rollout.budget) if rollout is not None else ("chain", 0)
    if not plays_batched(strategy, budget):
        raise ConfigError(
            f"an agent program plays whole episodes: strategy {strategy!r} (budget {budget}) would fork an "
            "agent's process mid-episode; use a strategy that plays the batched rollout with no budget (chain)"
        )
    if getattr(getattr(cfg, "rollout", None), "async_generation", False):
        raise ConfigError("rollout.async_generation is not supported with an agent program yet; set it to false")


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


def progress_bar(total: int, label: str, sampled: bool = True):
    """A rich progress bar plus the RolloutProgress that drives it: episodes, success so far, tokens/s
    (where a model samples: ``sampled``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from omrl.rollout import RolloutProgress

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("success {task.fields[success]}"),
        *([TextColumn("{task.fields[speed]} tok/s")] if sampled else []),
        TimeElapsedColumn(),
        transient=False,
    )
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
    env: str = ENV_OPTION,
    model: str = typer.Option(None, "--model", help="Model: built-in name, directory or hub id (model.name)."),
    template: str = typer.Option(None, "--template", help="Action template (env.template)."),
    num_tasks: int = typer.Option(None, "--num-tasks", help="Tasks to play from the start of the split."),
    group_size: int = typer.Option(None, "--group-size", help="Samples per task."),
    output: str = typer.Option(None, "--output", "-o", help="Trajectory parquet; a .jsonl goes beside it."),
    expert: bool = typer.Option(False, "--expert", help="Play the env's scripted expert instead of a model."),
    strategy: str = STRATEGY_OPTION,
    budget: int = BUDGET_OPTION,
    select: str = SELECT_OPTION,
    agent: str = AGENT_OPTION,
    agent_cmd: str = AGENT_CMD_OPTION,
    reward: str = REWARD_OPTION,
) -> None:
    """Play episodes and write them as a trajectory parquet plus a readable JSONL.

    With --strategy, every root-to-leaf path of each task's search tree is written, with node and parent ids.
    """
    from rich.console import Console
    from rich.text import Text

    from omrl.cli.eval_cmd import env_errors_of_each_env
    from omrl.cli.settings import env_label, play_settings, settings_block
    from omrl.config.options import RolloutRunConfig
    from omrl.errors import EnvFailure
    from omrl.evaluation import (
        check_max_env_error_rate,
        env_error_reasons,
        env_table,
        evaluate,
        evaluate_by_env,
        held_warnings,
        metrics_table,
        replay_warnings,
    )
    from omrl.mixture import is_mixture
    from omrl.rollout import RolloutSession
    from omrl.rollout.convert import keep_unscored, unscored_path, write_trajectories
    from omrl.view import view_command

    cfg = config_with_select(
        RolloutRunConfig,
        args,
        {
            "env.name": env,
            "model.name": model,
            "env.template": template,
            "num_tasks": num_tasks,
            "group_size": group_size,
            "output": output,
            "use_expert": True if expert else None,
            "rollout.strategy": strategy,
            "rollout.budget": budget,  # 0 is a budget (no limit), not "not given"
            **agent_flags(agent, agent_cmd, reward),
        },
        select,
    )
    strategy, budget = cfg.rollout.strategy, cfg.rollout.budget
    check_strategy(strategy, budget, cfg.generation.max_new_tokens)
    check_before_loading(cfg)
    check_rollout_outputs(cfg)
    check_max_env_error_rate(cfg.max_env_error_rate)
    console = Console()
    play_settings(cfg, args, None, console)
    console.print(settings_block(cfg), highlight=False, soft_wrap=True)
    from omrl.supervisor import supervise

    with (
        keep_unscored(unscored_path(cfg.output)),
        supervise(cfg.deadlines, os.path.dirname(os.path.abspath(cfg.output))),
        held_warnings() as caught,
        RolloutSession.from_config(cfg, expert=cfg.use_expert) as session,
    ):
        tasks = session.task_ids(cfg.env.split, cfg.num_tasks)  # a mixture: num_tasks of each env
        for name, count in tasks_of_each_env(cfg, session, tasks).items():
            if count < cfg.num_tasks:
                console.print(Text(f"{name} has only {count} tasks in split {cfg.env.split!r}", style="yellow"))
        from omrl.rollout import PlaySpec
        from omrl.search import play_strategy, plays_batched, search_metrics

        bar, progress = progress_bar(len(tasks), f"rollout ({strategy}, tasks)", sampled=not cfg.use_expert)
        with bar:
            spec = PlaySpec(cfg.env.split, cfg.group_size, cfg.seed, cfg.use_expert, strategy=strategy, budget=budget)
            played = play_strategy(session, tasks, spec, progress)
            trees, episodes = played.trees, played.episodes
        if not plays_batched(strategy, budget):  # the batched rollout's samples were no search
            console.print(metrics_table(search_metrics(trees), title=f"search: {strategy}"))
    replay_warnings(caught, episodes)
    if episodes and all(ep.end_reason == "env_error" for ep in episodes):
        who = "expert" if cfg.use_expert else "env"
        raise EnvFailure(
            f"every episode failed in the {env_label(cfg)} {who} (nothing written); the first reasons: "
            f"{'; '.join(env_error_reasons(episodes))}"
        )
    parquet, readable = write_trajectories(episodes, cfg.output, session.tokenizer)
    metrics = evaluate(episodes)
    console.print(metrics_table(metrics, title=f"rollout: {env_label(cfg)}"))
    if is_mixture(cfg.env):
        console.print(env_table(evaluate_by_env(episodes, metrics), title="rollout per env"))
    console.print(f"wrote {len(episodes)} episodes to {parquet} and {readable}", soft_wrap=True)
    console.print(f"look at them: {view_command(parquet)}", highlight=False, soft_wrap=True)
    env_errors_of_each_env(console, cfg, episodes, "they are written, as end_reason env_error")


def add_to(app: typer.Typer) -> None:
    app.command("rollout")(rollout)
