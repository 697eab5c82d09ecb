"""The ``omrl train`` recipe for grpo and ppo: online policy-gradient RL in a multi-turn env.

Reads top to bottom: ``setup`` (seed, resume point, models, algorithms, rollout, optimizer,
logger), ``train`` (one step = ROLLOUT -> REWARD -> LOG-PROBS -> ADVANTAGE -> UPDATE, then
EVAL and CHECKPOINT), ``cleanup``. DPO, which trains on pairs instead of advantages, is
:mod:`omrl.training.dpo`.

- The advantage estimator, policy loss, KL estimator and rollout correction are plugins looked up
  by name (``algorithm.advantage``, ``.policy_loss``, ``.kl_estimator``, ``.rollout_correction``,
  :mod:`omrl.training.rollout_correction`); they share one calling
  convention (:mod:`omrl.algos`), so nothing here depends on which one is chosen. ``ppo``
  adds a critic: a value head on the policy (``algorithm.critic=head``) or its own model.
- ``rollout.strategy`` may play the tasks by a tree search (:mod:`omrl.search`): its finished
  root-to-leaf paths are the rows, and a turn several paths share is trained once
  (:mod:`omrl.training.tree_batch`); ``tree_grpo`` credits each turn at the trees' branch points.
- Rollouts generate with the very model being trained (the hf backend shares it); other
  backends get the new weights after every update.
- The strategy (:mod:`omrl.parallel`) hides how processes share the work: one process,
  data parallel, FSDP or ZeRO-3 run this same code.
- A non-finite gradient skips the update with a warning; ``optim.max_nan_steps`` of them in
  a row stop the run. Resume restores weights, optimizer, scheduler, RNG states and the
  position in the task order, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from omrl import registry
from omrl.algos import AlgoConfig, micro_batch_share
from omrl.clock import timed
from omrl.config.options import TrainRunConfig
from omrl.training import algo_probe, config_checks, env_scale, greedy_baseline, online, online_run
from omrl.training.critic import critic_modules, critic_state, load_critic, load_critic_state
from omrl.training.distillation import add_teacher_rewards, load_teacher
from omrl.training.kl_control import AdaptiveKL
from omrl.training.losses import apply_kl_in_reward, figure_weight, policy_gradient_loss
from omrl.training.metrics import StepCallback
from omrl.training.optim import schedule_advances
from omrl.training.policy import policy_forward
from omrl.training.recipe import autocast, close_recipe, run_recipe, setup_optimizer, skip_update, start_recipe
from omrl.training.recipe import update as optimizer_update
from omrl.training.rl_data import join_columns, micro_batches, rows_that_learn, shuffled_mini_batches, sort_by_length
from omrl.training.rollout_correction import correct, correction_name, mismatch_means, mismatch_over_processes
from omrl.training.rollout_step import trees_per_task
from omrl.training.shared_prefix import SharedPrefix, supports_shared_prefix, with_shared_prefixes
from omrl.training.tree_batch import chain_rows, paths_to_batch, train_each_turn_once, tree_advantage_input


class RLRecipe:
    """GRPO or PPO: ``setup()``, ``train()``, ``cleanup()`` (or :func:`run_rl`)."""

    def __init__(self, cfg: TrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        start_recipe(self, cfg, on_step_end, console)

    # -- SETUP ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, algo = self.cfg, self.cfg.algorithm
        resume_from = online_run.begin_setup(self, recipes=("grpo", "ppo"))
        self.temperature = online.scoring_temperature(cfg)
        # the algorithms first: a wrong name or setting is refused before any model loads
        self.advantage_fn = registry.algorithms.get(algo.advantage, kind="advantage")
        loss = registry.algorithms.component(algo.policy_loss, kind="policy_loss")
        self.policy_loss_fn, self.loss_traits = loss.obj, loss.traits
        self.kl_fn = registry.algorithms.get(algo.kl_estimator, kind="kl")
        self.correction = correction_name(cfg)
        self.correction_fn = registry.algorithms.get(self.correction, kind="rollout_correction")
        self.kl_control = AdaptiveKL(algo)
        self.greedy_baseline = config_checks.wants_greedy_baseline(cfg)  # ReMax: a greedy episode per task, as baseline
        algo_probe.check_algorithms(
            cfg, self.advantage_fn, algo.name == "ppo", self.greedy_baseline, self.policy_loss_fn, self.correction_fn
        )
        self.model, self.tokenizer, self.rollout_model, self.ref_model = online.load_models(
            cfg, self.strategy, with_reference=algo.kl_coef > 0
        )
        self.value_head, self.critic_model = load_critic(cfg, self.strategy, self.model)  # ppo's
        self.teacher = load_teacher(cfg, self.strategy, self.tokenizer) if algo.teacher else None
        self.run = online_run.OnlineRun(cfg, self.strategy, self.model, self.rollout_model, self.tokenizer)
        passes = math.ceil(cfg.tasks_per_step * cfg.group_size / cfg.mini_batch_size) if cfg.mini_batch_size else 1
        self.planned_passes = passes  # a pass moves the schedule this far, however many mini-batches it has
        setup_optimizer(self, cfg.steps * cfg.ppo_epochs * passes, critic_modules(self.value_head, self.critic_model))
        self.loss_norm_tokens = algo.loss_norm_tokens
        if algo.loss_agg_mode == "seq-mean-token-sum-norm" and not algo.loss_norm_tokens:
            self.loss_norm_tokens = online.episode_token_budget(cfg)
        resumed = online_run.end_setup(self, resume_from)
        if resumed is not None:
            self.kl_control.load_state_dict(resumed.extra)
            load_critic_state(self.strategy, resumed, self.value_head, self.critic_model)

    # -- TRAIN ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, strategy = self.cfg, self.strategy
        metrics: dict[str, float] = {}
        while self.step < cfg.steps:
            started = time.perf_counter()
            algo = self._step_algorithm()  # this step's values: the adaptive KL coefficient moves
            seed = self.run.seed(self.step)

            # ROLLOUT: every sample of every task, or every path of a search's trees
            episodes, metrics = self.run.play(self.step)
            if cfg.reward.per_env_scale != "none" and self.run.session.mixture:
                metrics.update(env_scale.scale_per_env(episodes, self.run.session.env_names, strategy))

            # REWARD: composed per turn inside play(); allocated to the sampled tokens here. A search's
            # rows are its finished paths, each whole (omrl.training.tree_batch)
            batch = sort_by_length(self._rows(episodes)).to(self.device)
            tokens = strategy.sum([batch["loss_mask"].sum()])[0]  # trained tokens on all processes
            if not tokens:
                self.run.save_rollout(self.step, episodes)  # nothing trained: saved with no advantages
                if config_checks.searched(cfg):  # no path finished: the curves' 0, not a gap
                    metrics.update(finished_paths=0.0, trained_token_share=0.0)
                metrics.update(skip_update(self, self.step + 1, "no trainable episode in this rollout"))
                online_run.end_step(self, metrics, started)
                continue

            # LOG-PROBS of the policy that sampled (old) and of the reference; the critic's values.
            # On-policy the update's own forward gives the old log-probs (detached): no forward here
            passes = self._mini_batch_count(batch)
            on_policy = self._old_log_probs_from_update(passes)
            batch = join_columns(batch, self._score_rollout(batch, on_policy))  # old/ref log-probs, values
            if not on_policy and "sampler_log_probs" in batch.tensors:  # the sampler's gap
                metrics.update(mismatch_over_processes(self.strategy, batch))
            if self.teacher is not None:  # on-policy distillation: the teacher's log-probs as a dense reward
                metrics.update(add_teacher_rewards(batch, algo.teacher_coef, strategy))
            if self.ref_model is not None and algo.kl_in_reward and len(batch):
                kl = self.kl_fn(batch["old_log_probs"], batch["ref_log_probs"])
                batch.tensors["token_rewards"] = apply_kl_in_reward(
                    batch["token_rewards"], kl, batch["loss_mask"], algo.kl_coef
                )

            # ADVANTAGE: one calling convention for every estimator (omrl.algos.AdvantageInput)
            greedy = None
            if self.greedy_baseline:  # ReMax: a greedy episode of each task is its samples' baseline
                greedy, found = greedy_baseline.step_baselines(self.run.session, batch, cfg, seed, strategy)
                metrics.update(found)
            batch.tensors["advantages"], batch.tensors["returns"] = self._advantages(batch, algo, greedy)
            self.run.save_rollout(
                self.step, episodes, batch
            )  # with what each row is trained with (all 0: a skipped update)
            if config_checks.searched(cfg):  # a turn several paths share: trained once, with its copies' mean advantage
                batch = train_each_turn_once(batch)
                trained, rows_trained, paths = strategy.sum([batch["loss_mask"].sum(), len(batch), len(episodes)])
                metrics.update(finished_paths=rows_trained / max(paths, 1.0), trained_token_share=trained / tokens)
                tokens = trained
            if self.correction != "none":  # weights for the sampler's gap; dropped tokens leave the loss
                metrics.update(correct(batch, self.correction_fn, algo) if len(batch) else {})
                tokens = strategy.sum([batch["loss_mask"].sum()])[0]
                if not tokens:
                    why = f"the rollout correction ({self.correction}) dropped every token"
                    metrics.update(skip_update(self, self.step + 1, why))
                    online_run.end_step(self, metrics, started)
                    continue
            if not strategy.sum([batch["advantages"].any()])[0] and not self._other_loss_terms():
                why = "every advantage is 0 (all samples of each task got the same reward)"
                metrics.update(skip_update(self, self.step + 1, why))
                online_run.end_step(self, metrics, started)
                continue

            # UPDATE: ppo_epochs passes over the rollout, one optimizer step per mini-batch
            metrics.update(self._update(batch, algo, passes, seed, tokens, on_policy))
            if self.kl_control.adaptive and "kl_token_mean" in metrics and "grad_norm" in metrics:
                # steered by the KL per token the update measured (not after a skipped update)
                self.kl_control.update(metrics["kl_token_mean"], int(strategy.sum([len(batch)])[0]))

            # EVAL (every eval_every steps and after the last) and CHECKPOINT, as dpo's
            online_run.end_step(self, metrics, started)

        return online_run.finish(self, metrics)

    def _rows(self, episodes: list) -> Any:
        """The step's rows: a search's finished paths (each whole, its trees numbered per task), or
        the episodes themselves."""
        pad, cfg = self.tokenizer.pad_token_id, self.cfg
        if config_checks.searched(cfg):
            return paths_to_batch(episodes, trees_per_task(cfg), pad, cfg.reward.allocation, cfg.reward.gamma)
        return chain_rows(episodes, pad, cfg.reward.allocation, cfg.reward.gamma)

    def _step_algorithm(self) -> AlgoConfig:
        """The algorithm's values for this step: the config's, with the KL coefficient the controller
        reached (:class:`~omrl.training.kl_control.AdaptiveKL`) and the constant loss normaliser
        resolved."""
        return dataclasses.replace(
            self.cfg.algorithm, kl_coef=self.kl_control.coef, loss_norm_tokens=self.loss_norm_tokens
        )

    def _advantages(self, batch, algo: AlgoConfig, greedy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns) of ``batch``; a process with no rows this step (others have them)
        has none to estimate."""
        if not len(batch):
            empty = torch.zeros_like(batch["token_rewards"])
            return empty, empty
        data = tree_advantage_input(batch)
        data.greedy_scores = greedy
        return algo_probe.estimate(algo.advantage, self.advantage_fn, data, algo, f"step {self.step + 1}'s rollout")

    def _other_loss_terms(self) -> bool:
        """Whether the loss has a term besides the policy gradient (value loss, KL loss, entropy
        bonus): with every advantage 0, only then is an update worth making."""
        algo = self.cfg.algorithm
        kl_loss = self.ref_model is not None and not algo.kl_in_reward
        return self.value_head is not None or kl_loss or bool(algo.entropy_coef)

    def _update(
        self, batch, algo: AlgoConfig, passes: int, seed: int, tokens: float, on_policy: bool
    ) -> dict[str, float]:
        """``ppo_epochs`` passes; each shuffles the rollout into ``passes`` mini-batches (one optimizer
        step each, micro-batches accumulated). Returns the last pass's loss parts, weighted by the
        tokens they cover (``tokens`` trained in all, on all processes), and its optimizer figures."""
        cfg, strategy = self.cfg, self.strategy
        shuffle = torch.Generator().manual_seed(seed)
        # zero-advantage rows add nothing to such a loss: not run (omrl.algos); all run beside a reference
        inert = self.loss_traits.get("zero_advantage_rows_add_nothing", False) and not self._other_loss_terms()
        inert = inert and self.ref_model is None
        for _ in range(cfg.ppo_epochs):
            self.model.train()
            loss_parts: dict[str, float] = {}  # this pass's figures, each weighted as figure_weight says
            optimizer_figures: dict[str, float] = {}  # lr, skipped_updates: the same on every process
            norms: list[float] = []
            minis = shuffled_mini_batches(batch, passes, shuffle)
            runs = [rows_that_learn(mini) for mini in minis] if inert else minis
            seqs = [sum((r["loss_mask"].sum(-1) > 0).sum() for r in rs) for rs in (minis, runs)]
            ran_tokens, ran_rows, rows, seqs, ran_seqs = strategy.sum(
                [sum(r["loss_mask"].sum() for r in runs), sum(len(r) for r in runs), len(batch), *seqs]
            )
            totals = ((tokens, seqs), (ran_tokens, ran_seqs))  # what each figure is a mean over
            advances = schedule_advances(len(minis), self.planned_passes)
            for mini, run, advance in zip(minis, runs, advances):
                mask = mini["loss_mask"]
                mini_tokens, mini_seqs = strategy.sum([mask.sum(), (mask.sum(-1) > 0).sum()])
                strategy.zero_grad(self.optimizer)
                # one autocast region a mini-batch: each weight is cast once, not once a micro-batch
                # (autocast keeps its casts until the region ends); backward runs in the dtypes its
                # forward recorded
                with autocast(self):
                    for mb, prefix in self._update_micro_batches(run, cfg.optim.micro_batch_size):
                        out = self._policy_forward(mb, prefix)
                        if on_policy:  # the policy that sampled is this very one, not yet updated
                            mb.tensors["old_log_probs"] = out["log_probs"].detach()
                        loss, parts = policy_gradient_loss(out, mb, algo, self.policy_loss_fn, self.kl_fn)
                        if on_policy and "sampler_log_probs" in mb.tensors:  # the sampler's gap, measured here
                            parts.update(mismatch_means(mb["old_log_probs"], mb["sampler_log_probs"], mb["loss_mask"]))
                        share = micro_batch_share(algo.loss_agg_mode, mb["loss_mask"], mini_tokens, mini_seqs)
                        with timed("backward"):
                            strategy.backward(loss * share)
                        for key, value in parts.items():
                            weight = figure_weight(key, algo.loss_agg_mode, mb["loss_mask"], *totals, len(minis))
                            loss_parts[key] = loss_parts.get(key, 0.0) + weight * value
                update = optimizer_update(self, self.step + 1, advance=advance)
                if update.applied:
                    norms.append(update.grad_norm)
                    optimizer_figures["lr"] = update.lr
                else:
                    optimizer_figures.update(self.skipped.metrics())
        advantage_mean = float((batch["advantages"] * batch["loss_mask"]).sum()) / tokens  # this process's part
        figures = strategy.sum_dicts({**loss_parts, "advantage_mean": advantage_mean})  # parts add up over processes
        figures.update(optimizer_figures)
        if inert:
            figures["zero_advantage_rows"] = 1.0 - ran_rows / max(rows, 1.0)
        if self.kl_control.adaptive:
            figures["kl_coef"] = algo.kl_coef
        if norms:
            figures["grad_norm"] = sum(norms) / len(norms)
        return figures

    def _mini_batch_count(self, batch) -> int:
        """Mini-batches (optimizer steps) per pass over the rollout: ``ceil(rollout / mini_batch_size)``."""
        if not self.cfg.mini_batch_size:
            return 1
        return math.ceil(self.strategy.sum([len(batch)])[0] / self.cfg.mini_batch_size)

    def _old_log_probs_from_update(self, passes: int) -> bool:
        """True when the update's first forward runs the very policy that sampled (one pass, one
        mini-batch) and nothing needs the old log-probs before it (a critic's values for the
        advantages, the KL put into the rewards). TRL detaches the current log-probs likewise."""
        algo = self.cfg.algorithm
        return (
            self.cfg.ppo_epochs == 1
            and passes <= 1
            and self.value_head is None
            and not (self.ref_model is not None and algo.kl_in_reward)
            and self.correction == "none"  # a correction weighs and masks the batch before the update
            and self.teacher is None  # the teacher's reward needs them before the advantages
        )

    @timed("score")
    def _score_rollout(self, batch, on_policy: bool) -> list[dict[str, torch.Tensor]]:
        """Every micro-batch's rollout-time columns (see :meth:`_score`); none when no forward is
        needed before the update (on-policy, and no reference)."""
        if on_policy and self.ref_model is None:  # (a teacher makes the run not on_policy)
            return []
        score = functools.partial(self._score, on_policy=on_policy)
        with torch.no_grad(), autocast(self):
            return [
                score(mb)
                for mb in self.strategy.micro_batches(
                    micro_batches(batch, self.cfg.optim.micro_batch_size), idle=score, backward=False
                )
            ]

    def _score(self, mb, on_policy: bool) -> dict[str, torch.Tensor]:
        """The rollout-time columns of micro-batch ``mb``: old_log_probs (unless the update gives
        them: ``on_policy``), ref_log_probs, teacher_log_probs, values."""
        scored = {}
        if not on_policy:
            out = self.strategy.forward(self._forward, mb, with_values=self.value_head is not None)
            scored["old_log_probs"] = out["log_probs"]
            if self.value_head is not None:
                scored["values"] = out["values"] * mb["loss_mask"]
        for key, frozen in (("ref_log_probs", self.ref_model), ("teacher_log_probs", self.teacher)):
            if frozen is not None:
                scored[key] = policy_forward(
                    frozen,
                    mb["input_ids"],
                    mb["attention_mask"],
                    self.temperature,
                    token_mask=mb["loss_mask"],
                    position_ids=mb.get("position_ids"),
                )["log_probs"]
        return scored

    def _update_micro_batches(self, mini, mb_size: int):
        """The update's micro-batches, each with the shared prefix it runs on (or None): rows that
        open with the same prompt run it once (omrl.training.shared_prefix)."""
        if self._shares_prefix():
            yield from with_shared_prefixes(self.model, mini, mb_size)
        else:
            yield from (
                (mb, None)
                for mb in self.strategy.micro_batches(micro_batches(mini, mb_size), idle=self._policy_forward)
            )

    def _shares_prefix(self) -> bool:
        """Shared prefixes need the whole model in this process (not sharded) and no critic."""
        return (
            self.cfg.optim.share_prefix
            and not self.strategy.sharded
            and self.value_head is None
            and supports_shared_prefix(self.model)
        )

    @timed("forward")
    def _policy_forward(self, mb, prefix: SharedPrefix | None = None) -> dict[str, torch.Tensor]:
        """The update's forward: log-probs, entropy and (ppo) values of ``mb``."""
        return self.strategy.forward(
            self._forward, mb, with_values=self.value_head is not None, with_entropy=True, prefix=prefix
        )

    def _forward(
        self, mb, with_values: bool = False, with_entropy: bool = False, prefix: SharedPrefix | None = None
    ) -> dict[str, torch.Tensor]:
        """Log-probs (entropy, values) of the sampled tokens; the LM head runs on those alone."""
        out = policy_forward(
            self.model,
            mb["input_ids"],
            mb["attention_mask"],
            self.temperature,
            with_entropy=with_entropy,
            token_mask=mb["loss_mask"],
            prefix=prefix,
            position_ids=mb.get("position_ids"),
            value_head=self.value_head if with_values and self.critic_model is None else None,
        )
        if with_values and self.critic_model is not None:
            out["values"] = policy_forward(
                self.critic_model,
                mb["input_ids"],
                mb["attention_mask"],
                value_head=self.value_head,
                token_mask=mb["loss_mask"],
                position_ids=mb.get("position_ids"),
            )["values"]
        return out

    def save_checkpoint(self) -> Path:
        """Every process calls; the main one writes. Besides the policy: the adaptive KL's state, the critic."""
        critic = critic_state(self.strategy, self.value_head, self.critic_model)
        return online_run.save_checkpoint(self, {**self.kl_control.state_dict(), **critic})

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        close_recipe(self)


def run_rl(
    cfg: TrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Set up, train and clean up with the recipe ``cfg.algorithm.name`` names (grpo, ppo or dpo);
    returns a summary of the last step and its evaluation."""
    from omrl.training.dpo import DPORecipe

    recipe = (DPORecipe if cfg.algorithm.name == "dpo" else RLRecipe)(cfg, on_step_end=on_step_end, console=console)
    return run_recipe(recipe, "train")
