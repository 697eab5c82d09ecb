"""The ``omrl train`` recipe: online RL (grpo, ppo, dpo) in a multi-turn environment.

Reads top to bottom: ``setup`` (seed, resume point, models, algorithms, rollout,
optimizer, logger), ``train`` (one step = ROLLOUT -> REWARD -> LOG-PROBS ->
ADVANTAGE -> UPDATE, then EVAL and CHECKPOINT), ``cleanup``.

- The advantage estimator, policy loss and KL estimator are plugins looked up by
  name; they share one calling convention (:mod:`omrl.algos`), so nothing here
  depends on which one is chosen. ``algo`` decides the recipe's mode: ``ppo``
  adds a critic (a value head), ``dpo`` trains on preference pairs built from
  each task's best and worst sample instead of advantages.
- Rollouts generate with the very model being trained (the hf backend shares
  it); other backends get the new weights through ``update_weights`` after
  every update. Under FSDP the hf backend generates with an unsharded copy
  (processes generate different lengths, which sharded weights cannot do).
- A step whose loss or gradient is not finite is skipped with a warning;
  ``optim.max_nan_steps`` of them in a row stop the run.
- Resume restores weights, optimizer, scheduler, RNG states and the position
  in the task order, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from omrl import registry
from omrl.algos import AdvantageInput
from omrl.config import to_dict, to_yaml
from omrl.atomic import atomic_write_text
from omrl.errors import ConfigError, NonFiniteLossError
from omrl.options import TrainRunConfig
from omrl.rollout import RolloutSession
from omrl.training import checkpoint as ckpt
from omrl.training.distributed import Distributed
from omrl.training.metrics import MetricsLogger, NullLogger, StepCallback, rollout_metrics
from omrl.training.model_setup import load_frozen_copy, load_trainable_model, save_final_model
from omrl.training.optim import build_optimizer, build_scheduler
from omrl.training.policy import ValueHead, policy_forward, sequence_log_prob
from omrl.training.rl_data import (TaskOrder, episodes_to_batch, micro_batches, pad_to, preference_pairs,
                                   sort_by_length, trainable)
from omrl.training.rl_loss import policy_gradient_loss
from omrl_plugins.algos import apply_kl_in_reward, dpo_loss

ALGOS = ("grpo", "ppo", "dpo")



class RLRecipe:
    """Online RL: ``setup()``, ``train()``, ``cleanup()`` (or :func:`run_rl`)."""

    def __init__(self, cfg: TrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        self.cfg = cfg
        self.on_step_end = on_step_end  # called after each step's logging and checkpoint
        self.console = console or Console(stderr=True)
        self.output_dir = Path(cfg.logging.output_dir)
        self.step = 0
        self.nan_streak, self.skipped_updates = 0, 0
        self.value_head: ValueHead | None = None
        self.ref_model = None
        self.dist = Distributed(cfg.model.dtype)  # one process, or one of several under `accelerate launch`

    # -- SETUP ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self._check_config()
        self.config_dict = to_dict(cfg)
        resume_from = ckpt.resume_point(self.output_dir, self.config_dict, self.cfg.resume,
                                       defaults=to_dict(type(cfg)()))
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.device = str(self.dist.device)
        self._setup_models()
        self._setup_algorithms()
        self._setup_rollout()
        self._setup_optimizer()
        if resume_from is not None:
            self._load_resume_state(resume_from)
        self.logger = MetricsLogger(self.output_dir, cfg.logging, cfg.steps, start_step=self.step,
                                    run_config=self.config_dict, console=self.console, description=cfg.algo) \
            if self.dist.is_main else NullLogger()
        self.dist.on_main(atomic_write_text, self.output_dir / "config.yaml", to_yaml(cfg))

    def _check_config(self) -> None:
        cfg = self.cfg
        if cfg.algo not in ALGOS:
            raise ConfigError(f"unknown algo {cfg.algo!r}; valid: {', '.join(ALGOS)}")
        for key in ("steps", "tasks_per_step", "group_size", "ppo_epochs"):
            if getattr(cfg, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(cfg, key)}")
        self.dist.check_divisible("tasks_per_step", cfg.tasks_per_step)
        if cfg.mini_batch_size < 0:
            raise ConfigError(f"mini_batch_size must be >= 0 (0: the whole rollout), got {cfg.mini_batch_size}")
        if cfg.eval_samples_per_task < 1 or (cfg.eval_samples_per_task > 1 and cfg.eval_temperature <= 0):
            raise ConfigError(f"eval_samples_per_task={cfg.eval_samples_per_task} is invalid; valid: 1, or more "
                              "with eval_temperature > 0 (greedy samples of a task are all the same)")
        if cfg.train_tasks < 0:
            raise ConfigError(f"train_tasks must be >= 0 (0: the whole split), got {cfg.train_tasks}")
        if cfg.algo == "dpo" and cfg.group_size < 2:
            raise ConfigError("dpo builds pairs from samples of the same task: group_size must be >= 2")
        if cfg.critic not in ("head", "model"):
            raise ConfigError(f"unknown critic {cfg.critic!r}; valid: head, model")

    def _setup_models(self) -> None:
        cfg = self.cfg
        model, self.tokenizer = load_trainable_model(cfg.model, self.device)
        self.model = self.dist.prepare(model)  # sharded under FSDP (under ZeRO-3 with the optimizer)
        # the hf backend generates with this model: when sharded an unsharded copy, refreshed after each update
        own_copy = self.dist.sharded and cfg.generation.backend == "hf"
        self.rollout_model = load_frozen_copy(cfg.model, self.device) if own_copy else self.model
        if cfg.kl_coef > 0 or cfg.algo == "dpo":
            self.ref_model = self.dist.prepare(load_frozen_copy(cfg.model, self.device), frozen=True)
        self.critic_model = None
        if cfg.algo == "ppo":
            if cfg.critic == "model":  # a separate backbone for the critic, trained with the value loss only
                critic, _ = load_trainable_model(dataclasses.replace(cfg.model, lora_rank=0), self.device)
                self.critic_model = self.dist.prepare(critic)
            hidden = (self.critic_model or self.model).config.get_text_config().hidden_size
            self.value_head = ValueHead(hidden).to(self.device)

    def _setup_algorithms(self) -> None:
        cfg = self.cfg
        self.advantage_fn = registry.algorithms.get(cfg.advantage, kind="advantage")
        self.policy_loss_fn = registry.algorithms.get(cfg.policy_loss, kind="policy_loss")
        self.kl_fn = registry.algorithms.get(cfg.kl_estimator, kind="kl")

    def _setup_rollout(self) -> None:
        cfg = self.cfg
        self.session = RolloutSession.from_config(cfg, model=self.rollout_model, tokenizer=self.tokenizer)
        tasks = self.session.pool.probe().split_of(cfg.env.split)
        self.task_order = TaskOrder(list(tasks[: cfg.train_tasks] if cfg.train_tasks else tasks), cfg.seed)
        if not self.task_order.tasks:
            raise ConfigError(f"env {cfg.env.name!r} has no tasks in split {cfg.env.split!r}; choose another env.split")
        self.test_tasks = list(self.session.pool.probe().split_of("test"))[: cfg.eval_tasks]
        # log-probs are scored under the distribution the rollout sampled from
        self.temperature = cfg.generation.temperature if cfg.generation.temperature > 0 else 1.0

    def _setup_optimizer(self) -> None:
        extra = list(self.value_head.parameters()) if self.value_head is not None else []
        if self.critic_model is not None:
            extra += list(self.critic_model.parameters())
        self.params = [p for p in self.model.parameters() if p.requires_grad] + extra
        self.optimizer = build_optimizer(self.model, self.cfg.optim, extra_params=extra)
        self.dist.prepare_optimizer({"policy": self.model, **(
            {"value_head": self.value_head} if self.value_head is not None else {}), **(
            {"critic": self.critic_model} if self.critic_model is not None else {})},
            self.optimizer, self.cfg.optim.max_grad_norm)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, self.cfg.steps * self.updates_per_step())

    def updates_per_step(self) -> int:
        """Optimizer steps per training step: ppo_epochs passes, each in ceil(rollout / mini_batch_size)."""
        cfg = self.cfg
        rollout = cfg.tasks_per_step * cfg.group_size
        per_pass = math.ceil(rollout / cfg.mini_batch_size) if cfg.mini_batch_size else 1
        return cfg.ppo_epochs * per_pass

    def _load_resume_state(self, path: Path) -> None:
        state = ckpt.load_checkpoint(path, self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                     sharding=self.dist if self.dist.sharded else None)
        self.step = state.step
        self.task_order.epoch = int(state.data_state["task_epoch"])
        self.task_order.cursor = int(state.data_state["task_cursor"])
        self.nan_streak = int(state.extra.get("nan_streak", 0))
        self.skipped_updates = int(state.extra.get("skipped_updates", 0))
        for module, key in ((self.value_head, "value_head"), (self.critic_model, "critic_model")):
            if module is not None:
                missing, unexpected = self.dist.load_weights(module, state.extra[key])
                if missing or unexpected:
                    raise ckpt.CheckpointError(f"{path}: the saved {key} does not fit: missing {missing[:5]}, "
                                               f"unexpected {unexpected[:5]}")
        self._sync_rollout_weights()  # a backend with its own copy must roll out with the resumed weights
        self.console.print(f"resuming from {path} at step {self.step}", highlight=False)

    # -- TRAIN ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        last: dict[str, float] = {}
        while self.step < cfg.steps:
            started = time.perf_counter()

            # ROLLOUT: every sample of every task in batched generate calls, envs stepped together
            self.model.eval()
            episodes = self.session.play(self.dist.shard(self.task_order.take(cfg.tasks_per_step)), split=cfg.env.split,
                                         group_size=cfg.group_size, seed=self._rollout_seed())
            rollout_time = time.perf_counter() - started
            metrics = self._rollout_metrics(episodes, rollout_time)

            # REWARD: composed per turn inside play(); allocated to tokens here
            usable = trainable(episodes)
            if cfg.algo == "dpo":
                metrics.update(self._update_dpo(usable))
            elif self.dist.sum([len(usable)])[0]:
                batch = sort_by_length(episodes_to_batch(usable, self.tokenizer.pad_token_id,
                                                         cfg.reward.allocation, cfg.reward.gamma)).to(self.device) \
                    if usable else None  # None: another process has this step's trainable episodes
                metrics.update(self._update_policy_gradient(batch))
            else:
                metrics.update(self._skip_update("no trainable episode in this rollout"))
            self._sync_rollout_weights()
            self.step += 1

            # EVAL and CHECKPOINT
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                metrics.update(self.evaluate())
            metrics["step_time"] = time.perf_counter() - started
            self.logger.log(self.step, metrics)
            if cfg.logging.save_steps and self.step % cfg.logging.save_steps == 0:
                self.save_checkpoint()
            if self.on_step_end is not None:
                self.on_step_end(self.step, metrics)
            last = metrics

        final = self.evaluate() if self.test_tasks else {}
        if final:
            self.logger.log(self.step, {**last, **final})
        self.save_checkpoint()
        weights = self.dist.gather_for_checkpoint(self.model).get("model_state")
        self.dist.on_main(save_final_model, self.model, self.tokenizer, self.output_dir,
                          merge_lora=cfg.model.lora_rank > 0, state_dict=weights)
        return {"steps": self.step, "skipped_updates": self.skipped_updates, "output_dir": str(self.output_dir),
                **{k: v for k, v in {**last, **final}.items() if isinstance(v, (int, float))}}

    def _sync_rollout_weights(self) -> None:
        """The rollout backend gets the trained weights (a no-op for hf sharing the very model)."""
        if self.rollout_model is not self.model:  # sharded, with hf: refresh the unsharded copy in place
            self.dist.copy_whole_weights(self.model, self.rollout_model)
        else:
            self.session.backend.update_weights(self.dist.state_dict(self.model))

    def _rollout_seed(self) -> int:
        """Different per step and per process; with one process, ``seed * 1_000_003 + step``."""
        return (self.cfg.seed * 1_000_003 + self.step) * self.dist.world_size + self.dist.rank

    def _update_policy_gradient(self, batch) -> dict[str, float]:
        """LOG-PROBS, ADVANTAGE and UPDATE for one rollout.

        ``batch`` is None on a process with no trainable episode this step while others have
        some: it still takes part in every gradient sum, contributing zeros.
        """
        cfg, mb_size = self.cfg, self.cfg.optim.micro_batch_size
        local_tokens, any_advantage = 0.0, 0.0
        advantages = self._score_rollout(batch)
        if batch is not None:
            local_tokens = float(batch["response_mask"].sum())
            any_advantage = float(advantages.any())
        total_tokens, any_advantage = self.dist.sum([local_tokens, any_advantage])
        ref_loss = self.ref_model is not None and not cfg.kl_in_reward
        if not any_advantage and self.value_head is None and not ref_loss and not cfg.entropy_coef:
            # the policy gradient is exactly 0: every sample of each task scored the same
            return self._skip_update("every advantage is 0 (all samples of each task got the same reward)")

        # UPDATE: ppo_epochs passes; each pass shuffles the rollout into mini-batches (one optimizer
        # step each, micro-batches accumulated); stats are token-weighted over the last pass
        total_tokens = max(total_tokens, 1.0)
        shuffle = torch.Generator().manual_seed(self._rollout_seed())
        stats: dict[str, float] = {}
        for _ in range(cfg.ppo_epochs):
            self.model.train()
            sums: dict[str, float] = {}
            norms: list[float] = []
            for mini in self._mini_batches(batch, shuffle):
                mini_tokens = float(mini["response_mask"].sum()) if mini is not None else 0.0
                mini_tokens = max(self.dist.sum([mini_tokens])[0], 1.0)
                self.dist.zero_grad(self.optimizer)
                for mb in self.dist.lockstep(micro_batches(mini, mb_size) if mini is not None else []):
                    if mb is None:  # sharded: another process has one more micro-batch here
                        self.dist.idle_pass(lambda: self._forward(self.dist.idle_batch(), True, True))
                        continue
                    tokens = float(mb["response_mask"].sum())
                    out = self.dist.forward(self._forward, mb, with_values=self.value_head is not None,
                                            with_entropy=True)
                    loss, parts = policy_gradient_loss(out, mb, cfg, self.policy_loss_fn, self.kl_fn)
                    self.dist.backward(loss * (tokens / mini_tokens))
                    for k, v in parts.items():
                        sums[k] = sums.get(k, 0.0) + tokens / total_tokens * v
                step = self._optimizer_step()
                norms += [step.pop("grad_norm")] if "grad_norm" in step else []
                sums.update(step)
            stats = {**sums, **({"grad_norm": sum(norms) / len(norms)} if norms else {})}
        local_advantage = float((batch["advantages"] * batch["response_mask"]).sum()) if batch is not None else 0.0
        stats["advantage_mean"] = local_advantage / total_tokens
        # token-weighted parts add up over processes; the optimizer's numbers are the same everywhere
        shared = {"grad_norm", "lr", "skipped_updates"}
        return {**self.dist.sum_dicts({k: v for k, v in stats.items() if k not in shared}),
                **{k: v for k, v in stats.items() if k in shared}}

    def _score_rollout(self, batch) -> torch.Tensor | None:
        """Adds old (and reference) log-probs, values, KL-in-reward, advantages and returns to
        ``batch``; returns the advantages [bs, L] (None for no batch)."""
        cfg, mb_size = self.cfg, self.cfg.optim.micro_batch_size

        # LOG-PROBS of the policy that sampled (old), of the reference, and the critic's values
        with torch.no_grad():
            old, ref, values = [], [], []
            for mb in self.dist.lockstep(micro_batches(batch, mb_size) if batch is not None else []):
                if mb is None:  # sharded: another process has one more micro-batch here
                    self.dist.idle_pass(lambda: self._forward(self.dist.idle_batch(), True), backward=False)
                    if self.ref_model is not None:
                        self._reference_log_probs(self.dist.idle_batch())
                    continue
                width = batch["input_ids"].shape[1]
                out = self.dist.forward(self._forward, mb, with_values=self.value_head is not None)
                old.append(pad_to(out["log_probs"], width))
                if self.value_head is not None:
                    values.append(pad_to(out["values"], width))
                if self.ref_model is not None:
                    ref.append(pad_to(self._reference_log_probs(mb), width))
        if batch is None:
            return None
        mask = batch["response_mask"].float()
        batch.tensors["old_log_probs"] = torch.cat(old)
        if ref:
            batch.tensors["ref_log_probs"] = torch.cat(ref)
        if self.value_head is not None:
            batch.tensors["values"] = torch.cat(values) * mask
        if ref and cfg.kl_in_reward:
            kl = self.kl_fn(batch["old_log_probs"], batch["ref_log_probs"])
            batch.tensors["token_rewards"] = apply_kl_in_reward(batch["token_rewards"], kl, batch["response_mask"],
                                                                cfg.kl_coef)

        # ADVANTAGE
        advantages, returns = self.advantage_fn(AdvantageInput(
            token_rewards=batch["token_rewards"], response_mask=batch["response_mask"], group_ids=batch["group_ids"],
            values=batch.tensors.get("values"), turn_index=batch["turn_index"], turn_rewards=batch["turn_rewards"],
            turn_state_ids=batch["turn_state_ids"]), cfg.algorithm)
        batch.tensors["advantages"], batch.tensors["returns"] = advantages, returns
        return advantages

    def _mini_batches(self, batch, shuffle: torch.Generator) -> list:
        """This process's rows in as many shuffled mini-batches as every process takes this pass
        (``ceil(rollout / mini_batch_size)``), each sorted by length; None for an empty one."""
        rows = len(batch) if batch is not None else 0
        count = math.ceil(self.dist.sum([rows])[0] / self.cfg.mini_batch_size) if self.cfg.mini_batch_size else 1
        if count <= 1:
            return [batch]
        order = torch.randperm(rows, generator=shuffle)
        return [sort_by_length(batch.rows(part)) if len(part) else None for part in torch.tensor_split(order, count)]

    def _update_dpo(self, episodes) -> dict[str, float]:
        """DPO on pairs (best, worst sample of a task) whose total rewards differ."""
        pairs = preference_pairs(episodes)
        total_pairs = self.dist.sum([len(pairs)])[0]
        if not total_pairs:
            return self._skip_update("no preference pair: every sample of each task scored the same")
        size = self.cfg.optim.micro_batch_size
        self.model.train()
        self.dist.zero_grad(self.optimizer)
        sums: dict[str, float] = {}
        if pairs:  # else another process has this step's pairs; this one adds zeros to the gradient sum
            chosen = episodes_to_batch([c for c, _ in pairs], self.tokenizer.pad_token_id).to(self.device)
            rejected = episodes_to_batch([r for _, r in pairs], self.tokenizer.pad_token_id).to(self.device)
        for mbs in self.dist.lockstep(zip(micro_batches(chosen, size), micro_batches(rejected, size))
                                      if pairs else []):
            if mbs is None:  # sharded: another process has one more micro-batch here (same order of passes)
                idle = self.dist.idle_batch()
                with torch.no_grad():
                    self._pair_log_probs(self.ref_model, idle, idle)
                self.dist.idle_pass(lambda: self._pair_log_probs(self.model, idle, idle))
                continue
            c_mb, r_mb = mbs
            with torch.no_grad():
                ref_logps = self._pair_log_probs(self.ref_model, c_mb, r_mb)
            logps = self.dist.forward(self._pair_log_probs, self.model, c_mb, r_mb)
            loss, parts = dpo_loss(logps[0], logps[1], ref_logps[0], ref_logps[1], self.cfg.dpo_beta)
            weight = len(c_mb) / total_pairs
            self.dist.backward(loss * weight)
            for k, v in {"loss": loss.item(), **{f"dpo_{k}": float(v) for k, v in parts.items()}}.items():
                sums[k] = sums.get(k, 0.0) + weight * v
        return {**self.dist.sum_dicts(sums), "dpo_pairs": float(total_pairs), **self._optimizer_step()}

    def _pair_log_probs(self, model, chosen, rejected) -> list[torch.Tensor]:
        """Summed response log-probs under ``model`` of a micro-batch of chosen and of rejected samples."""
        return [sequence_log_prob(model, mb, self.temperature) for mb in (chosen, rejected)]

    def _reference_log_probs(self, mb) -> torch.Tensor:
        return policy_forward(self.ref_model, mb["input_ids"], mb["attention_mask"], self.temperature,
                              token_mask=mb["response_mask"])["log_probs"]

    def _forward(self, mb, with_values: bool = False, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs (entropy, values) of the sampled tokens; the LM head runs on those alone."""
        out = policy_forward(self.model, mb["input_ids"], mb["attention_mask"], self.temperature,
                             with_entropy=with_entropy, token_mask=mb["response_mask"],
                             value_head=self.value_head if with_values and self.critic_model is None else None)
        if with_values and self.critic_model is not None:
            out["values"] = policy_forward(self.critic_model, mb["input_ids"], mb["attention_mask"],
                                           value_head=self.value_head, token_mask=mb["response_mask"])["values"]
        return out

    def _optimizer_step(self) -> dict[str, float]:
        """Sum gradients over processes, clip, then step unless the gradient is not finite (then
        skip, and stop after too many)."""
        grad_norm = self.dist.optimizer_step(self.params, self.optimizer, self.cfg.optim.max_grad_norm)
        if not math.isfinite(grad_norm):
            return self._skip_update(f"non-finite gradient norm ({grad_norm}) at step {self.step + 1}", nan=True)
        self.scheduler.step()
        self.nan_streak = 0
        return {"grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}

    def _skip_update(self, why: str, nan: bool = False) -> dict[str, float]:
        self.dist.zero_grad(self.optimizer)
        self.skipped_updates += 1
        self.logger.warn(f"skipped the update: {why} ({self.skipped_updates} skipped so far)")
        if nan:
            self.nan_streak += 1
            if self.nan_streak >= self.cfg.optim.max_nan_steps:
                raise NonFiniteLossError(f"{self.nan_streak} updates in a row had a non-finite loss or gradient; "
                                         "lower optim.learning_rate or check the rewards")
        return {"skipped_updates": float(self.skipped_updates)}

    def _rollout_metrics(self, episodes, seconds: float) -> dict[str, float]:
        metrics = rollout_metrics(episodes, seconds, self.session.reward_summary)
        if self.dist.world_size > 1:  # every process played as many episodes: means average, counts add
            added = ("env_errors", "tokens_per_s")
            metrics = {k: v if k in added else v / self.dist.world_size for k, v in self.dist.sum_dicts(metrics).items()}
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Success and score on the first ``eval_tasks`` tasks of the test split: greedy, or the mean
        of ``eval_samples_per_task`` samples at ``eval_temperature``."""
        if not self.test_tasks:
            return {}
        self.model.eval()
        sampling = self.session.limits
        self.session.limits = dataclasses.replace(sampling, temperature=self.cfg.eval_temperature)
        try:
            episodes = self.session.play(self.dist.shard(self.test_tasks), split="test",
                                         group_size=self.cfg.eval_samples_per_task, seed=self.cfg.seed)
        finally:
            self.session.limits = sampling
        n, won, score = self.dist.sum([len(episodes), sum(ep.won for ep in episodes), sum(ep.score for ep in episodes)])
        return {"eval_success": won / n, "eval_score": score / n}

    def save_checkpoint(self) -> Path:
        extra: dict[str, Any] = {"nan_streak": self.nan_streak, "skipped_updates": self.skipped_updates}
        if self.value_head is not None:
            extra["value_head"] = self.dist.state_dict(self.value_head, all_ranks=False)
        if self.critic_model is not None:
            extra["critic_model"] = self.dist.state_dict(self.critic_model, all_ranks=False)
        # every process holds the same weights and optimizer state (or when sharded its shard of what is
        # gathered here): the main one writes them
        gathered = self.dist.gather_for_checkpoint(self.model, self.optimizer)
        self.dist.on_main(
            ckpt.save_checkpoint, self.output_dir, self.step, self.model, optimizer=self.optimizer,
            scheduler=self.scheduler, data_state={"task_epoch": self.task_order.epoch,
                                                         "task_cursor": self.task_order.cursor},
            config=self.config_dict, extra=extra, tokenizer=self.tokenizer, keep=self.cfg.logging.keep_checkpoints,
            **gathered)
        return ckpt.latest_checkpoint(self.output_dir)

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        for name in ("logger", "session", "dist"):
            thing = getattr(self, name, None)
            if thing is not None:
                thing.close()


def run_rl(cfg: TrainRunConfig, on_step_end: StepCallback | None = None,
           console: Console | None = None) -> dict[str, Any]:
    """Set up, train and clean up; returns a summary of the last step and the final evaluation."""
    recipe = RLRecipe(cfg, on_step_end=on_step_end, console=console)
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()
