"""Pieces the online recipes share (:mod:`omrl.training.rl` for grpo/ppo, :mod:`omrl.training.dpo`):
config checks, the models, the rollout session and task order, per-step rollout metrics,
evaluation, keeping the rollout backend's weights in step with the trained model, and
:class:`OnlineRecipe`, the setup and step-end both recipes run alike (each recipe's
``setup`` and ``train`` read top to bottom in its own file)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from rich.console import Console

from omrl import registry
from omrl.algos import RECIPES, AdvantageInput
from omrl.atomic import atomic_write_text
from omrl.backends.base import generation_metrics
from omrl.config import to_dict, to_yaml
from omrl.config.options import TrainRunConfig
from omrl.data import Batch, Episode, write_episodes
from omrl.errors import ConfigError, EnvFailure, OmrlError
from omrl.evaluation import check_max_env_error_rate
from omrl.parallel import Strategy
from omrl.rollout import RolloutSession
from omrl.search import play_strategy, plays_batched, strategy_traits
from omrl.search.context import check_budget
from omrl.training import async_generation, dynamic_sampling
from omrl.training import checkpoint as ckpt
from omrl.training.common import seed_everything
from omrl.training.metrics import MetricsLogger, NullLogger, StepCallback, peak_memory, rollout_metrics
from omrl.training.model_setup import load_frozen_copy, load_trainable_model
from omrl.training.optim import apply_update, build_optimizer, build_scheduler
from omrl.training.recipe import close_all, save_final, save_recipe_checkpoint, start_recipe
from omrl.training.rl_data import TaskOrder
from omrl.training.tree_batch import with_update_columns

#: a step whose every episode failed in the env is played again this many times before the run stops
ENV_FAILURE_REPLAYS = 2
ENV_FAILURE_WAIT = 5.0  # seconds before the first replay, doubled before each next one


def check_config(cfg: TrainRunConfig, strategy: Strategy) -> None:
    """Refuse values no online recipe can run with, naming the key and what is valid."""
    algo = cfg.algorithm
    if algo.name not in RECIPES:
        raise ConfigError(f"unknown algorithm.name {algo.name!r}; valid: {', '.join(RECIPES)}")
    for key in ("steps", "tasks_per_step", "group_size", "ppo_epochs", "optim.micro_batch_size"):
        value = cfg.optim.micro_batch_size if key == "optim.micro_batch_size" else getattr(cfg, key)
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    strategy.check_divisible("tasks_per_step", cfg.tasks_per_step)
    if cfg.mini_batch_size < 0:
        raise ConfigError(f"mini_batch_size must be >= 0 (0: the whole rollout), got {cfg.mini_batch_size}")
    if cfg.eval_samples_per_task < 1 or (cfg.eval_samples_per_task > 1 and cfg.eval_temperature <= 0):
        raise ConfigError(
            f"eval_samples_per_task={cfg.eval_samples_per_task} is invalid; valid: 1, or more "
            "with eval_temperature > 0 (greedy samples of a task are all the same)"
        )
    if cfg.train_tasks < 0:
        raise ConfigError(f"train_tasks must be >= 0 (0: the whole split), got {cfg.train_tasks}")
    gen = cfg.generation
    if not gen.temperature >= 0 or not 0 < gen.top_p <= 1:
        raise ConfigError(
            f"generation.temperature must be >= 0 (0: greedy) and generation.top_p in (0, 1]; got "
            f"temperature={gen.temperature}, top_p={gen.top_p}"
        )
    if gen.max_new_tokens < 1 or gen.max_context <= gen.max_new_tokens:
        raise ConfigError(
            f"generation.max_new_tokens must be >= 1 and generation.max_context larger than it (it holds "
            f"the prompt too); got max_new_tokens={gen.max_new_tokens}, max_context={gen.max_context}"
        )
    if algo.critic not in ("head", "model"):
        raise ConfigError(f"unknown algorithm.critic {algo.critic!r}; valid: head, model")
    check_rollout_strategy(cfg)
    check_max_env_error_rate(cfg.max_env_error_rate)
    async_generation.check_async(cfg, strategy.world_size)
    dynamic_sampling.check(cfg)


def check_rollout_strategy(cfg: TrainRunConfig) -> None:
    """A known ``rollout.strategy`` and a budget of at least one reply (every recipe trains on trees)."""
    registry.strategies.get(cfg.rollout.strategy)  # unknown: names the valid ones
    check_budget(cfg.rollout.budget, cfg.generation.max_new_tokens)


def searched(cfg: TrainRunConfig) -> bool:
    """Whether a step's episodes are search paths (trained as trees), rather than the batched rollout's
    samples (trained as chains): the latter when the strategy declares it plays that rollout without a
    budget and the run gives none (:class:`omrl.search.StrategyTraits`)."""
    return not plays_batched(cfg.rollout.strategy, cfg.rollout.budget)


def trees_per_task(cfg: TrainRunConfig) -> int:
    """Search trees grown per task: 1 for a strategy whose ``group_size`` samples are one tree, else
    ``group_size`` (Tree-GRPO's M trees per prompt), as the strategy declares it."""
    return 1 if strategy_traits(cfg.rollout.strategy).group_in_one_tree else cfg.group_size


def play_step(cfg: TrainRunConfig, session: RolloutSession, tasks: Sequence[int], seed: int) -> list[Episode]:
    """This step's episodes of ``tasks`` as the strategy plays them, rewards composed: every root-to-leaf
    path of ``trees_per_task(cfg)`` trees per task, ``Episode.group`` numbering the trees (consecutive
    per task; see :func:`omrl.training.tree_batch.paths_to_batch`), or the batched rollout's
    ``group_size`` samples per task where the strategy plays that (:func:`searched` is False)."""
    copies = trees_per_task(cfg)
    _, episodes = play_strategy(
        session,
        cfg.rollout.strategy,
        [task for task in tasks for _ in range(copies)],
        split=cfg.env.split,
        budget=cfg.rollout.budget,
        group_size=cfg.group_size if copies == 1 else 1,
        seed=seed,
    )
    return episodes


def episode_token_budget(cfg: TrainRunConfig) -> int:
    """The most tokens an episode can train on: generation.max_new_tokens times the turn cap
    (env.max_turns, or the env's own); the constant of loss_agg_mode seq-mean-token-sum-norm."""
    turns = cfg.env.max_turns or int(getattr(registry.envs.get(cfg.env.name), "max_turns", 1))
    return cfg.generation.max_new_tokens * turns


def check_algorithms(cfg: TrainRunConfig, advantage_fn: Any, has_critic: bool, greedy: bool = False) -> None:
    """Run the advantage estimator once on a tiny made-up rollout of one task, before any real
    rollout: an estimator that needs what this run lacks (a critic's values) or a group size
    under which every advantage is 0 is refused now, naming the fix, not after a whole rollout.
    ``greedy``: the run plays the greedy baselines the estimator asked for."""
    algo, group = cfg.algorithm, cfg.group_size
    if not strategy_traits(cfg.rollout.strategy).group_in_one_tree:  # a task's group is the leaves of its
        group = max(group, 2)  # group_size trees, and a tree has several
    rewards = torch.zeros(group, 3)
    # the samples of the task differ, the last one at pass_threshold: estimators counting passes see both
    rewards[:, -1] = torch.arange(1 - group, 1, dtype=torch.float32) + algo.pass_threshold
    probe = AdvantageInput(
        token_rewards=rewards,
        loss_mask=torch.ones(group, 3),
        group_ids=torch.zeros(group, dtype=torch.long),
        values=torch.zeros(group, 3) if has_critic else None,
        turn_index=torch.zeros(group, 3, dtype=torch.long),
        turn_rewards=rewards[:, -1:],
        turn_state_ids=torch.zeros(group, 1, dtype=torch.long),
        turn_node_ids=torch.arange(group)[:, None] if searched(cfg) else None,
        turn_parent_ids=torch.full((group, 1), -1) if searched(cfg) else None,
        tree_ids=torch.zeros(group, dtype=torch.long) if searched(cfg) else None,
        greedy_scores=torch.full((group,), algo.pass_threshold - group) if greedy else None,
    )
    try:
        advantages, _ = advantage_fn(probe, algo)
    except OmrlError as err:
        raise ConfigError(
            f"algorithm.advantage={algo.advantage} cannot run with algorithm.name={algo.name}: {err}"
            + ("; gae needs a critic: use algorithm.name=ppo" if not has_critic else "")
        ) from err
    if not advantages.any():
        raise ConfigError(
            f"algorithm.advantage={algo.advantage} gives every sample an advantage of 0 with "
            f"group_size={group} (it compares the samples of a task): nothing would be learned; "
            "use group_size >= 2"
        )


def load_models(cfg: TrainRunConfig, strategy: Strategy, with_reference: bool) -> tuple[Any, Any, Any, Any]:
    """(model, tokenizer, rollout_model, ref_model): the trained policy, the model the hf backend
    generates with (the policy itself, or when sharded an unsharded copy refreshed after each
    update, since processes generate different lengths), and the frozen reference (or None)."""
    device = str(strategy.device)
    model, tokenizer = load_trainable_model(cfg.model, device)
    model = strategy.prepare(model)
    own_copy = strategy.sharded and cfg.generation.backend == "hf"
    rollout_model = load_frozen_copy(cfg.model, device) if own_copy else model
    ref_model = strategy.prepare(load_frozen_copy(cfg.model, device), frozen=True) if with_reference else None
    return model, tokenizer, rollout_model, ref_model


def setup_rollout(
    cfg: TrainRunConfig, rollout_model: Any, tokenizer: Any
) -> tuple[RolloutSession, TaskOrder, list[Any]]:
    """(session, training task order, test tasks of the evaluations)."""
    session = RolloutSession.from_config(cfg, model=rollout_model, tokenizer=tokenizer)
    splits = session.pool.probe()
    tasks = splits.split_of(cfg.env.split)
    task_order = TaskOrder(list(tasks[: cfg.train_tasks] if cfg.train_tasks else tasks), cfg.seed)
    if not task_order.tasks:
        raise ConfigError(f"env {cfg.env.name!r} has no tasks in split {cfg.env.split!r}; choose another env.split")
    return session, task_order, list(splits.split_of("test"))[: cfg.eval_tasks]


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


def rollout_seed(cfg: TrainRunConfig, step: int, strategy: Strategy) -> int:
    """Different per step and per process; with one process, ``seed * 1_000_003 + step``."""
    return (cfg.seed * 1_000_003 + step) * strategy.world_size + strategy.rank


def step_metrics(episodes: list[Any], seconds: float, session: RolloutSession, strategy: Strategy) -> dict[str, float]:
    """The rollout's metrics over every process: means average (every process played as many
    episodes), counts add, and so does ``tokens_per_s``; the backend's speeds (``decode_tokens_per_s``,
    ``prefill_tokens_per_s``) are one process's, from the tokens and seconds of all of them."""
    metrics = rollout_metrics(episodes, seconds, session.reward_summary)
    stats = session.backend.take_stats() if session.backend is not None else {}  # this step's, before any eval
    if strategy.world_size > 1:
        added = ("env_errors", "tokens_per_s")
        metrics = {k: v if k in added else v / strategy.world_size for k, v in strategy.sum_dicts(metrics).items()}
        stats = strategy.sum_dicts(stats)
    return {**metrics, **generation_metrics(stats)}


def evaluate(
    cfg: TrainRunConfig, session: RolloutSession, strategy: Strategy, test_tasks: list[Any]
) -> dict[str, float]:
    """Success and score on the test tasks: greedy, or the mean of ``eval_samples_per_task``
    samples at ``eval_temperature``; and the evaluation's own generation metrics, prefixed ``eval_``
    (taken here, so the next step's rollout metrics count only its own generation)."""
    if not test_tasks:
        return {}
    sampling = session.limits
    session.limits = dataclasses.replace(sampling, temperature=cfg.eval_temperature)
    try:
        episodes = session.play(
            strategy.shard(test_tasks), split="test", group_size=cfg.eval_samples_per_task, seed=cfg.seed
        )
    finally:
        session.limits = sampling
    n, won, score = strategy.sum([len(episodes), sum(ep.won for ep in episodes), sum(ep.score for ep in episodes)])
    stats = session.backend.take_stats() if session.backend is not None else {}
    if strategy.world_size > 1:
        stats = strategy.sum_dicts(stats)
    generation = {f"eval_{name}": value for name, value in generation_metrics(stats).items()}
    return {"eval_success": won / n, "eval_score": score / n, **generation}


def sync_rollout_weights(strategy: Strategy, model: Any, rollout_model: Any, session: RolloutSession) -> None:
    """The rollout backend gets the trained weights (a no-op for hf sharing the very model)."""
    if rollout_model is not model:  # sharded, with hf: refresh the unsharded copy in place
        strategy.copy_whole_weights(model, rollout_model)
    else:
        session.backend.update_weights(strategy.state_dict(model))


class OnlineRecipe:
    """What the grpo/ppo and dpo recipes do alike: the start of setup (checks, resume point, seed),
    its end (resume, logger, config.yaml), the optimizer, the end of a step (EVAL, log,
    CHECKPOINT), the end of the run, and cleanup."""

    def __init__(self, cfg: TrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        start_recipe(self, cfg, on_step_end, console)
        self.episodes_played, self.env_failures, self.first_env_error = 0, 0, ""
        self.env_failed_step = ""  # why this step's every episode failed in the env ("" when some did not)
        self.env_failed_tries = 0  # rollouts of this step in a row in which every episode failed in the env
        self.episodes_with_a_turn, self.longest_prompt = 0, 0
        self.generation = None  # the generation process, with rollout.async_generation (set up in setup)

    # -- setup pieces ---------------------------------------------------------------------------------
    def _start_setup(self, recipes: tuple[str, ...]) -> Path | None:
        """Check the config, find the resume point (None: a fresh run), seed; returns the resume point."""
        cfg = self.cfg
        check_config(cfg, self.strategy)
        if cfg.algorithm.name not in recipes:
            raise ConfigError(
                f"{type(self).__name__} runs algorithm.name {' or '.join(recipes)}, "
                f"not {cfg.algorithm.name!r} (omrl.training.rl.run_rl picks the recipe)"
            )
        self.config_dict = to_dict(cfg)
        resume_from = ckpt.resume_point(
            self.output_dir, self.config_dict, cfg.resume, defaults=to_dict(type(cfg)()), renamed=type(cfg).renamed_keys
        )
        seed_everything(cfg.seed)
        self.device = self.strategy.device
        # log-probs are scored under the distribution the rollout sampled from
        self.temperature = cfg.generation.temperature if cfg.generation.temperature > 0 else 1.0
        return resume_from

    def _setup_optimizer(self, extra_modules: dict[str, torch.nn.Module], updates_per_step: int) -> None:
        """AdamW over the policy's trainable weights and ``extra_modules`` (by name), and the schedule."""
        extra = [p for module in extra_modules.values() for p in module.parameters()]
        self.params = [p for p in self.model.parameters() if p.requires_grad] + extra
        self.optimizer = build_optimizer(
            self.model, self.cfg.optim, extra_params=extra, fused=self.strategy.fused_optimizer
        )
        self.strategy.prepare_optimizer(
            {"policy": self.model, **extra_modules}, self.optimizer, self.cfg.optim.max_grad_norm
        )
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, self.cfg.steps * updates_per_step)

    def _finish_setup(self, resume_from: Path | None) -> ckpt.Checkpoint | None:
        """Resume (when ``resume_from``), open the logger, write config.yaml; returns the checkpoint
        resumed from, whose ``extra`` a recipe may read further."""
        state = None
        if resume_from is not None:
            state = ckpt.load_checkpoint(
                resume_from, self.model, optimizer=self.optimizer, scheduler=self.scheduler, strategy=self.strategy
            )
            self.step = state.step
            self.task_order.epoch = int(state.data_state["task_epoch"])
            self.task_order.cursor = int(state.data_state["task_cursor"])
            self.skipped.load_state_dict(state.extra)
            # a backend with its own copy must roll out with the resumed weights
            sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session)
            self.console.print(f"resuming from {resume_from} at step {self.step}", highlight=False, soft_wrap=True)
        self.logger = make_logger(self.cfg, self.strategy, self.step, self.config_dict, self.console)
        self.strategy.on_main(atomic_write_text, self.output_dir / "config.yaml", to_yaml(self.cfg))
        self.generation = async_generation.start(self, state)  # None: the rollouts play in this process
        return state

    # -- step pieces ----------------------------------------------------------------------------------
    def _save_rollout(self, episodes: list[Any], batch: Batch | None = None) -> None:
        """This process's episodes of the step, as a trajectory parquet under rollouts/ (for omrl view);
        each that is a row of ``batch`` with the advantages, returns and values computed for it there."""
        if self.cfg.logging.save_rollouts and episodes and not self.env_failed_step:  # such a step is not kept
            name = f"step-{self.step + 1:08d}" + (f"-rank{self.strategy.rank}" if self.strategy.world_size > 1 else "")
            saved = with_update_columns(episodes, batch) if batch is not None else episodes
            write_episodes(saved, self.output_dir / "rollouts" / f"{name}.parquet")

    def _check_rollout(self, episodes: list[Any]) -> bool:
        """Say so when every episode of this step failed in the env, or none got a model turn (the
        step cannot train); the run's counts decide at its end whether it was a result at all
        (:meth:`_finish`). False when every episode failed in the env: such a step must not count
        (see :meth:`_play_counted`)."""
        failed = [ep for ep in episodes if ep.end_reason == "env_error"]
        played, lost, with_turn = self.strategy.sum(
            [len(episodes), len(failed), sum(bool(ep.turns) for ep in episodes)]
        )
        prompt = max((ep.prompt_length for ep in episodes), default=0)  # this process's
        self.episodes_played += int(played)
        self.env_failures += int(lost)
        self.episodes_with_a_turn += int(with_turn)
        self.longest_prompt = max(self.longest_prompt, int(prompt))
        if played and not with_turn and lost < played:
            self.logger.warn(
                f"step {self.step + 1}: no episode got a model turn (an opening prompt of up to "
                f"{int(prompt)} tokens, generation.max_context={self.cfg.generation.max_context})"
            )
        if failed and not self.first_env_error:
            self.first_env_error = failed[0].error or "no reason given"
        self.env_failed_step = ""
        self.env_failed_tries = self.env_failed_tries + 1 if played and lost == played else 0
        if played and lost == played:
            self.env_failed_step = next((ep.error for ep in failed if ep.error), "") or "on another process"
            self.logger.warn(
                f"step {self.step + 1}: every episode failed in the env {self.cfg.env.name!r} "
                f"({self.env_failed_step}); nothing to train on"
            )
        return not self.env_failed_step

    def _play_counted(self, play: Callable[[], list[Any]]) -> list[Any]:
        """This step's episodes from ``play()`` (which takes its tasks from the task order), checked;
        played again, after a wait, while every one of them failed in the env.

        Such a step measured nothing: counted as done it would be checkpointed, rotate a good
        checkpoint out, and a resumed run would never play it again. A replay starts from the same
        place in the task order; when ``ENV_FAILURE_REPLAYS`` of them failed too, ``env_failed_step``
        stays set and the recipe stops the run (:class:`EnvFailure`) without counting the step, so
        ``--resume`` plays it.
        """
        position = (self.task_order.epoch, self.task_order.cursor)
        counts = (self.episodes_played, self.env_failures, self.episodes_with_a_turn)
        episodes = play()
        for replay in range(ENV_FAILURE_REPLAYS):
            if self._check_rollout(episodes):
                return episodes
            # a play that is played again is not the run's: its failures do not count toward max_env_error_rate
            self.episodes_played, self.env_failures, self.episodes_with_a_turn = counts
            wait = ENV_FAILURE_WAIT * 2**replay
            self.logger.warn(
                f"step {self.step + 1}: playing it again in {wait:g} s (replay {replay + 1} of "
                f"{ENV_FAILURE_REPLAYS}); a step with no episode played is not counted"
            )
            time.sleep(wait)
            self.task_order.epoch, self.task_order.cursor = position
            episodes = play()
        self._check_rollout(episodes)
        return episodes

    def _rollout(self, started: float, seed: int) -> tuple[list[Any], dict[str, float]]:
        """ROLLOUT: this step's episodes (every sample of every task in batched generate calls, envs
        stepped together; with a search, every root-to-leaf path of each task's trees), sampled from
        ``seed`` (:func:`rollout_seed`), and their metrics. Played again while every episode fails in
        the env; when its replays failed too the run stops (:class:`EnvFailure`): such a step is
        never counted, logged nor checkpointed."""
        cfg, strategy = self.cfg, self.strategy
        self.model.eval()
        if self.generation is not None:  # played ahead by the generation process
            episodes, metrics = async_generation.take(self)
            if self.env_failed_step:
                raise EnvFailure(self._env_failure_message())
            return episodes, metrics

        def play(draw: int = 0) -> list[Episode]:
            tasks = strategy.shard(self.task_order.take(cfg.tasks_per_step))
            played = self._play_counted(
                lambda: play_step(cfg, self.session, tasks, seed + draw * dynamic_sampling.DRAW_SEED_STRIDE)
            )
            if self.env_failed_step:
                raise EnvFailure(self._env_failure_message())
            return played

        if not cfg.algorithm.dynamic_sampling:
            episodes = play()
            return episodes, step_metrics(episodes, time.perf_counter() - started, self.session, strategy)
        wanted = cfg.tasks_per_step // strategy.world_size  # this process's share of the groups
        episodes, played, extra = dynamic_sampling.fill(
            play, wanted, cfg.algorithm.dynamic_sampling_max_draws, lambda missing: strategy.sum([missing])[0] > 0
        )
        extra = strategy.sum_dicts(extra)
        if extra["groups_short"]:
            self.logger.warn(
                f"step {self.step + 1}: dynamic sampling found {int(extra['groups_short'])} fewer groups with "
                f"varied rewards than tasks_per_step={cfg.tasks_per_step} in "
                f"{int(extra['sampling_draws'])} extra draws; training on those it has"
            )
        metrics = step_metrics(played, time.perf_counter() - started, self.session, strategy)
        return episodes, {**metrics, **extra}

    def _optimizer_step(self) -> dict[str, float]:
        """Sum gradients over processes, clip, then step unless the gradient is not finite (the one
        rule for a skipped update: :func:`omrl.training.optim.apply_update`)."""
        update = apply_update(
            self.strategy,
            self.params,
            self.optimizer,
            self.scheduler,
            self.skipped,
            self.logger,
            self.step + 1,
            self.cfg.optim.max_grad_norm,
        )
        if not update.applied:
            return self.skipped.metrics()
        return {"grad_norm": update.grad_norm, "lr": update.lr}

    def _skip(self, why: str) -> dict[str, float]:
        """Skip this step's update for ``why`` (nothing to learn from): no optimizer step."""
        self.strategy.zero_grad(self.optimizer)
        return self.skipped.skip(why, self.logger, self.step + 1)

    def _end_step(self, metrics: dict[str, float], started: float) -> None:
        """After an update (or a skipped one): refresh the rollout weights, then EVAL (every
        ``eval_every`` steps and after the last), log, CHECKPOINT. A step whose every episode failed
        in the env is none of these: the run stops with :class:`EnvFailure`, the step not counted,
        not logged and not checkpointed, so the checkpoints before it stay and ``--resume`` plays it."""
        if self.env_failed_step:
            raise EnvFailure(self._env_failure_message())
        sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session)
        self.step += 1
        if self.generation is not None:  # it plays the step these weights are for while this one goes on
            async_generation.after_update(self)
        cfg = self.cfg
        if self.step == cfg.steps or (cfg.eval_every and self.step % cfg.eval_every == 0):
            metrics.update(self.evaluate())
        metrics["step_time"] = time.perf_counter() - started
        metrics.update(peak_memory())
        self.logger.log(self.step, metrics)
        if cfg.logging.save_steps and self.step % cfg.logging.save_steps == 0:
            self.save_checkpoint()
        if self.on_step_end is not None:
            self.on_step_end(self.step, metrics)

    def _env_failure_message(self) -> str:
        newest = ckpt.latest_checkpoint(self.output_dir)
        kept = f"the newest checkpoint, {newest.name}, is kept" if newest else "no checkpoint was written before it"
        tries = self.env_failed_tries
        return (
            f"step {self.step + 1}: every episode failed in the env {self.cfg.env.name!r}"
            f"{f' in {tries} rollouts in a row' if tries > 1 else ''} (the last reason: "
            f"{self.env_failed_step}); the step is not counted and nothing of it was saved ({kept}): bring "
            "the env back (is its server down or full?), then continue with --resume"
        )

    def evaluate(self) -> dict[str, float]:
        """eval_success and eval_score of the model as it is now (see :func:`evaluate`)."""
        self.model.eval()
        return evaluate(self.cfg, self.session, self.strategy, self.test_tasks)

    def _finish(self, metrics: dict[str, float]) -> dict[str, Any]:
        """The final checkpoint (unless the last step wrote it) and model; the run's summary. A run
        whose every episode failed in the env raises :class:`EnvFailure` after saving: it is no result."""
        save_final(self)
        if self.episodes_played and self.env_failures == self.episodes_played:
            raise EnvFailure(
                f"every one of the {self.episodes_played} episodes of this run failed in the env "
                f"{self.cfg.env.name!r}, so nothing was learned; the first reason: "
                f"{self.first_env_error or 'on another process'}"
            )
        if self.episodes_played and self.env_failures / self.episodes_played > self.cfg.max_env_error_rate:
            raise EnvFailure(
                f"{self.env_failures} of the run's {self.episodes_played} episodes "
                f"({100 * self.env_failures / self.episodes_played:.0f}%) failed in the env "
                f"{self.cfg.env.name!r}, more than max_env_error_rate={self.cfg.max_env_error_rate:g} "
                f"allows; they were not trained on, and the model in {self.output_dir} learned from the "
                f"rest; the first reason: {self.first_env_error or 'on another process'}"
            )
        if self.episodes_played and not self.episodes_with_a_turn:
            raise ConfigError(
                f"no episode of this run got a single model turn: the opening prompt (up to "
                f"{self.longest_prompt} tokens) leaves no room within generation.max_context="
                f"{self.cfg.generation.max_context}; raise it, or shorten the prompt "
                "(env.demonstration=false drops the worked example)"
            )
        return {
            "steps": self.step,
            "skipped_updates": self.skipped.count,
            "output_dir": str(self.output_dir),
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float))},
        }

    def _checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint keeps besides weights, optimizer, schedule, RNG and task position: the
        skipped-update counts, and the steps the generation process played ahead."""
        return {**self.skipped.state_dict(), **async_generation.checkpoint_extra(self)}

    def save_checkpoint(self) -> Path:
        return save_recipe_checkpoint(
            self,
            data_state={"task_epoch": self.task_order.epoch, "task_cursor": self.task_order.cursor},
            extra=self._checkpoint_extra(),
        )

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        close_all(*(getattr(self, name, None) for name in ("generation", "logger", "session", "strategy")))
