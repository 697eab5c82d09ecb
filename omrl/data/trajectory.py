"""Trajectory records: one Episode per played episode, stored one row per episode in parquet.

Token-level fields cover the whole conversation (system prompt, every
observation and every model turn). ``loss_mask`` is 1 exactly on the tokens the
model generated, so the ids trained on are the ids sampled: nothing is decoded
and re-encoded.

Episodes cut from a search tree (:mod:`omrl.search`) carry, on each turn, the id of the
tree node that turn made and of its parent (-1 in chains played without a tree), so the
paths that share a prefix can be told apart and put back together.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from omrl.atomic import atomic_write_parquet
from omrl.chat.replies import REASONING_FIELDS
from omrl.data.layouts import READABLE_SCHEMAS, missing_columns
from omrl.errors import ConfigError, OmrlError

END_REASONS = (
    "done",
    "max_turns",
    "max_context",
    "env_error",
    "empty_response",
    "expert_gave_up",  # the scripted expert had no action for the state: a loss, not the env's failure
    "pruned",
    "budget",
)
_SURROGATE = re.compile("[\ud800-\udfff]")


class UnreadableFileError(OmrlError):
    """A file that is not what its name says: truncated, empty, or other bytes."""


@dataclass
class Turn:
    """One model turn and the env's answer to it."""

    observation: str  # the env text this turn answered (the user message before it)
    response: str  # the model's text, decoded from exactly the sampled ids
    action: str | None  # parsed action, None when the reply did not parse
    format_ok: bool
    reward: float  # the env's step reward
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)  # [start, end) of this turn's model tokens in Episode.token_ids
    parse_error: str | None = None
    node_id: int = -1  # the search-tree node this turn made (-1: not from a tree)
    parent_id: int = -1  # that node's parent (0 is the tree's root: the prompt alone)

    @property
    def answer(self) -> str:
        """The reply without a thinking model's reasoning: what the family's server returns as the message's
        content (``info["answer_from"]``, set where the reply had reasoning, is where it starts)."""
        return self.response[self.info.get("answer_from", 0) :]


@dataclass
class Episode:
    """A whole episode: readable turns plus the exact token ids, mask and log-probs."""

    env: str
    task_id: int
    split: str
    instruction: str
    turns: list[Turn] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    won: bool = False
    score: float = 0.0
    end_reason: str = "done"
    group: int = 0  # the task's index in its rollout batch: group algorithms compare within it
    sample: int = 0  # which of the G samples of that task
    rewards: dict[str, list[float]] = field(default_factory=dict)  # component -> one value per turn
    messages: list[dict[str, Any]] = field(default_factory=list)  # the chat, for people and SFT (role, content,
    # and where a native tool call was made: the reply's tool_calls, the tool message's name)
    error: str | None = None
    demo_messages: int = 0  # messages after the system prompt that are the env's worked example, not this episode
    row_starts: list[int] = field(default_factory=list)  # where token_ids start a new row (chat.history=as_template)
    # what the chat template was rendered with (tools, chat.template_kwargs): SFT on the episode renders the same
    chat_kwargs: dict[str, Any] = field(default_factory=dict)
    # what an RL update computed for it, per token (aligned with token_ids, as logprobs): the advantage and
    # return the estimator gave its row, the critic's values (empty without one); all empty when it trained none
    advantages: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    # what the rollout says of the episode as a whole: in a game of several seats (omrl.rollout.seats) the seat
    # played, who played the others and the outcome ({"seat", "players", "opponent", "outcome", ...}); else {}
    info: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[tuple[int, int]]:
        """[start, end) of each row in ``token_ids``: one row, unless the history mode split the episode.

        A row is a sequence the model was given and extended; a later row starts over with a whole
        prompt (restarting positions), so rows are trained packed, never as one sequence.
        """
        starts = [0, *self.row_starts]
        return list(zip(starts, [*self.row_starts, len(self.token_ids)]))

    def current_row(self) -> list[int]:
        """The ids of the row the next turn extends (what the backend is given)."""
        return self.token_ids[self.row_starts[-1] :] if self.row_starts else self.token_ids

    def position_ids(self) -> list[int]:
        """Each token's position within its row."""
        return [t - start for start, end in self.rows() for t in range(start, end)]

    @property
    def total_reward(self) -> float:
        """The composed reward (``rewards["total"]``) summed over turns, else the env score."""
        if "total" in self.rewards:
            return float(sum(self.rewards["total"]))
        return self.score

    @property
    def num_turns(self) -> int:
        return len(self.turns)


_TURN_TYPE = pa.struct(
    [
        ("observation", pa.string()),
        ("response", pa.string()),
        ("action", pa.string()),
        ("format_ok", pa.bool_()),
        ("reward", pa.float64()),
        ("done", pa.bool_()),
        ("info", pa.string()),
        ("span", pa.list_(pa.int64())),
        ("parse_error", pa.string()),
        ("node_id", pa.int64()),
        ("parent_id", pa.int64()),
    ]
)

