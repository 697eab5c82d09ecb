"""Pieces the online recipes share (:mod:`omrl.training.rl` for grpo/ppo, :mod:`omrl.training.dpo`):
the models, the rollout session and task order, per-step rollout metrics,
evaluation, and keeping the rollout backend's weights in step with the trained model. The run
that plays with them, and the steps both recipes take alike, are :mod:`omrl.training.online_run`."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console

from omrl import registry
from omrl.backends.base import generation_metrics
from omrl.backends.lora_sync import lora_config_of
from omrl.backends.merged_weights import merged_state
from omrl.config.options import TrainRunConfig
from omrl.env_errors import measured
from omrl.errors import ConfigError
from omrl.mixture import EnvTask, MixedTaskOrder, mix_members
from omrl.parallel import Strategy
from omrl.rollout import PlaySpec, RolloutSession, SessionEnv
from omrl.supervisor import stage
from omrl.training.metrics import MetricsLogger, NullLogger
from omrl.training.model_setup import load_frozen_copy, load_trainable_model
from omrl.training.rl_data import TaskOrder


def episode_token_budget(cfg: TrainRunConfig) -> int:
    """The most tokens an episode can train on: generation.max_new_tokens times the turn cap
    (env.max_turns, or the env class's own; in a mixture, the largest env's); the constant of
    loss_agg_mode seq-mean-token-sum-norm."""
    caps = []
    for member in mix_members(cfg):
        turns = member.env.max_turns or getattr(registry.envs.get(member.name), "max_turns", None)
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ConfigError(
                f"loss_agg_mode seq-mean-token-sum-norm divides by the tokens an episode may train on, but the env "
                f"{member.name!r} declares no turn cap of its own; set env.max_turns, or algorithm.loss_norm_tokens"
            )
        caps.append(turns)
    return cfg.generation.max_new_tokens * max(caps)


def load_models(cfg: TrainRunConfig, strategy: Strategy, with_reference: bool) -> tuple[Any, Any, Any, Any]:
    """(model, tokenizer, rollout_model, ref_model): the trained policy, the model the hf backend
    generates with (the policy itself, or when sharded an unsharded copy refreshed after each
    update, since processes generate different lengths), and the frozen reference (or None)."""
    device = str(strategy.device)
    model, tokenizer = load_trainable_model(cfg.model, device, cfg.chat)
    model = strategy.prepare(model)
    own_copy = strategy.sharded and cfg.generation.backend == "hf"
    rollout_model = load_frozen_copy(cfg.model, device) if own_copy else model
    ref_model = strategy.prepare(load_frozen_copy(cfg.model, device), frozen=True) if with_reference else None
    return model, tokenizer, rollout_model, ref_model


def setup_rollout(cfg: TrainRunConfig, rollout_model: Any, tokenizer: Any) -> tuple[Any, Any, list[Any]]:
    """(session, training task order, test tasks of the evaluations). In a mixture (:mod:`omrl.mixture`)
    the session plays every env, the order draws each step's tasks by the envs' weights, and the
    evaluations play ``eval_tasks`` test tasks of each env. With an engine in the generation process
    (``rollout.async_generation``, vllm) the evaluations here play on the trained model (hf): one
    engine, not two."""
    if cfg.rollout.async_generation and cfg.generation.backend != "hf":
        cfg = dataclasses.replace(cfg, generation=dataclasses.replace(cfg.generation, backend="hf"))
    session = RolloutSession.from_config(cfg, model=rollout_model, tokenizer=tokenizer)
    if not session.mixture:
        return (session, *_env_tasks(cfg, session.env_of(), lambda task: task))
    orders, test_tasks = {}, []
    for env in session.envs:
        order, tests = _env_tasks(cfg, env, lambda task, n=env.name, s=env.split: EnvTask(n, s, task))
        orders[env.name] = order
        test_tasks += [EnvTask(env.name, "test", task.task) for task in tests]
    weights = {member.name: member.weight for member in mix_members(cfg)}
    return session, MixedTaskOrder(orders, weights, cfg.seed), test_tasks


def _env_tasks(cfg: TrainRunConfig, env: SessionEnv, wrap: Any) -> tuple[TaskOrder, list]:
    """One env's training task order (of its split, ``train_tasks`` of them) and its first ``eval_tasks``
    test tasks, each task as ``wrap`` makes it."""
    splits = env.pool.probe()
    tasks = splits.tasks_of(env.name, env.split)
    task_order = TaskOrder([wrap(task) for task in (tasks[: cfg.train_tasks] if cfg.train_tasks else tasks)], cfg.seed)
    # an env without a test split (a verifiers environment with no eval_dataset) trains; its evaluations play none
    tests = list(splits.split_of("test"))[: cfg.eval_tasks] if cfg.eval_tasks and "test" in splits.splits else []
    if cfg.eval_tasks and not tests:
        warnings.warn(
            f"env {env.name!r} has no test tasks: the run's evaluations (eval_tasks={cfg.eval_tasks}) play none; "
            f"give it a test split (its options: plugins.{env.name}.*) or set eval_tasks=0",
            stacklevel=2,
        )
    return task_order, [wrap(task) for task in tests]


def make_logger(
    cfg: TrainRunConfig, strategy: Strategy, start_step: int, config_dict: dict[str, Any], console: Console
) -> MetricsLogger | NullLogger:
    """The main process logs; the others hold a logger that drops everything."""
    if not strategy.is_main:
        return NullLogger()
    return MetricsLogger(
        Path(cfg.logging.output_dir),
        cfg.logging,
        cfg.steps,
        start_step=start_step,
        run_config=config_dict,
        console=console,
        description=cfg.algorithm.name,
    )


def scoring_temperature(cfg: TrainRunConfig) -> float:
    """The temperature log-probs are scored at: the one the rollout sampled with (1 for greedy)."""
    return cfg.generation.temperature if cfg.generation.temperature > 0 else 1.0


def rollout_seed(cfg: TrainRunConfig, step: int, strategy: Strategy) -> int:
    """Different per step and per process; with one process, ``seed * 1_000_003 + step``."""
    return (cfg.seed * 1_000_003 + step) * strategy.world_size + strategy.rank


def evaluate(
    cfg: TrainRunConfig, session: RolloutSession, strategy: Strategy, test_tasks: list[Any]
) -> dict[str, float]:
    """Success and score on the test tasks: greedy, or the mean of ``eval_samples_per_task``
    samples at ``eval_temperature``; and the evaluation's own generation metrics, prefixed ``eval_``
    (taken here, so the next step's rollout metrics count only its own generation)."""
    if not test_tasks:
        return {}
    limits = dataclasses.replace(session.limits, temperature=cfg.eval_temperature)
    spec = PlaySpec("test", cfg.eval_samples_per_task, cfg.seed, limits=limits)
    played = session.play(strategy.shard(test_tasks), spec).episodes
    episodes = measured(played)  # an env that failed, or a prompt past max_context, says nothing of the model
    n, won, score = strategy.sum([len(episodes), sum(ep.won for ep in episodes), sum(ep.score for ep in episodes)])
    unmeasured = strategy.sum([len(played) - len(episodes)])[0]
    stats = session.backend.take_stats() if session.backend is not None else {}
    if strategy.world_size > 1:
        stats = strategy.sum_dicts(stats)
    generation = {f"eval_{name}": value for name, value in generation_metrics(stats).items()}
    per_env: dict[str, float] = {}
    if session.mixture:  # each env's, and their macro average (every env counts alike)
        for env in session.env_names:
            mine = [ep for ep in episodes if ep.env == env]
            k, w, s = strategy.sum([len(mine), sum(ep.won for ep in mine), sum(ep.score for ep in mine)])
            if k:
                per_env[f"eval_success/{env}"], per_env[f"eval_score/{env}"] = w / k, s / k
        successes = [v for key, v in per_env.items() if key.startswith("eval_success/")]
        per_env["eval_success_macro"] = sum(successes) / max(1, len(successes))
    rates = {"eval_success": won / n, "eval_score": score / n} if n else {}  # nothing measured: no rate
    return {**rates, "eval_unmeasured": unmeasured, **per_env, **generation}


def sync_rollout_weights(
    strategy: Strategy, model: Any, rollout_model: Any, session: RolloutSession, version: int
) -> None:
    """The rollout backend gets the trained weights, those after ``version`` steps (a skipped update's
    included: the weights are then the step before's; a no-op for hf sharing the very model)."""
    with stage("weight_sync", episode=f"weights after {version} steps"):
        _sync(strategy, model, rollout_model, session, version)


def _sync(strategy: Strategy, model: Any, rollout_model: Any, session: RolloutSession, version: int) -> None:
    if rollout_model is not model:  # sharded, with hf: refresh the unsharded copy in place
        strategy.copy_whole_weights(model, rollout_model)
    elif session.backend.shared:  # one server for every process: the main one sends, the rest wait for it
        state = strategy.state_dict(model, all_ranks=False)  # gathered whole on the main process only
        if strategy.is_main:  # a LoRA model's adapter config goes along: weight_sync=lora sends the adapter alone
            session.backend.update_weights(state, version=version, lora_config=lora_config_of(model))
        strategy.barrier()
    elif session.backend.merges_lora:
        session.backend.update_weights(merged_state(model, strategy.state_dict(model)))
    else:
        session.backend.update_weights(strategy.state_dict(model))
