"""One step's rollout, as the trainer and the generation process both play it: the episodes of a step's
tasks as the run's strategy plays them (:func:`play_step`), and their metrics over every process
(:func:`step_metrics`)."""

from __future__ import annotations

from typing import Any, Sequence

from omrl.backends.base import generation_metrics
from omrl.config.options import TrainRunConfig
from omrl.parallel import Strategy
from omrl.rollout import Played, PlaySpec, RolloutSession
from omrl.rollout.outcomes import seat_metrics
from omrl.search import play_strategy, strategy_traits
from omrl.training.metrics import CUTS, PER_ENV_COUNTS, per_env_metrics, rollout_metrics


def trees_per_task(cfg: TrainRunConfig) -> int:
    """Search trees grown per task: 1 for a strategy whose ``group_size`` samples are one tree, else
    ``group_size`` (Tree-GRPO's M trees per prompt), as the strategy declares it."""
    return 1 if strategy_traits(cfg.rollout.strategy).group_in_one_tree else cfg.group_size


def play_step(cfg: TrainRunConfig, session: RolloutSession, tasks: Sequence[Any], seed: int) -> Played:
    """This step's episodes of ``tasks`` as the strategy plays them, rewards composed: every root-to-leaf
    path of ``trees_per_task(cfg)`` trees per task, ``Episode.group`` numbering the trees (consecutive
    per task; see :func:`omrl.training.tree_batch.paths_to_batch`), or the batched rollout's
    ``group_size`` samples per task where the strategy plays that (:func:`omrl.training.config_checks.searched` is False)."""
    copies = trees_per_task(cfg)
    group_size = cfg.group_size if copies == 1 else 1
    spec = PlaySpec(cfg.env.split, group_size, seed, strategy=cfg.rollout.strategy, budget=cfg.rollout.budget)
    return play_strategy(session, [task for task in tasks for _ in range(copies)], spec)


def step_metrics(played: Played, seconds: float, session: RolloutSession, strategy: Strategy) -> dict[str, float]:
    """The rollout's metrics over every process: means average (every process played as many
    episodes), counts add, and so does ``tokens_per_s``; the backend's speeds (``decode_tokens_per_s``,
    ``prefill_tokens_per_s``) are one process's, from the tokens and seconds of all of them. In a
    mixture, each metric of the episodes also per env (``success/webshop``, :func:`per_env_metrics`)."""
    episodes = played.episodes
    metrics = rollout_metrics(episodes, seconds, played.rewards)
    if session.mixture:
        metrics.update(per_env_metrics(episodes, seconds, played.env_rewards, session.env_names))
    stats = session.backend.take_stats() if session.backend is not None else {}  # this step's, before any eval
    if strategy.world_size > 1:
        added = ("env_errors", "overlong_prompts", "tokens_per_s", "cut_replies", *CUTS)
        per_env = {k: v for k, v in metrics.items() if "/" in k}
        overall = {k: v for k, v in metrics.items() if "/" not in k}
        metrics = {k: v if k in added else v / strategy.world_size for k, v in strategy.sum_dicts(overall).items()}
        metrics.update(sum_per_env(strategy, per_env))
        stats = strategy.sum_dicts(stats)
    # games of several seats: win, draw and loss rates per seat and opponent, over every process's games
    metrics.update(seat_metrics(episodes, strategy.sum_dicts))
    return {**metrics, **generation_metrics(stats)}


#: per-env means over the episodes that did not fail in the env and got a model turn (the others
#: measured no model):
#: these, each reward term's (``reward_<name>``) and the tool-use rates (omrl.evaluation.tool_use)
PLAYED_MEANS = ("reward", "success", "score", "tool_call_rate", "tool_calls_per_episode")


def sum_per_env(strategy: Strategy, metrics: dict[str, float]) -> dict[str, float]:
    """Per-env metrics (``<metric>/<env>``) over every process, as one process would have computed them
    from all the episodes: counts add; each mean is weighted by what it is a mean over on each process
    (episodes, played episodes, turns, tool calls); the prefill hit rate comes from the summed counts."""

    def weight(key: str) -> float:
        name, env = key.split("/", 1)
        episodes = metrics[f"episodes/{env}"]
        played = episodes - metrics[f"env_errors/{env}"] - metrics[f"overlong_prompts/{env}"]
        if name in PLAYED_MEANS or name.startswith("reward_"):
            return played
        if name == "valid_tool_call_rate":  # a share of the tool calls
            return played * metrics[f"tool_calls_per_episode/{env}"]
        return episodes * metrics[f"turns/{env}"] if name == "format_ok" else episodes

    means = [k for k in metrics if k.split("/")[0] not in PER_ENV_COUNTS and not k.startswith("prefill_hit_rate/")]
    sent = {k: metrics[k] for k in metrics if k.split("/")[0] in PER_ENV_COUNTS}
    sent.update({k: metrics[k] * weight(k) for k in means})
    sent.update({f"weight of {k}": weight(k) for k in means})
    summed = strategy.sum_dicts(sent)
    out = {k: v for k, v in summed.items() if k.split("/")[0] in PER_ENV_COUNTS}
    for key in [k for k in summed if not k.startswith("weight of ") and k.split("/")[0] not in PER_ENV_COUNTS]:
        total = summed[f"weight of {key}"]
        out[key] = summed[key] / total if total else 0.0
    for key in [k for k in out if k.startswith("prefill_reused/")]:
        env = key.split("/", 1)[1]
        computed, reused = out.get(f"prefill_tokens/{env}", 0.0), out[key]
        if computed + reused:
            out[f"prefill_hit_rate/{env}"] = reused / (computed + reused)
    return out