SCHEMA = pa.schema(
    [
        ("env", pa.string()),
        ("task_id", pa.int64()),
        ("split", pa.string()),
        ("instruction", pa.string()),
        ("turns", pa.list_(_TURN_TYPE)),
        ("token_ids", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("prompt_length", pa.int64()),
        ("won", pa.bool_()),
        ("score", pa.float64()),
        ("end_reason", pa.string()),
        ("group", pa.int64()),
        ("sample", pa.int64()),
        ("rewards", pa.map_(pa.string(), pa.list_(pa.float64()))),
        (
            "messages",
            pa.list_(
                pa.struct(
                    [
                        ("role", pa.string()),
                        ("content", pa.string()),
                        ("tool_calls", pa.string()),
                        ("name", pa.string()),
                        ("reasoning", pa.string()),
                    ]
                )
            ),
        ),
        ("error", pa.string()),
        ("demo_messages", pa.int64()),
        ("row_starts", pa.list_(pa.int64())),
        ("advantages", pa.list_(pa.float32())),
        ("returns", pa.list_(pa.float32())),
        ("values", pa.list_(pa.float32())),
        ("chat_kwargs", pa.string()),
        ("info", pa.string()),
    ],
    # the newest layout; what each version added, and what older files read instead: omrl.data.layouts
    metadata={b"omrl.schema": READABLE_SCHEMAS[-1]},
)
TRAINED_COLUMNS = ("advantages", "returns", "values")  # per token, written by the trainer


def is_trajectory_schema(schema: pa.Schema) -> bool:
    """True for the schema of a file :func:`write_episodes` wrote (this or an earlier version)."""
    return (schema.metadata or {}).get(b"omrl.schema") in READABLE_SCHEMAS


def to_json(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON (one line unless ``indent``): NaN and infinities become null, lone
    surrogates ``\\u`` escapes.

    Python's json writes NaN and Infinity, which other JSON readers reject, and
    a lone surrogate (from a model's JSON escape) cannot be written as UTF-8.
    """
    text = json.dumps(nonfinite_to_none(value), ensure_ascii=False, allow_nan=False, default=str, indent=indent)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def nonfinite_to_none(value: Any) -> Any:
    """``value`` with every non-finite float, however deep, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: nonfinite_to_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [nonfinite_to_none(item) for item in value]
    return value


def _episode_row(ep: Episode) -> dict[str, Any]:
    row = asdict(ep)
    row["turns"] = [{**t, "info": to_json(t["info"]), "span": list(t["span"])} for t in row["turns"]]
    row["rewards"] = list(ep.rewards.items())
    row["messages"] = [
        {
            "role": m.get("role"),
            "content": m.get("content"),
            "tool_calls": to_json(m["tool_calls"]) if m.get("tool_calls") else None,
            "name": m.get("name"),
            "reasoning": next((m[key] for key in REASONING_FIELDS if isinstance(m.get(key), str)), None),
        }
        for m in ep.messages
    ]
    row["chat_kwargs"] = to_json(ep.chat_kwargs) if ep.chat_kwargs else None
    row["info"] = to_json(ep.info) if ep.info else None
    return row


#: the parquet metadata key under which a trajectory file records the tokenizer of its token ids
TOKENIZER_KEY = b"omrl.tokenizer"
#: ... and the env settings its episodes were played with (``env.name``, ``env.template``)
PLAYED_KEY = b"omrl.played"


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What identifies a tokenizer's ids: its name, vocabulary size and a hash of its whole
    vocabulary (token -> id), computed once per tokenizer object."""
    cached = getattr(tokenizer, "_omrl_fingerprint", None)
    if cached is None:
        vocab = sorted(tokenizer.get_vocab().items())
        digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
        cached = {"name": str(getattr(tokenizer, "name_or_path", "") or ""), "size": len(vocab), "vocab": digest}
        try:
            tokenizer._omrl_fingerprint = cached
        except AttributeError:  # a tokenizer that takes no attributes: computed again next time
            pass
    return cached


def recorded_tokenizer(path: str | os.PathLike) -> dict[str, Any] | None:
    """The tokenizer fingerprint a trajectory file recorded (:func:`tokenizer_fingerprint`), or None
    for a file written without one (by an older omrl, or with no tokenizer at hand)."""
    return _recorded(read_parquet_schema(path), TOKENIZER_KEY)


def recorded_played(path: str | os.PathLike) -> dict[str, Any] | None:
    """The env settings a trajectory file's episodes were played with (``write_episodes(played=)``), or None
    for a file that records none or cannot be read."""
    try:
        return _recorded(read_parquet_schema(path), PLAYED_KEY)
    except OmrlError:
        return None


def _recorded(schema: pa.Schema, key: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads((schema.metadata or {})[key])
    except (KeyError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def check_tokenizer(path: str | os.PathLike, tokenizer: Any, model: str) -> None:
    """Refuse a trajectory file whose token ids another tokenizer made than ``model``'s ``tokenizer``
    (a file that recorded none is let through: the caller's own id checks still run)."""
    recorded = recorded_tokenizer(path)
    if recorded is None or recorded.get("vocab") == tokenizer_fingerprint(tokenizer)["vocab"]:
        return
    mine = tokenizer_fingerprint(tokenizer)
    raise ConfigError(
        f"{path}: its token ids were made by the tokenizer of {recorded.get('name') or 'another model'!r} "
        f"({recorded.get('size')} tokens), not by {model!r}'s ({mine['size']} tokens, another vocabulary); "
        "use a model of that family, or re-encode the chats (text=true where the command has it)"
    )


def write_episodes(
    episodes: Iterable[Episode], path: str | os.PathLike, tokenizer: Any = None, played: dict[str, Any] | None = None
) -> Path:
    """Write episodes to a parquet file atomically; returns the path. ``tokenizer``: the one that made
    their token ids, and ``played``: the env settings they were played with, recorded in the file's
    metadata (:func:`recorded_tokenizer`, :func:`recorded_played`)."""
    rows = [_episode_row(ep) for ep in episodes]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    recorded = {TOKENIZER_KEY: tokenizer_fingerprint(tokenizer) if tokenizer is not None else None, PLAYED_KEY: played}
    metadata = {key: json.dumps(value) for key, value in recorded.items() if value}
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    # row groups of 64 episodes: a reader wanting one episode (omrl view) reads 64, not the whole file
    atomic_write_parquet(table, path, row_group_size=64)
    return Path(path)


@contextmanager
def _parquet_errors(path: str | os.PathLike) -> Iterator[None]:
    """Turn pyarrow's errors about a damaged parquet file into one naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:  # damage inside a column name or the file's metadata
        raise UnreadableFileError(f"{path}: damaged parquet file (text that is not UTF-8)") from exc
    except (pa.ArrowException, OSError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else "truncated, damaged or not a parquet file"
        detail = str(exc).strip().split("\n")[0].split(". ")[0] or type(exc).__name__
        raise UnreadableFileError(f"{path}: {what} ({detail})") from exc


def read_parquet(path: str | os.PathLike) -> pa.Table:
    """The table in a parquet file; a damaged file raises UnreadableFileError."""
    with _parquet_errors(path):
        table = pq.read_table(path)
        table.validate(full=True)  # checks that strings are UTF-8: to_pylist would raise on the first bad one
        return table


def read_parquet_schema(path: str | os.PathLike) -> pa.Schema:
    """The schema of a parquet file, without reading its rows; a damaged file raises UnreadableFileError."""
    with _parquet_errors(path):
        return pq.read_schema(path)


def read_episodes(path: str | os.PathLike) -> list[Episode]:
    """Read episodes written by :func:`write_episodes`."""
    path = Path(path)
    if not path.exists():
        raise OmrlError(f"no trajectory file at {path}")
    table = read_parquet(path)
    if not is_trajectory_schema(table.schema):
        raise OmrlError(
            f"{path} is not an omrl trajectory file (expected schema "
            f"{' or '.join(tag.decode() for tag in READABLE_SCHEMAS)})"
        )
    missing = missing_columns(table.schema)  # never read as defaults: won=False would pass for a loss
    if missing:
        raise OmrlError(f"{path} lacks the column(s) {', '.join(missing)}: it is not a whole omrl trajectory file")
    episodes = []
    for row in table.to_pylist():
        row["turns"] = [
            Turn(
                **{
                    **t,
                    "info": json.loads(t["info"]),
                    "span": tuple(t["span"]),
                    "node_id": _id_or_none(t.get("node_id")),
                    "parent_id": _id_or_none(t.get("parent_id")),
                }
            )
            for t in row["turns"]
        ]
        row["rewards"] = dict(row["rewards"] or [])
        row["row_starts"] = list(row.get("row_starts") or [])
        row.update({key: list(row.get(key) or []) for key in TRAINED_COLUMNS})
        row["messages"] = [_message(m) for m in row.get("messages") or []]
        row["chat_kwargs"] = json.loads(row["chat_kwargs"]) if row.get("chat_kwargs") else {}
        row["info"] = json.loads(row["info"]) if row.get("info") else {}
        episodes.append(Episode(**row))
    return episodes


def _message(stored: dict[str, Any]) -> dict[str, Any]:
    """A chat message as read back: role and content, plus tool_calls, name and reasoning (as
    ``reasoning_content``: SFT moves it to the field the template reads) where it had them."""
    message = {"role": stored["role"], "content": stored["content"]}
    if stored.get("reasoning") is not None:
        message["reasoning_content"] = stored["reasoning"]
    if stored.get("tool_calls"):
        message["tool_calls"] = json.loads(stored["tool_calls"])
    if stored.get("name"):
        message["name"] = stored["name"]
    return message


def _id_or_none(value: int | None) -> int:
    """A turn's node or parent id as read back: -1 where an older file has none."""
    return -1 if value is None else int(value)
