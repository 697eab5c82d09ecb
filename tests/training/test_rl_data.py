"""Preference pairs for DPO, built from the samples of each task; the order training tasks are played in."""

from __future__ import annotations

from omrl.data import Episode
from omrl.training.rl_data import TaskOrder, preference_pairs


def _sample(group: int, sample: int, reward: float, won: bool = False) -> Episode:
    return Episode(
        "gridworld", group, "train", "walk", group=group, sample=sample, won=won, rewards={"total": [reward]}
    )


def test_each_task_pairs_its_best_sample_with_its_worst():
    episodes = [_sample(0, 0, 0.5), _sample(0, 1, 1.0, won=True), _sample(0, 2, 0.0), _sample(1, 0, 0.2)]
    pairs = preference_pairs(episodes)
    assert [(chosen.sample, rejected.sample) for chosen, rejected in pairs] == [(1, 2)]  # task 1 has one sample


def test_a_task_whose_samples_all_scored_the_same_gives_no_pair():
    assert preference_pairs([_sample(0, 0, 0.3), _sample(0, 1, 0.3, won=True), _sample(0, 2, 0.3)]) == []


def test_task_order_plays_every_task_once_a_pass_and_reshuffles_between_passes():
    order = TaskOrder(list(range(5)), seed=3)
    first = order.take(3) + order.take(3)  # the second call crosses into the next pass
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and (order.epoch, order.cursor) == (1, 1)
    second = first[5:] + order.take(4)
    assert sorted(second) == [0, 1, 2, 3, 4] and second != first[:5]


def test_task_order_resumed_from_its_position_continues_the_same_sequence():
    whole = TaskOrder(list(range(7)), seed=0)
    expected = [whole.take(3) for _ in range(5)]
    part = TaskOrder(list(range(7)), seed=0)
    played = [part.take(3) for _ in range(2)]
    resumed = TaskOrder(list(range(7)), seed=0, epoch=part.epoch, cursor=part.cursor)
    assert played + [resumed.take(3) for _ in range(3)] == expected
