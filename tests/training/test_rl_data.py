"""Preference pairs for DPO, built from the samples of each task."""

from __future__ import annotations

from omrl.data import Episode
from omrl.training.rl_data import preference_pairs


def _sample(group: int, sample: int, reward: float, won: bool = False) -> Episode:
    return Episode(env="gridworld", task_id=group, split="train", instruction="walk", group=group, sample=sample,
                   won=won, rewards={"total": [reward]})


def test_each_task_pairs_its_best_sample_with_its_worst():
    episodes = [_sample(0, 0, 0.5), _sample(0, 1, 1.0, won=True), _sample(0, 2, 0.0), _sample(1, 0, 0.2)]
    pairs = preference_pairs(episodes)
    assert [(chosen.sample, rejected.sample) for chosen, rejected in pairs] == [(1, 2)]  # task 1 has one sample


def test_a_task_whose_samples_all_scored_the_same_gives_no_pair():
    assert preference_pairs([_sample(0, 0, 0.3), _sample(0, 1, 0.3, won=True), _sample(0, 2, 0.3)]) == []
