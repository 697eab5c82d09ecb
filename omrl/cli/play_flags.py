"""The flags, help texts and config reading that ``omrl rollout``, ``eval``, ``train`` and ``sweep`` share,
declared once, and the progress bar they play under."""

from __future__ import annotations

import inspect

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
    "With a strategy that has a select option (best_of_n, beam): what picks each task's answer (plugins.<strategy>.select): env_reward "
    "(the env's reward, an oracle; env for short on this flag), random, majority (the most common final action), rm (a reward model, "
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
TEMPLATE_OPTION = typer.Option(None, "--template", help="Action template (env.template).")
BUDGET_OPTION = typer.Option(None, "--budget", help=BUDGET_HELP)
SELECT_OPTION = typer.Option(None, "--select", help=SELECT_HELP)
AGENT_OPTION = typer.Option(None, "--agent", help=AGENT_HELP)
AGENT_CMD_OPTION = typer.Option(None, "--agent-cmd", help=AGENT_CMD_HELP)
REWARD_OPTION = typer.Option(None, "--reward", help=REWARD_HELP)


def agent_flags(agent: str | None, agent_cmd: str | None, reward: str | None) -> dict[str, str | None]:
    """The config keys the --agent, --agent-cmd and --reward flags set; a flag given blank (``--agent "$UNSET"``)
    is refused, not read as no agent."""
    from omrl.errors import ConfigError

    flags = {"--agent": agent, "--agent-cmd": agent_cmd, "--reward": reward}
    for flag, value in flags.items():
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} is blank ({value!r}); give it (module:function, or a command), or leave it out")
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


def with_flags(args: list[str] | None, flags: dict) -> list[str]:
    """The command line ``args`` with each flag given (not None) as the override of the key it sets: what
    the user chose, which a trained model's or a preset's settings must not replace (``--template xml``)."""
    return [*(args or []), *(f"{key}={value}" for key, value in flags.items() if value is not None)]


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
        def __init__(self) -> None:
            super().__init__()
            self.done: list = []  # the episodes of the tasks played to their end, for a Ctrl-C to keep

        def generated(self, tokens: int) -> None:
            super().generated(tokens)
            bar.update(task, speed=f"{self.tokens_per_second:.0f}")

        def finished_task(self, episodes) -> None:
            super().finished_task(episodes)
            bar.update(task, advance=1)

        def finished_more(self, episodes) -> None:
            super().finished_more(episodes)
            self.done.extend(episodes)
            bar.update(task, success=f"{100 * self.success_rate:.0f}%")

    return bar, BarProgress()


def played_so_far(progress, total: int, whole: bool, write, after: str) -> str:
    """What a Ctrl-C of a rollout or an eval says once it kept what it could: the episodes of each task
    played to its end (``progress.done``), written without rewards by ``write(episodes) -> path``, where
    ``whole`` says a task's report carried every episode of it (the batched rollout's and an agent's do; a
    search reports its answer alone) and no game of several seats was played (a task's report holds one
    seat's). ``after``: what the command would have written once every task was played."""
    episodes = list(progress.done)
    if not whole or not episodes or any(ep.info.get("players") for ep in episodes):
        return (
            f"{progress.episodes} of {total} tasks were played; nothing is written ({after}): run it again, "
            "or with fewer --num-tasks"
        )
    path = write(episodes)
    return (
        f"{progress.episodes} of {total} tasks were played; their {len(episodes)} episodes are written without "
        f"rewards to {path} (and its JSONL), and {after}: run it again for every task, scored"
    )
