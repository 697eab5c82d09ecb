"""Small trajectory episodes for the conversion tests: one played by the tiny tokenizer, seats of a game."""

from __future__ import annotations

from omrl.chat import conversation_rows
from omrl.data import Episode
from tests.helpers import an_episode

CHAT = [
    {"role": "system", "content": "Walk to the goal."},
    {"role": "user", "content": "You are at the start."},
    {"role": "assistant", "content": "Act: up"},
    {"role": "user", "content": "You moved up."},
    {"role": "assistant", "content": "Act: right"},
]


def played_episode(tokenizer, task_id: int = 0, reply_ids: list[int] | None = None) -> Episode:
    """An episode of ``CHAT`` with the ids the tokenizer lays it out in; ``reply_ids`` in place of the first
    reply's ids: what the model sampled where it differs from the text."""
    ((ids, mask),) = conversation_rows(tokenizer, CHAT)
    if reply_ids is not None:
        start = mask.index(1)
        end = mask.index(0, start)
        ids = ids[:start] + reply_ids + ids[end:]
        mask = mask[:start] + [1] * len(reply_ids) + mask[end:]
    chat = [dict(m) for m in CHAT]
    return an_episode(
        task_id=task_id,
        instruction=CHAT[0]["content"],
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        score=1.0,
        won=True,
        messages=chat,
    )


def seat_episode(seat: str, outcome: str, messages: list[dict], end_reason: str = "done") -> Episode:
    """One seat's episode of game 0 of task 3, as :func:`omrl.rollout.seats.play_seats` writes it."""
    return Episode(
        env="tictactoe",
        task_id=3,
        split="train",
        instruction="Play.",
        won=outcome == "win",
        score=1.0 if outcome == "win" else 0.0,
        end_reason=end_reason,
        messages=messages,
        info={"seat": seat, "outcome": outcome, "game": 0, "players": {"x": "policy", "o": "policy"}},
    )
