"""Hooks a rollout calls as it goes: tokens generated, episodes finished."""

from __future__ import annotations

import time

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
        self.wins = 0

    def generated(self, tokens: int) -> None:
        """``tokens`` new model tokens were generated (all episodes of one call together)."""
        self.tokens += tokens

    def finished(self, episode: Episode) -> None:
        """``episode`` has ended."""
        self.episodes += 1
        self.wins += int(episode.won)

    @property
    def success_rate(self) -> float:
        return self.wins / self.episodes if self.episodes else 0.0

    @property
    def tokens_per_second(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.tokens / elapsed if elapsed > 0 else 0.0
