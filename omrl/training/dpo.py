"""The ``omrl train`` recipe for dpo: online DPO on preference pairs from each step's rollout.

Reads top to bottom: ``setup`` (seed, resume point, policy and reference, rollout, optimizer,
logger), ``train`` (one step = ROLLOUT -> PAIRS -> UPDATE, then EVAL and CHECKPOINT),
``cleanup``. A task's best and worst samples form a pair when their total rewards differ
(:func:`~omrl.training.rl_data.preference_pairs`); with a search (``rollout.strategy``), each
branch point of a tree gives one, its best reply's path against its worst sibling's
(:func:`~omrl.training.tree_batch.sibling_pairs`). The loss is DPO's (Rafailov et al. 2023,
:func:`~omrl.training.losses.dpo_loss`) against the frozen starting model, one optimizer
step per training step, each pair weighted alike across processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from omrl.clock import timed
from omrl.config.options import TrainRunConfig
from omrl.errors import ConfigError
from omrl.search import strategy_traits
from omrl.training import config_checks, online, online_run
from omrl.training.losses import dpo_loss
from omrl.training.metrics import StepCallback
from omrl.training.policy import sequence_log_prob
from omrl.training.recipe import autocast, close_recipe, setup_optimizer, skip_update, start_recipe, update
from omrl.training.rl_data import episodes_to_batch, micro_batches, preference_pairs, trainable
from omrl.training.tree_batch import finished_paths, sibling_pairs


class DPORecipe:
    """DPO: ``setup()``, ``train()``, ``cleanup()`` (or :func:`omrl.training.rl.run_rl`)."""

    def __init__(self, cfg: TrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        start_recipe(self, cfg, on_step_end, console)

    # -- SETUP ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        resume_from = online_run.begin_setup(self, recipes=("dpo",))
        self.temperature = online.scoring_temperature(cfg)
        if cfg.group_size < 2 and strategy_traits(cfg.rollout.strategy).group_in_one_tree:  # a lone path a task
            raise ConfigError(
                "dpo builds pairs from samples of the same task: group_size must be >= 2 (or a tree "
                "rollout.strategy, whose branch points give the pairs)"
            )
        self.model, self.tokenizer, self.rollout_model, self.ref_model = online.load_models(
            cfg, self.strategy, with_reference=True
        )
        self.run = online_run.OnlineRun(cfg, self.strategy, self.model, self.rollout_model, self.tokenizer)
        setup_optimizer(self, cfg.steps)  # one optimizer step a training step
        online_run.end_setup(self, resume_from)

    # -- TRAIN ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, strategy = self.cfg, self.strategy
        pad_id, size = self.tokenizer.pad_token_id, cfg.optim.micro_batch_size
        metrics: dict[str, float] = {}
        while self.step < cfg.steps:
            started = time.perf_counter()

            # ROLLOUT: every sample of every task, or every path of a search's trees
            episodes, metrics = self.run.play(self.step)
            self.run.save_rollout(self.step, episodes)

            # PAIRS: each task's best and worst sample, when their total rewards differ; from a search,
            # at each branch point the best path of one reply against the worst of a sibling's
            pairs = sibling_pairs(episodes) if config_checks.searched(cfg) else preference_pairs(trainable(episodes))
            total_pairs = strategy.sum([len(pairs)])[0]
            if not total_pairs:
                why = "every sample of each task scored the same"
                if config_checks.searched(cfg):  # paths a search cut short pair with none, whatever they earned
                    cut = len(episodes) - len(finished_paths(episodes))
                    why = "no branch point's finished replies led to different rewards" + (
                        f" ({cut} of the {len(episodes)} paths were cut short by the search, and pair with none: "
                        "raise rollout.budget for more to finish)"
                        if cut
                        else ""
                    )
                metrics.update(skip_update(self, self.step + 1, f"no preference pair: {why}"))
                online_run.end_step(self, metrics, started)
                continue

            # UPDATE: one optimizer step over every pair of the step, micro-batches of pairs accumulated
            chosen = episodes_to_batch([c for c, _ in pairs], pad_id).to(self.device)
            rejected = episodes_to_batch([r for _, r in pairs], pad_id).to(self.device)
            self.model.train()
            strategy.zero_grad(self.optimizer)
            sums: dict[str, float] = {}
            with autocast(self):  # one region: each weight cast once a step (as in rl.py)
                for c_mb, r_mb in strategy.micro_batches(
                    zip(micro_batches(chosen, size), micro_batches(rejected, size)),
                    idle=lambda row: self._log_probs(row, row),
                ):
                    policy, ref = self._log_probs(c_mb, r_mb)
                    loss, parts = dpo_loss(policy[0], policy[1], ref[0], ref[1], cfg.algorithm.dpo_beta)
                    weight = len(c_mb) / total_pairs
                    with timed("backward"):
                        strategy.backward(loss * weight)
                    for key, value in {"loss": loss.item(), **{f"dpo_{k}": float(v) for k, v in parts.items()}}.items():
                        sums[key] = sums.get(key, 0.0) + weight * value
            applied = update(self, self.step + 1)
            figures = {"grad_norm": applied.grad_norm, "lr": applied.lr} if applied.applied else self.skipped.metrics()
            metrics.update(strategy.sum_dicts(sums), dpo_pairs=float(total_pairs), **figures)

            # EVAL (every eval_every steps and after the last) and CHECKPOINT
            online_run.end_step(self, metrics, started)
        return online_run.finish(self, metrics)

    @timed("forward")
    def _log_probs(self, chosen, rejected) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Summed response log-probs [mb] of the chosen and the rejected rows, under the policy
        (through the strategy: a forward it counts) and under the frozen reference."""
        with torch.no_grad():
            ref = [sequence_log_prob(self.ref_model, mb, self.temperature) for mb in (chosen, rejected)]
        policy = self.strategy.forward(
            lambda: [sequence_log_prob(self.model, mb, self.temperature) for mb in (chosen, rejected)]
        )
        return policy, ref

    def save_checkpoint(self) -> Path:
        """Every process calls; the main one writes."""
        return online_run.save_checkpoint(self)

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        close_recipe(self)
