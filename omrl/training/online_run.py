"""The playing half of an online run (:class:`OnlineRun`), and the steps the grpo/ppo and dpo recipes
take alike around their own update: the start and end of setup, the end of a step, the checkpoint and
the end of the run. A recipe holds an ``OnlineRun`` and calls these functions; it inherits nothing
(:mod:`omrl.training.rl`, :mod:`omrl.training.dpo`; the scaffold every recipe shares is
:mod:`omrl.training.recipe`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Protocol

from omrl.config.options import TrainRunConfig
from omrl.data import Batch, Episode, write_episodes
from omrl.errors import ConfigError, FailedStep, OmrlError
from omrl.parallel import Strategy
from omrl.rollout import Played
from omrl.rollout.spec import overlong
from omrl.supervisor import StageStalled, at_step, stage
from omrl.training import checkpoint as ckpt
from omrl.training import dynamic_sampling, rollout_health, stopped
from omrl.training.async_generation import (
    GenerationProcess,
    lag_metrics,
    played_from_tensors,
    played_to_tensors,
    tasks_played,
)
from omrl.training.config_checks import check_config
from omrl.training.metrics import read_metrics
from omrl.training.online import (
    evaluate,
    rollout_seed,
    setup_rollout,
    sync_rollout_weights,
)
from omrl.training.recipe import (
    Recipe,
    log_step,
    resume,
    save_final,
    save_recipe_checkpoint,
    setup_logger,
    start_setup,
)
from omrl.training.rollout_health import RolloutHealth
from omrl.training.rollout_step import play_step, step_metrics
from omrl.training.tool_health import ToolHealth
from omrl.training.tree_batch import with_update_columns


class SamplerStale(OmrlError):
    """The sampler's log-probs are not the trainer's: its weights are not the ones last sent."""


def check_sampler(cfg: TrainRunConfig, metrics: dict[str, float], version: int) -> None:
    """Stop the run when this step's episodes were sampled by weights other than the trainer's version
    ``version`` (the updates made before the step): the sampler's log-probs of the sampled tokens then
    differ from the trainer's beyond ``generation.sampler_check_kl`` (``mismatch_kl_k3``, measured where
    the sampler reports log-probs). Generation that runs behind the trainer on purpose (async) is not checked."""
    bound, gap = cfg.generation.sampler_check_kl, metrics.get("mismatch_kl_k3")
    if not bound or gap is None or cfg.rollout.async_generation or not gap > bound:
        return
    raise SamplerStale(
        f"the sampler's log-probs differ from the trainer's by {gap:.4g} KL a token (mismatch_kl_k3), more than "
        f"generation.sampler_check_kl={bound:g}: the {cfg.generation.backend} backend did not sample with the "
        f"weights after {version} steps (a server that kept old weights, or loaded others); "
        f"check its weight sync (generation.weight_sync={cfg.generation.weight_sync})"
    )


class OnlineRun:
    """What an online recipe plays with: the rollout session, the training task order and the test
    tasks (:func:`omrl.training.online.setup_rollout`), the generation process that plays ahead
    (``rollout.async_generation``), and the run's :class:`RolloutHealth` and tool-call health.

    ``model`` is the trained policy, ``rollout_model`` what the hf backend generates with (the policy
    itself, or its unsharded copy). :meth:`start` once the trained weights are final (resumed or
    not); then each step :meth:`play`, and :meth:`updated` after its update."""

    def __init__(self, cfg: TrainRunConfig, strategy: Strategy, model: Any, rollout_model: Any, tokenizer: Any):
        self.cfg, self.strategy, self.tokenizer = cfg, strategy, tokenizer
        self.model, self.rollout_model = model, rollout_model
        self.session, self.task_order, self.test_tasks = setup_rollout(cfg, rollout_model, tokenizer)
        self.health = RolloutHealth()
        self.replayed = 0  # plays of the current step thrown away: every episode failed in the env
        self.tool_health = ToolHealth(cfg.tool_health)
        self.generation: GenerationProcess | None = None
        self.warn: Callable[[str], None] = print  # the run's logger's, from start()

    def start(self, step: int, resumed: ckpt.Checkpoint | None, warn: Callable[[str], None]) -> None:
        """Begin at ``step`` (updates done): the task order where ``resumed`` left it, the rollout
        backend on the trained weights, the generation process holding the steps it plays ahead."""
        self.warn = warn
        if resumed is not None:
            self.task_order.load_state(resumed.data_state)
            self.health.load_state_dict(resumed.extra)
            self.tool_health.load_state_dict(resumed.extra)
        if resumed is not None or self.session.backend.shared:
            # a backend with its own copy must roll out with the resumed weights, and a server may have
            # loaded other weights than the ones this run starts from
            sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session, step)
        if not self.cfg.rollout.async_generation:
            return
        self.generation = GenerationProcess(self.cfg, self.strategy.state_dict(self.model), version=step)
        if resumed is not None:
            played = played_from_tensors(resumed.extra)
            tasks = tasks_played(played, self.cfg.env)
            self.generation.restore(played, {s: (tasks[s], self.seed(s)) for s in played})
        for ahead in range(step, min(self.cfg.steps, step + self.cfg.rollout.max_staleness + 1)):
            self._request(ahead)

    def seed(self, step: int) -> int:
        """The sampling seed of step ``step`` (0-based) on this process."""
        return rollout_seed(self.cfg, step, self.strategy)

    # -- ROLLOUT --------------------------------------------------------------------------------------
    def play(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """ROLLOUT of step ``step`` (0-based, the updates done): its episodes (every sample of every
        task in batched generate calls, envs stepped together; with a search, every root-to-leaf path of
        each task's trees) and their metrics, its tool calls checked (:mod:`omrl.training.tool_health`).
        Played again while every episode fails in the env; when its replays failed too the run stops
        (:class:`FailedStep`): such a step is never counted, logged nor checkpointed."""
        started, self.replayed = time.perf_counter(), 0
        self.model.eval()
        at_step(step + 1)
        if self.generation is not None:  # played ahead by the generation process
            episodes, metrics = self._take(step)
        else:
            # seats played by past checkpoints draw from the model the run started from and those it saved
            saved = [path / "model" for path in ckpt.complete_checkpoints(self.cfg.logging.output_dir)]
            self.session.past_checkpoints([self.cfg.model.name, *map(str, saved)])
            position, counts = self.task_order.state(), self.health.counts()
            try:
                episodes, metrics = self._play_here(step, started)
            except (FailedStep, StageStalled) as stop:  # the step is not the run's: its tasks and counts go back
                self.task_order.load_state(position)
                self.health.restore(counts)
                if isinstance(stop, StageStalled):
                    stop.keepable = True  # the steps done may be checkpointed (omrl.training.stopped)
                raise
        self.check_step(step)
        self.tool_health.check(step + 1, metrics, self.warn)
        if self.replayed:  # plays in which every episode failed in the env, thrown away
            metrics["replayed_rollouts"] = float(self.replayed)
        return episodes, metrics

    def _play_here(self, step: int, started: float) -> tuple[list[Episode], dict[str, float]]:
        cfg, strategy, seed = self.cfg, self.strategy, self.seed(step)
        draws: list[Played] = []

        def draw(n: int = 0) -> list[Episode]:
            tasks = strategy.shard(self.task_order.take(cfg.tasks_per_step))
            stride = dynamic_sampling.DRAW_SEED_STRIDE
            played = self._counted(step, lambda: play_step(cfg, self.session, tasks, seed + n * stride))
            self.check_step(step)
            draws.append(played)
            return played.episodes

        if not cfg.algorithm.dynamic_sampling:
            episodes = draw()
            return episodes, step_metrics(draws[0], time.perf_counter() - started, self.session, strategy)
        # this process's share of the groups a step plays: in a game of several seats, one per seat of a task
        wanted = cfg.tasks_per_step // strategy.world_size * dynamic_sampling.groups_per_task(self.session)
        episodes, played, extra = dynamic_sampling.fill(
            draw, wanted, cfg.algorithm.dynamic_sampling_max_draws, lambda missing: strategy.sum([missing])[0] > 0
        )
        # groups add up over processes; the draws are the same on each (they draw together)
        extra.update(strategy.sum_dicts({key: extra[key] for key in ("groups_dropped", "groups_short")}))
        if extra["groups_short"]:
            self.warn(
                f"step {step + 1}: dynamic sampling found {int(extra['groups_short'])} fewer groups with "
                f"varied rewards than the {wanted * strategy.world_size} a step plays (tasks_per_step="
                f"{cfg.tasks_per_step}) in {int(extra['sampling_draws'])} extra draws; training on those it has"
            )
        every_draw = dynamic_sampling.merged_draws(draws)  # the rewards of every draw, not the last
        metrics = step_metrics(every_draw, time.perf_counter() - started, self.session, self.strategy)
        return episodes, {**metrics, **extra}

    def _take(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """Step ``step``'s episodes, played ahead by the generation process (again, with its newest
        weights, when every episode failed in the env), and their metrics with the weights' lag."""
        generation, waited, metrics = self.generation, 0.0, {}

        def take() -> Played:
            nonlocal waited, metrics
            if step in generation.taken:  # taken before: every episode failed in the env
                generation.replay(step)
            episodes, metrics, seconds = generation.take(step)
            waited += seconds
            return Played(episodes)

        episodes = self._counted(step, take).episodes
        lags = lag_metrics(episodes, step, self.cfg.rollout.max_staleness)
        return episodes, {**metrics, **lags, "generation_wait_s": waited}

    def _counted(self, step: int, play: Callable[[], Played]) -> Played:
        """What ``play()`` (which takes its tasks from the task order) played, counted; played
        again, after a wait, while every one of them failed in the env.

        Such a step measured nothing: counted as done it would be checkpointed, rotate a good
        checkpoint out, and a resumed run would never play it again. A replay starts from the same
        place in the task order; when ``ENV_FAILURE_REPLAYS`` of them failed too, the health's
        ``failed_step`` stays set and :meth:`check_step` stops the run."""
        position, counts = self.task_order.state(), self.health.counts()
        played = play()
        for replay in range(rollout_health.ENV_FAILURE_REPLAYS):
            if self._count(step, played.episodes) or self.health.failed_template() or self.health.failed_protocol():
                return played  # a template's or an env plugin's bug fails its replays alike: no waiting for the world
            self.replayed += 1  # the step's metrics say so: its env_errors are the last play's
            self.health.restore(counts)  # a play played again is not the run's: not toward max_env_error_rate
            wait = rollout_health.ENV_FAILURE_WAIT * 2**replay
            self.warn(
                f"step {step + 1}: playing it again in {wait:g} s (replay {replay + 1} of "
                f"{rollout_health.ENV_FAILURE_REPLAYS}); a step with no episode played is not counted"
            )
            time.sleep(wait)
            self.task_order.load_state(position)
            played = play()
        self._count(step, played.episodes)
        return played

    def _count(self, step: int, episodes: list[Episode]) -> bool:
        """Count a play in the run's health, saying so when every episode failed in the env or none got
        a model turn (the step cannot train). False when every episode failed in the env."""
        failed = [ep for ep in episodes if ep.end_reason == "env_error"]
        counts = [len(episodes), len(failed), sum(bool(ep.turns) for ep in episodes), sum(map(overlong, episodes))]
        played, lost, with_turn, too_long = (int(n) for n in self.strategy.sum(counts))
        prompt = max((ep.prompt_length for ep in episodes), default=0)  # this process's
        reason = next((ep.error for ep in failed if ep.error), "")
        self.health.add(played, lost, with_turn, int(prompt), reason, too_long, [ep.env for ep in failed])
        if played and not with_turn and lost < played:  # for want of context, or games the others ended
            self.warn(rollout_health.no_turn_warning(step + 1, episodes, too_long, self.cfg.generation.max_context))
        if self.health.failed_step:
            self.warn(
                f"step {step + 1}: every episode failed in {self.health.failed_in(self.cfg.env.name)} "
                f"({self.health.failed_step}); nothing to train on"
            )
        return not self.health.failed_step

    def check_step(self, step: int) -> None:
        """Stop the run (:class:`FailedStep`) when every episode of step ``step`` failed in the env, its
        replays too: the step is not counted, logged nor checkpointed, so ``--resume`` plays it. Played
        here, the run stands where the steps done left it (keepable); played ahead, it does not."""
        if self.health.failed_step:
            message = self.health.failed_step_message(step + 1, self.cfg.env.name)
            raise FailedStep(message, keepable=self.generation is None)

    def save_rollout(self, step: int, episodes: list[Episode], batch: Batch | None = None) -> None:
        """This process's episodes of step ``step``, as a trajectory parquet under rollouts/ (for omrl
        view); each that is a row of ``batch`` with the advantages, returns and values computed for it."""
        if not self.cfg.logging.save_rollouts or not episodes:
            return
        strategy = self.strategy
        name = f"step-{step + 1:08d}" + (f"-rank{strategy.rank}" if strategy.world_size > 1 else "")
        saved = with_update_columns(episodes, batch) if batch is not None else episodes
        write_episodes(saved, Path(self.cfg.logging.output_dir) / "rollouts" / f"{name}.parquet", self.tokenizer)

    # -- after the update -----------------------------------------------------------------------------
    def updated(self, version: int) -> None:
        """The trained weights after ``version`` updates into the rollout backend; the generation
        process gets them, and the request for the step that plays with them."""
        sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session, version)
        if self.generation is None:
            return
        # it plays the step these weights are for while the trainer goes on
        self.generation.publish(version, self.strategy.state_dict(self.model))
        self._request(version + self.cfg.rollout.max_staleness)

    def _request(self, step: int) -> None:
        if step < self.cfg.steps and step not in self.generation.requested:
            tasks = self.strategy.shard(self.task_order.take(self.cfg.tasks_per_step))
            self.generation.request(step, tasks, self.seed(step))

    def evaluate(self) -> dict[str, float]:
        """eval_success and eval_score of the model as it is now (:func:`omrl.training.online.evaluate`)."""
        self.model.eval()
        with stage("eval", episode=f"{len(self.test_tasks)} test tasks"):
            return evaluate(self.cfg, self.session, self.strategy, self.test_tasks)

    def played_ahead(self) -> dict[str, Any]:
        """The steps the generation process played ahead, waited for, as tensors for a checkpoint."""
        return played_to_tensors(self.generation.played_ahead()) if self.generation is not None else {}

    def close(self) -> None:
        for part in (self.generation, self.session):
            if part is not None:
                part.close()


