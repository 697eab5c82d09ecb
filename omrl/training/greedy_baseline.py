"""A greedy episode of every task of a step, whose reward is the baseline of that task's samples, for
estimators that register with ``needs=("greedy_scores",)`` (ReMax: Li et al. 2023, arXiv:2310.10505).

The greedy episodes are played after the step's rollout, with the same weights, at temperature 0;
they are measured, never trained on. A task whose greedy episode failed in the env has no baseline:
its rows get their own reward as one, hence advantage 0 (counted in ``greedy_env_errors``), rather
than a failure of the world passed off as a score.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omrl import registry
from omrl.data import Batch
from omrl.errors import ConfigError
from omrl.mixture import task_of
from omrl.rollout import RolloutSession
from omrl.rollout.mixed import is_mixed
from omrl.training.tree_batch import ROW_EPISODE

NEED = "greedy_scores"


def needed(cfg: Any) -> bool:
    """Whether the run's advantage estimator asks for greedy baselines; refuses what cannot give them."""
    traits = registry.algorithms.component(cfg.algorithm.advantage, kind="advantage").traits
    if NEED not in traits.get("needs", ()):
        return False
    if cfg.rollout.strategy != "chain" or cfg.rollout.async_generation:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage} compares each sample with a greedy episode of its "
            "task, which this run cannot play beside its rollout: use rollout.strategy=chain and "
            f"rollout.async_generation=false (got {cfg.rollout.strategy}, {cfg.rollout.async_generation})"
        )
    return True


def greedy_scores(session: RolloutSession, batch: Batch, split: str, seed: int) -> tuple[torch.Tensor, dict]:
    """([bs] float32: the composed reward of a greedy episode of each row's task, aligned with
    ``batch``'s rows (a row's own score where that episode failed in the env); sums to add up over
    processes: ``greedy_score_sum`` and ``greedy_tasks`` (of the episodes that did not fail),
    ``greedy_env_errors``)."""
    rows = batch.non_tensors[ROW_EPISODE]
    mixed = is_mixed(session)  # a mixture's tasks name their env
    tasks = {ep.group: task_of(ep, mixed) for ep in rows}  # one greedy episode per group (a task of this step)
    groups = list(tasks)
    sampling = session.limits
    session.limits = dataclasses.replace(sampling, temperature=0.0)
    try:
        greedy = session.play([tasks[group] for group in groups], split=split, group_size=1, seed=seed)
    finally:
        session.limits = sampling
    if session.backend is not None:  # their generation is not the next step's rollout: not counted there
        session.backend.take_stats()
    score = {groups[ep.group]: ep.total_reward for ep in greedy if ep.end_reason != "env_error"}
    own = (batch["token_rewards"].float() * batch["loss_mask"]).sum(-1)  # a row's score, as estimators sum it
    baseline = own.clone()
    for row, ep in enumerate(rows):
        if ep.group in score:
            baseline[row] = score[ep.group]
    failed = sum(ep.end_reason == "env_error" for ep in greedy)
    metrics = {"greedy_score_sum": sum(score.values()), "greedy_tasks": float(len(score)), "greedy_env_errors": failed}
    return baseline, metrics
