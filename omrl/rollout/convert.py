"""Episodes as readable records: the JSONL written beside a trajectory parquet, and checks on them."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from omrl.atomic import atomic_write_text
from omrl.config.redaction import redact_text
from omrl.data.trajectory import Episode, to_json


def token_exact(episode: Episode) -> bool:
    """Whether every model turn holds the ids the model sampled (training refuses episodes that do not)."""
    return all(turn.info.get("rollout", {}).get("token_exact", True) for turn in episode.turns)


def truncated_turns(episode: Episode) -> int:
    """Model turns cut at their token limit (no end-of-turn token sampled)."""
    return sum(bool(turn.info.get("rollout", {}).get("truncated", False)) for turn in episode.turns)


def generated_tokens(episode: Episode) -> int:
    """Tokens the model generated in the episode (the loss-mask ones)."""
    return sum(episode.loss_mask)


#: what a seat's episode of a game of several seats adds to its record (:mod:`omrl.rollout.seats`)
SEAT_FIELDS = ("seat", "players", "opponent", "outcome", "seat_reward", "seat_rewards", "game")


def seat_record(episode: Episode) -> dict[str, Any]:
    """The seat an episode of a game played, who played each seat, the game and its outcome; {} for an
    episode of one agent. Without them a game's records cannot be told apart (one task, one sample)."""
    info = episode.info
    return {key: info[key] for key in SEAT_FIELDS if key in info} if info.get("seat") else {}


def episode_record(episode: Episode) -> dict[str, Any]:
    """A readable summary of an episode: the chat, each turn's action and outcome, no token arrays."""
    return {
        "env": episode.env,
        "split": episode.split,
        "task_id": episode.task_id,
        "group": episode.group,
        "sample": episode.sample,
        **seat_record(episode),
        "won": episode.won,
        "score": episode.score,
        "end_reason": episode.end_reason,
        "error": redact_text(episode.error) if episode.error else episode.error,  # an env's error may quote a secret
        "num_turns": episode.num_turns,
        "total_reward": episode.total_reward,
        "tokens": len(episode.token_ids),
        "generated_tokens": generated_tokens(episode),
        "token_exact": token_exact(episode),
        "instruction": episode.instruction,
        "turns": [
            {
                "action": t.action,
                "format_ok": t.format_ok,
                "reward": t.reward,
                "done": t.done,
                "parse_error": t.parse_error,
            }
            for t in episode.turns
        ],
        "rewards": episode.rewards,
        "messages": episode.messages,
        "demo_messages": episode.demo_messages,
    }


def jsonl_path_for(parquet_path: str | os.PathLike) -> Path:
    """Where the readable JSONL of a trajectory parquet goes: the same name, ``.jsonl``."""
    return Path(parquet_path).with_suffix(".jsonl")


def write_trajectories(
    episodes: list[Episode], parquet_path: str | os.PathLike, tokenizer: Any = None, played: dict | None = None
) -> tuple[Path, Path]:
    """The trajectory parquet (recording ``tokenizer``, the one that made the token ids, and ``played``, the
    env settings the episodes were played with) and its readable JSONL beside it (see :func:`jsonl_path_for`):
    their paths."""
    from omrl.data import write_episodes

    parquet = write_episodes(episodes, parquet_path, tokenizer, played)
    return parquet, write_jsonl(episodes, jsonl_path_for(parquet))


def write_jsonl(episodes: Iterable[Episode], path: str | os.PathLike) -> Path:
    """Write one readable record per line, atomically, as strict JSON (no NaN or Infinity)."""
    path = Path(path)
    lines = "".join(to_json(episode_record(ep)) + "\n" for ep in episodes)
    atomic_write_text(path, lines)
    return path


def unscored_path(parquet_path: str | os.PathLike) -> Path:
    """Where a command keeps the episodes it played when a reward failed on them: ``NAME.unscored.parquet``."""
    path = Path(parquet_path)
    return path.with_name(f"{path.stem}.unscored.parquet")


def write_unscored(
    episodes: list[Episode], parquet_path: str | os.PathLike, tokenizer: Any = None, played: dict | None = None
) -> Path:
    """Write ``episodes`` with their rewards cleared (a reward that failed on them, a Ctrl-C before they were
    scored) to ``parquet_path`` and its JSONL: the play is kept, and nothing in it passes for a reward."""
    for ep in episodes:
        ep.rewards = {}
    return write_trajectories(episodes, parquet_path, tokenizer, played)[0]


@contextmanager
def keep_unscored(parquet_path: str | os.PathLike) -> Iterator[None]:
    """Write the episodes of an :class:`~omrl.rollout.spec.UnscoredEpisodes` raised inside to
    ``parquet_path`` (and its JSONL), and fail with the reward's error naming them: a reward that fails
    after an hour of play costs the reward's fix, not the play."""
    from omrl.rewards import RewardError
    from omrl.rollout.spec import UnscoredEpisodes

    try:
        yield
    except UnscoredEpisodes as exc:
        parquet = write_unscored(exc.episodes, parquet_path, exc.tokenizer)
        raise RewardError(
            f"{exc}; the {len(exc.episodes)} episodes played are written without rewards to {parquet}"
        ) from exc