# -- the steps an online recipe takes -----------------------------------------------------------------


class OnlineRecipe(Recipe, Protocol):
    """What these functions read of an online recipe besides :class:`~omrl.training.recipe.Recipe`."""

    run: OnlineRun


def begin_setup(recipe: Recipe, recipes: tuple[str, ...]) -> Path | None:
    """The start of an online recipe's setup: the config checked (and that this recipe runs its
    algorithm), then :func:`~omrl.training.recipe.start_setup`; returns the resume point."""
    check_config(recipe.cfg, recipe.strategy.world_size)
    recipe.strategy.check_divisible("tasks_per_step", recipe.cfg.tasks_per_step)
    if recipe.cfg.algorithm.name not in recipes:
        raise ConfigError(
            f"{type(recipe).__name__} runs algorithm.name {' or '.join(recipes)}, "
            f"not {recipe.cfg.algorithm.name!r} (omrl.training.rl.run_rl picks the recipe)"
        )
    return start_setup(recipe)


def end_setup(recipe: OnlineRecipe, resume_from: Path | None) -> ckpt.Checkpoint | None:
    """The end of an online recipe's setup, once its run and optimizer are set up: the state resumed
    from ``resume_from``, the logger, the run started at the recipe's step; returns the checkpoint
    resumed from (None: a fresh run), whose extras the recipe reads for its own state."""
    resumed = resume(recipe, resume_from, recipe.cfg.steps) if resume_from is not None else None
    recipe.logger = setup_logger(recipe, recipe.cfg.algorithm.name, recipe.cfg.steps)
    recipe.run.start(recipe.step, resumed, recipe.logger.warn)
    return resumed


