"""A greedy episode of every task of a step, whose reward is the baseline of that task's samples, for
estimators that register with ``needs=("greedy_scores",)`` (ReMax: Li et al. 2023, arXiv:2310.10505).

The greedy episodes are played after the step's rollout, with the same weights, at temperature 0;
they are measured, never trained on. A greedy episode's baseline is its score as a row's would be:
its composed reward spread over its tokens by the allocation the rows were built with
(``reward.allocation``, ``reward.gamma``) and summed, so a sample identical to it gets advantage 0
under every allocation (``discounted`` gives each turn its discounted value, which does not sum to
the reward). ``reward.per_env_scale`` is refused beside such
an estimator (:func:`omrl.training.env_scale.check`): the step's divisors are not known here. A
task whose greedy episode failed in the env has no baseline: its rows get their own score as one,
hence advantage 0 (counted in ``greedy_env_errors``), rather than a failure of the world passed off
as a score.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omrl.data import Batch
from omrl.mixture import task_of
from omrl.rewards import allocate_rewards
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.tree_batch import ROW_EPISODE

NEED = "greedy_scores"


def greedy_scores(
    session: RolloutSession,
    batch: Batch,
    split: str,
    seed: int,
    allocation: str = "last_token",
    gamma: float = 1.0,
) -> tuple[torch.Tensor, dict]:
    """([bs] float32: the score of a greedy episode of each row's task, aligned with ``batch``'s rows
    and in their units (:func:`allocated_score` with the ``allocation`` and ``gamma`` the rows were
    built with; a row's own score where that episode failed in the env); sums to add up over
    processes: ``greedy_score_sum`` (of the episodes' composed rewards) and ``greedy_tasks`` (of the
    episodes that did not fail), ``greedy_env_errors``)."""
    rows = batch.non_tensors[ROW_EPISODE]
    tasks = {
        ep.group: task_of(ep, session.mixture) for ep in rows
    }  # one greedy episode per group (a task of this step)
    groups = list(tasks)
    spec = PlaySpec(split, 1, seed, limits=dataclasses.replace(session.limits, temperature=0.0))
    greedy = session.play([tasks[group] for group in groups], spec).episodes
    if session.backend is not None:  # their generation is not the next step's rollout: not counted there
        session.backend.take_stats()
    played = {groups[ep.group]: ep for ep in greedy if ep.end_reason != "env_error"}
    score = {group: allocated_score(ep, allocation, gamma) for group, ep in played.items()}
    own = (batch["token_rewards"].float() * batch["loss_mask"]).sum(-1)  # a row's score, as estimators sum it
    baseline = own.clone()
    for row, ep in enumerate(rows):
        if ep.group in score:
            baseline[row] = score[ep.group]
    failed = sum(ep.end_reason == "env_error" for ep in greedy)
    rewards = sum(ep.total_reward for ep in played.values())
    metrics = {"greedy_score_sum": rewards, "greedy_tasks": float(len(played)), "greedy_env_errors": failed}
    return baseline, metrics


def step_baselines(
    session: RolloutSession, batch: Batch, cfg: Any, seed: int, strategy: Any
) -> tuple[torch.Tensor, dict]:
    """:func:`greedy_scores` of a training step (the rows built with the run's ``reward.allocation`` and
    ``gamma``, tasks from ``env.split``), with its metrics over every process: ``greedy_score`` (the
    mean composed reward of every process's greedy episodes that did not fail) and ``greedy_env_errors``."""
    scores, found = greedy_scores(session, batch, cfg.env.split, seed, cfg.reward.allocation, cfg.reward.gamma)
    found = strategy.sum_dicts(found)
    tasks = found.pop("greedy_tasks")
    found["greedy_score"] = found.pop("greedy_score_sum") / max(tasks, 1.0)
    return scores, found


def allocated_score(episode: Any, allocation: str, gamma: float) -> float:
    """``episode``'s score as an estimator reads a row's: the sum of the rewards ``allocation`` puts on
    its tokens (:func:`omrl.rewards.allocate_rewards`, every one on a model token)."""
    return float(sum(allocate_rewards(episode, allocation, gamma)))
