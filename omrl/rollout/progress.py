"""Hooks a rollout calls as it goes: tokens generated, episodes finished."""

from __future__ import annotations

import time
from typing import Sequence

from omrl.data.trajectory import Episode


class RolloutProgress:
    """Counts what a rollout has done; subclass it to drive a progress bar.

    ``collect`` calls :meth:`generated` after every backend call and
    :meth:`finished` as each episode ends.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.tokens = 0
        self.episodes = 0
        self.measured = 0  # episodes that measured the model: an env's failure is neither win nor loss
        self.wins = 0

    def generated(self, tokens: int) -> None:
        """``tokens`` new model tokens were generated (all episodes of one call together)."""
        self.tokens += tokens

    def finished(self, episode: Episode) -> None:
        """``episode`` has ended."""
        self.finished_task([episode])

    def finished_task(self, episodes: Sequence[Episode]) -> None:
        """A task whose ``episodes`` (its samples) all ended: one more done, and its wins among them counted
        as eval's table counts them (every sample that measured the model)."""
        self.episodes += 1
        self.finished_more(episodes)

    def finished_more(self, episodes: Sequence[Episode]) -> None:
        """More ``episodes`` of a task already reported done (a game's other seat): their wins count, as in
        eval's table, and no task more is done."""
        from omrl.env_errors import measured  # which imports this package

        for episode in episodes:
            if measured([episode]):
                self.measured += 1
                self.wins += int(episode.won)

    @property
    def success_rate(self) -> float:
        """The share of won episodes among those that measured the model, as eval's table counts it."""
        return self.wins / self.measured if self.measured else 0.0

    @property
    def tokens_per_second(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.tokens / elapsed if elapsed > 0 else 0.0


class PerTaskProgress(RolloutProgress):
    """Passes tokens on to ``inner``, and a task once all ``group_size`` samples of it finished: what
    strategies report (one task done, as their progress counts) from the batched rollout's episodes."""

    def __init__(self, inner: RolloutProgress, group_size: int):
        super().__init__()
        self.inner, self.group_size = inner, group_size
        self.samples: dict[int, list[Episode]] = {}
        self.reported: set[int] = set()

    def generated(self, tokens: int) -> None:
        self.inner.generated(tokens)

    def finished(self, episode: Episode) -> None:
        done = self.samples.setdefault(episode.group, [])
        done.append(episode)
        if len(done) < self.group_size:
            return
        task, samples = _task_position(episode), sorted(done, key=lambda ep: ep.sample)
        if task in self.reported:  # a game's seats end together: the task is done, its other seats count too
            self.inner.finished_more(samples)
        else:
            self.reported.add(task)
            self.inner.finished_task(samples)


def _task_position(episode: Episode) -> int:
    """The position of ``episode``'s task in the tasks played: its group, which a seated game's
    episodes share with their seat (``task index * seats + seat index``, :mod:`omrl.rollout.seats`)."""
    players = episode.info.get("players")
    return episode.group // len(players) if isinstance(players, dict) and players else episode.group
