"""What the grpo/ppo and dpo recipes do alike (:class:`OnlineRecipe`): the start and end of setup, the
optimizer, the rollout (played again while the env fails), the end of a step (EVAL, log,
CHECKPOINT), the end of the run, and cleanup. Each recipe's ``setup`` and ``train`` read top to
bottom in its own file (:mod:`omrl.training.rl`, :mod:`omrl.training.dpo`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
from rich.console import Console

from omrl.atomic import atomic_write_text
from omrl.config import to_dict, to_yaml
from omrl.config.options import TrainRunConfig
from omrl.data import Batch, Episode, write_episodes
from omrl.errors import ConfigError, EnvFailure, OmrlError
from omrl.supervisor import at_step, stage
from omrl.training import async_generation, dynamic_sampling
from omrl.training import checkpoint as ckpt
from omrl.training.common import seed_everything
from omrl.training.metrics import StepCallback, peak_memory
from omrl.training.online import (
    check_config,
    evaluate,
    make_logger,
    play_step,
    step_metrics,
    sync_rollout_weights,
)
from omrl.training.optim import apply_update, build_optimizer, build_scheduler
from omrl.training.recipe import close_all, save_final, save_recipe_checkpoint, start_recipe
from omrl.training.tool_health import ToolHealth
from omrl.training.tree_batch import with_update_columns

#: a step whose every episode failed in the env is played again this many times before the run stops
ENV_FAILURE_REPLAYS = 2
ENV_FAILURE_WAIT = 5.0  # seconds before the first replay, doubled before each next one


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
        f"weights after {version} updates (a server that kept old weights, or loaded others); "
        f"check its weight sync (generation.weight_sync={cfg.generation.weight_sync})"
    )


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
        self.tool_health = ToolHealth(cfg.tool_health)

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
            self.task_order.load_state(state.data_state)
            self.skipped.load_state_dict(state.extra)
            self.console.print(f"resuming from {resume_from} at step {self.step}", highlight=False, soft_wrap=True)
        if resume_from is not None or self.session.backend.shared:
            # a backend with its own copy must roll out with the resumed weights, and a server may have
            # loaded other weights than the ones this run starts from
            sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session, self.step)
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
            write_episodes(saved, self.output_dir / "rollouts" / f"{name}.parquet", self.tokenizer)

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
        position = self.task_order.state()
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
            self.task_order.load_state(position)
            episodes = play()
        self._check_rollout(episodes)
        return episodes

    def _rollout(self, started: float, seed: int) -> tuple[list[Any], dict[str, float]]:
        """:meth:`_played`, its tool calls checked (:mod:`omrl.training.tool_health`)."""
        episodes, metrics = self._played(started, seed)
        self.tool_health.check(self.step + 1, metrics, self.logger.warn)
        return episodes, metrics

    def _played(self, started: float, seed: int) -> tuple[list[Any], dict[str, float]]:
        """ROLLOUT: this step's episodes (every sample of every task in batched generate calls, envs
        stepped together; with a search, every root-to-leaf path of each task's trees), sampled from
        ``seed`` (:func:`rollout_seed`), and their metrics. Played again while every episode fails in
        the env; when its replays failed too the run stops (:class:`EnvFailure`): such a step is
        never counted, logged nor checkpointed."""
        cfg, strategy = self.cfg, self.strategy
        self.model.eval()
        at_step(self.step + 1)
        if self.generation is not None:  # played ahead by the generation process
            episodes, metrics = async_generation.take(self)
            if self.env_failed_step:
                raise EnvFailure(self._env_failure_message())
            return episodes, metrics

        summaries: list[tuple[int, dict[str, float]]] = []  # each draw's reward summary, by its episodes
        env_summaries: dict[str, list[tuple[int, dict[str, float]]]] = {}  # in a mixture, each env's

        def play(draw: int = 0) -> list[Episode]:
            tasks = strategy.shard(self.task_order.take(cfg.tasks_per_step))
            played = self._play_counted(
                lambda: play_step(cfg, self.session, tasks, seed + draw * dynamic_sampling.DRAW_SEED_STRIDE)
            )
            if self.env_failed_step:
                raise EnvFailure(self._env_failure_message())
            summaries.append((len(played), dict(self.session.reward_summary)))
            for env, summary in getattr(self.session, "reward_summaries", {}).items():
                env_summaries.setdefault(env, []).append((sum(ep.env == env for ep in played), dict(summary)))
            return played

        if not cfg.algorithm.dynamic_sampling:
            episodes = play()
            return episodes, step_metrics(episodes, time.perf_counter() - started, self.session, strategy)
        wanted = cfg.tasks_per_step // strategy.world_size  # this process's share of the groups
        episodes, played, extra = dynamic_sampling.fill(
            play, wanted, cfg.algorithm.dynamic_sampling_max_draws, lambda missing: strategy.sum([missing])[0] > 0
        )
        # groups add up over processes; the draws are the same on each (they draw together)
        extra.update(strategy.sum_dicts({key: extra[key] for key in ("groups_dropped", "groups_short")}))
        if extra["groups_short"]:
            self.logger.warn(
                f"step {self.step + 1}: dynamic sampling found {int(extra['groups_short'])} fewer groups with "
                f"varied rewards than tasks_per_step={cfg.tasks_per_step} in "
                f"{int(extra['sampling_draws'])} extra draws; training on those it has"
            )
        self.session.reward_summary = dynamic_sampling.mean_summary(summaries)  # of every draw, not the last
        if env_summaries:
            self.session.reward_summaries = {e: dynamic_sampling.mean_summary(s) for e, s in env_summaries.items()}
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
        check_sampler(self.cfg, metrics, self.step)
        sync_rollout_weights(self.strategy, self.model, self.rollout_model, self.session, self.step + 1)
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
        with stage("eval", episode=f"{len(self.test_tasks)} test tasks"):
            return evaluate(self.cfg, self.session, self.strategy, self.test_tasks)

    def _nothing_learned(self) -> str:
        """What a run whose every update was skipped says at its end: why, and what would change it."""
        why = max(self.skipped.reasons, key=self.skipped.reasons.get) if self.skipped.reasons else "see above"
        advice = ""
        if "advantage is 0" in why:
            advice = (
                "; every sample of a task earned the same reward, most often none: start from a model that "
                "sometimes succeeds (more SFT epochs, a higher optim.learning_rate for a small model), or raise "
                "group_size or generation.temperature so samples differ"
            )
        return (
            f"every one of this run's {self.step} updates was skipped, so the model in {self.output_dir} is the "
            f"model it started from; the most common reason: {why}{advice}"
        )

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
        if self.step and self.skipped.count >= self.step:
            self.logger.warn(self._nothing_learned())
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
        extra = self._checkpoint_extra()  # waits for the steps played ahead: the handover's deadline, not this
        with stage("checkpoint", episode=f"step {self.step}"):
            return save_recipe_checkpoint(self, data_state=self.task_order.state(), extra=extra)

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        close_all(*(getattr(self, name, None) for name in ("generation", "logger", "session", "strategy")))
