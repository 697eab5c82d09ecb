"""Where a chain rollout's replies come from: a backend turn by turn, or a backend's stream as they come.

The loop (:mod:`omrl.rollout.loop`) hands a source the episodes waiting for a reply and gets back
``(episode, reply)`` pairs for those whose reply is ready:

- :class:`TurnReplies`: every waiting episode's turn in one ``generate`` call, so every one is ready
  after it (the batch runs to its longest reply);
- :class:`StreamedReplies`: each episode's turn goes into the backend's :class:`~omrl.backends.base.Stream`
  once, and the call returns as soon as some replies end; the others keep decoding while the ready
  episodes step their envs and come back with their next turns.

A turn's sampling seed comes from the rollout's ``seed``: turn by turn, one per call (the call's
rows share ``model.generate``'s stream); streamed, one per episode turn (its group, sample and turn
number), so a reply does not depend on which episodes were decoding beside it.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from omrl.backends.base import Backend, Generation, SamplingParams, Stream
from omrl.rollout.live import LiveEpisode
from omrl.rollout.spec import RolloutLimits
from omrl.supervisor import stage

S = TypeVar("S", bound=LiveEpisode)


def turn_caps(live: Sequence[LiveEpisode], limits: RolloutLimits) -> list[int]:
    """Each episode's token limit for its next reply: the turn's cap, or what its row's context has left."""
    return [min(limits.max_new_tokens, limits.max_context - len(s.episode.current_row())) for s in live]


class TurnReplies:
    """Every waiting episode's next reply from one ``generate`` call."""

    def __init__(self, backend: Backend, limits: RolloutLimits, seed: int):
        self.backend, self.limits, self.seed = backend, limits, seed
        self.calls = 0

    def __call__(self, live: Sequence[S]) -> list[tuple[S, Generation | BaseException]]:
        params = SamplingParams(
            max_new_tokens=turn_caps(live, self.limits),
            temperature=self.limits.temperature,
            top_p=self.limits.top_p,
            seed=self.seed * 1_000_003 + self.calls * 10_007,
        )
        with stage("generate", episode=f"{len(live)} episodes, turn {self.calls + 1}"):
            prompts = [s.episode.current_row() for s in live]
            replies = list(self.backend.generate(prompts, params, messages=[s.messages for s in live]))
        self.calls += 1
        return list(zip(live, replies))


class StreamedReplies:
    """Replies from a backend's stream: each waiting episode's turn is submitted once, and a call returns
    the episodes whose replies ended (at least one)."""

    def __init__(self, stream: Stream, limits: RolloutLimits, seed: int):
        self.stream, self.limits, self.seed = stream, limits, seed
        self.submitted: dict[int, LiveEpisode] = {}  # ticket -> the episode whose turn it is

    def __call__(self, live: Sequence[S]) -> list[tuple[S, Generation | BaseException]]:
        waiting = {id(s) for s in self.submitted.values()}
        fresh = [s for s in live if id(s) not in waiting]
        for state, cap in zip(fresh, turn_caps(fresh, self.limits)):
            ticket = self.stream.submit(state.episode.current_row(), cap, self.turn_seed(state))
            self.submitted[ticket] = state
        with stage("generate", episode=f"{len(self.submitted)} episodes decoding"):
            done = self.stream.advance()
        return [(self.submitted.pop(ticket), reply) for ticket, reply in done]  # type: ignore[misc]

    def turn_seed(self, state: LiveEpisode) -> int:
        """This episode turn's own seed: the same for the same rollout seed, task, sample and turn."""
        ep = state.episode
        return hash((self.seed, ep.group, ep.sample, len(ep.turns))) & (2**63 - 1)

    def close(self) -> None:
        self.stream.close()