def end_step(recipe: OnlineRecipe, metrics: dict[str, float], started: float) -> None:
    """After an update (or a skipped one): the rollout weights refreshed, then EVAL (every
    ``eval_every`` steps and after the last), log, CHECKPOINT (:func:`~omrl.training.recipe.log_step`)."""
    cfg = recipe.cfg
    check_sampler(cfg, metrics, recipe.step)
    recipe.run.updated(recipe.step + 1)
    recipe.step += 1
    if recipe.step == cfg.steps or (cfg.eval_every and recipe.step % cfg.eval_every == 0):
        try:
            metrics.update(recipe.run.evaluate())
        except BaseException:
            stopped.keep_evaluated_step(recipe, metrics)
            raise
    metrics["step_time"] = time.perf_counter() - started
    log_step(recipe, metrics)


def save_checkpoint(recipe: OnlineRecipe, extra: dict[str, Any] | None = None) -> Path:
    """Checkpoint an online recipe: besides what every checkpoint keeps, the position in the task
    order, the skipped-update counts, the steps played ahead and the recipe's ``extra``."""
    # waits for the steps played ahead: the handover's deadline, not the checkpoint's
    run = recipe.run
    kept = {
        **recipe.skipped.state_dict(),
        **run.health.state_dict(),
        **run.tool_health.state_dict(),
        **run.played_ahead(),
        **(extra or {}),
    }
    with stage("checkpoint", episode=f"step {recipe.step}"):
        return save_recipe_checkpoint(recipe, data_state=recipe.run.task_order.state(), extra=kept)


def finish(recipe: OnlineRecipe, metrics: dict[str, float]) -> dict[str, Any]:
    """The final checkpoint (unless the last step wrote it) and model; the run's summary. A run that
    learned nothing raises before saving, one with too many env errors after (:class:`RolloutHealth`)."""
    cfg, health = recipe.cfg, recipe.run.health
    health.check_learned(cfg.env.name, cfg.generation.max_context)
    save_final(recipe)
    health.check_error_rate(cfg.env.name, cfg.max_env_error_rate, str(recipe.output_dir))
    recipe.skipped.check_learned(recipe.step, recipe.output_dir, recipe.logger)
    if not metrics and recipe.step:  # resumed with no step left to take: the summary of the last one logged
        logged = [record for record in read_metrics(recipe.output_dir) if record.get("step") == recipe.step]
        metrics = logged[-1] if logged else {}
    return {
        "steps": recipe.step,
        "skipped_updates": recipe.skipped.count,
        "output_dir": str(recipe.output_dir),
        **{k: v for k, v in metrics.items() if isinstance(v, (int, float))},
    }
