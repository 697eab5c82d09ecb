"""Agent conversations for SFT: read them from files, write them for sharing.

Accepted inputs (``load_conversations(path)``):

- a ``.jsonl`` file (one record a line) or a ``.json`` file (a list of records);
- a ``.parquet`` file: records as rows, or an ``omrl rollout`` trajectory file
  (each :class:`omrl.data.Episode`'s ``messages``);
- a directory written by Hugging Face ``datasets``' ``save_to_disk`` (``state.json``
  plus ``data-*.arrow`` stream files; a ``DatasetDict`` directory uses its ``train``
  split), read with pyarrow alone;
- any other directory: every ``.parquet`` and ``.jsonl`` file in it, in name order.

A record holds its messages under ``conversations`` (or ``messages``), in the
OpenManus-RL form ``{"role": "user", "content": "..."}`` or the ShareGPT form
``{"from": "human", "value": "..."}`` (``human``/``gpt``/``system``). A record may
carry a numeric ``reward``: ``min_reward`` keeps records and episodes whose reward
reaches it (rejection-sampling fine-tuning). A row that fits none of this raises
:class:`DatasetFormatError` naming the file, the row (counted from 1) and what
was expected.
"""

from __future__ import annotations

import codecs
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa

from omrl.atomic import atomic_write_parquet, atomic_write_text
from omrl.chat.replies import REASONING_FIELDS
from omrl.data.trajectory import (
    Episode,
    is_trajectory_schema,
    read_episodes,
    read_parquet,
    read_parquet_schema,
    recorded_tokenizer,
    to_json,
)
from omrl.errors import OmrlError, short_repr

# Role names as they appear in files -> the chat-template role.
ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
}
MESSAGE_KEYS = ("conversations", "messages")
STYLES = ("openmanus", "sharegpt")
_SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
_EXPECTED = (
    "expected a record with a 'conversations' list of {'role', 'content'} messages (OpenManus-RL) "
    "or {'from', 'value'} messages (ShareGPT; roles human, gpt, system)"
)


class DatasetFormatError(OmrlError):
    """A dataset file or row that is not in a supported format."""


@dataclass
class Conversation:
    """One chat to learn from, with where it came from (for error messages)."""

    messages: list[dict[str, str]]
    source: str  # e.g. "data/train.jsonl row 12"
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # reward, won, env, task_id ... when known


# -- reading ----------------------------------------------------------------------------------------


def load_conversations(path: str | os.PathLike, min_reward: float = float("-inf")) -> list[Conversation]:
    """Every conversation in ``path`` (a file or a directory) whose reward reaches ``min_reward``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DatasetFormatError(
            f"dataset {str(path)!r} does not exist; expected a .jsonl, .json or .parquet file, or a dataset directory"
        )
    conversations = []
    for file in _data_files(path):
        if file.suffix == ".parquet" and _is_trajectory_file(file):
            conversations += _from_episodes(file, min_reward)
            continue
        for number, row in _rows(file):
            conv = record_to_conversation(row, f"{file} row {number}")
            if _keep(conv, min_reward):
                conversations.append(conv)
    return conversations


def without_demonstration(messages: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """``messages`` less the ``count`` messages of a worked example that follow the system prompt."""
    return messages[:1] + messages[1 + count :]


def record_to_conversation(row: Any, source: str) -> Conversation:
    """Validate one record and normalise its messages to ``{"role", "content"}``."""
    if not isinstance(row, dict):
        raise DatasetFormatError(f"{source}: is a {type(row).__name__}; {_EXPECTED}")
    key = next((k for k in MESSAGE_KEYS if k in row), None)
    if key is None:
        raise DatasetFormatError(
            f"{source}: has no 'conversations' key (keys: {', '.join(map(str, row))}); {_EXPECTED}"
        )
    raw = row[key]
    if not isinstance(raw, (list, tuple)) or not raw:
        raise DatasetFormatError(f"{source}: '{key}' must be a non-empty list of messages; {_EXPECTED}")
    messages = [_message(m, f"{source} message {i}") for i, m in enumerate(raw)]
    demo = row.get("demo_messages") or 0  # an omrl rollout's JSONL: the env's worked example is not this episode
    if not isinstance(demo, int) or demo < 0 or demo >= len(messages):
        raise DatasetFormatError(f"{source}: 'demo_messages' must be a count of messages after the first, got {demo!r}")
    messages = without_demonstration(messages, demo)
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetFormatError(f"{source}: has no assistant ('assistant' or 'gpt') message to learn from")
    meta = {k: v for k, v in row.items() if k not in (key, "id", "demo_messages")}
    if "reward" in meta and not _is_number(meta["reward"]):
        raise DatasetFormatError(f"{source}: 'reward' must be a finite number, got {short_repr(meta['reward'])}")
    return Conversation(messages, source, str(row.get("id", "")), meta)


def _message(message: Any, where: str) -> dict[str, Any]:
    """``{"role", "content"}``, plus a reply's reasoning (``reasoning_content``, ``thinking`` or ``reasoning``: text) and ``tool_calls`` (a list of
    calls; the content may then be empty or null) when the record has them."""
    if isinstance(message, dict) and "role" in message and "content" in message:
        role, content = message["role"], message["content"]
    elif isinstance(message, dict) and "from" in message and "value" in message:
        role, content = message["from"], message["value"]
    else:
        raise DatasetFormatError(
            f"{where}: {message!r} is not a message; expected {{'role': ..., "
            "'content': ...}} or {'from': ..., 'value': ...}"
        )
    if role not in ROLE_ALIASES:
        raise DatasetFormatError(f"{where}: unknown role {role!r}; valid: {', '.join(ROLE_ALIASES)}")
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise DatasetFormatError(
            f"{where}: tool_calls must be a list of calls ({{'function': {{'name', "
            f"'arguments'}}}}), got {short_repr(calls)}"
        )
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise DatasetFormatError(f"{where}: content must be text, got {type(content).__name__}")
    out: dict[str, Any] = {"role": ROLE_ALIASES[role], "content": content}
    for key in REASONING_FIELDS:  # a chat template reads one of them: SFT moves it to that one
        reasoning = message.get(key)
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise DatasetFormatError(f"{where}: {key} must be text, got {type(reasoning).__name__}")
            out[key] = reasoning
    if calls:
        out["tool_calls"] = calls
    if isinstance(message.get("name"), str) and out["role"] == "tool":
        out["name"] = message["name"]
    return out


def _is_number(value: Any) -> bool:
    """A finite int or float, not a bool (NaN rewards would pass no threshold and poison every mean)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _keep(conv: Conversation, min_reward: float) -> bool:
    if min_reward == float("-inf"):
        return True
    if "reward" not in conv.meta:
        raise DatasetFormatError(
            f"{conv.source}: min_reward={min_reward} needs a numeric 'reward' in "
            "every record (omrl rollout output and `omrl data convert` records have one)"
        )
    return float(conv.meta["reward"]) >= min_reward


def _data_files(path: Path) -> list[Path]:
    """The files a path stands for, in a stable order."""
    if path.is_file():
        if path.suffix not in (".jsonl", ".json", ".parquet", ".arrow"):
            raise DatasetFormatError(
                f"{path}: unsupported file type {path.suffix!r}; expected .jsonl, .json, .parquet or .arrow"
            )
        return [path]
    if (path / "dataset_dict.json").exists():
        splits = _json_object(path / "dataset_dict.json").get("splits", [])
        if not isinstance(splits, list) or not all(isinstance(split, str) for split in splits):
            raise DatasetFormatError(f"{path / 'dataset_dict.json'}: 'splits' must be a list of names")
        if "train" not in splits:
            raise DatasetFormatError(
                f"{path}: a DatasetDict without a 'train' split (splits: "
                f"{', '.join(splits)}); pass the split's directory, e.g. {path / splits[0]}"
                if splits
                else f"{path}: dataset_dict.json lists no splits"
            )
        return _data_files(path / "train")
    if (path / "state.json").exists():
        listed = _json_object(path / "state.json").get("_data_files", [])
        if not isinstance(listed, list) or not all(
            isinstance(f, dict) and isinstance(f.get("filename"), str) for f in listed
        ):
            raise DatasetFormatError(f"{path / 'state.json'}: '_data_files' must be a list of {{'filename': ...}}")
        files = [path / f["filename"] for f in listed]
        missing = [str(f) for f in files if not f.exists()]
        if missing or not files:
            raise DatasetFormatError(
                f"{path}: state.json lists missing arrow files {missing}"
                if missing
                else f"{path}: state.json lists no data files"
            )
        return files
    files = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".jsonl") and p.is_file())
    if not files:
        raise DatasetFormatError(
            f"{path}: no .parquet or .jsonl files, and not a save_to_disk directory (no state.json)"
        )
    return files


def _rows(file: Path) -> Iterator[tuple[int, Any]]:
    """(row number from 1, record) for every record in one file."""
    if file.suffix == ".jsonl" or (file.suffix == ".json" and _starts_with(file, b"{")):
        for number, line in _lines(file):
            if line.strip():
                yield number, _json(line, f"{file} row {number}")
    elif file.suffix == ".json":
        text = _decode(file.read_bytes(), file)
        if not text.strip():
            raise DatasetFormatError(f"{file}: the file is empty; expected a list of records (or JSON lines)")
        data = _json(text, str(file))
        if not isinstance(data, list):
            raise DatasetFormatError(f"{file}: a .json dataset must be a list of records (or JSON lines)")
        yield from enumerate(data, 1)
    else:
        table = read_parquet(file) if file.suffix == ".parquet" else _read_arrow(file)
        number = 0
        for batch in table.to_batches():
            for row in batch.to_pylist():
                number += 1
                yield number, row


def _starts_with(file: Path, prefix: bytes) -> bool:
    with file.open("rb") as f:
        return f.read(64).removeprefix(codecs.BOM_UTF8).lstrip().startswith(prefix)


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) for every line of a UTF-8 file, read as bytes to name the byte that is not UTF-8."""
    offset = 0
    with file.open("rb") as f:
        for number, raw in enumerate(f, 1):
            yield number, _decode(raw, file, offset, number)
            offset += len(raw)


def _decode(raw: bytes, file: Path, offset: int = 0, line: int = 1) -> str:
    """``raw`` (which starts at byte ``offset`` of ``file``) as UTF-8 text, less a byte-order mark at the start."""
    try:
        return raw.decode("utf-8-sig" if offset == 0 else "utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(
            f"{file}: not UTF-8 at byte {offset + exc.start} (line {line}: "
            f"0x{raw[exc.start : exc.start + 1].hex()}); save it as UTF-8"
        ) from exc


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:
        raise DatasetFormatError(f"{where}: JSON nested too deeply to read") from exc
    except ValueError as exc:  # int() refusing a number of thousands of digits
        raise DatasetFormatError(f"{where}: unreadable JSON ({str(exc).split(';')[0]})") from exc


def _json_object(file: Path) -> dict[str, Any]:
    """A JSON file that must hold an object (save_to_disk's state.json and dataset_dict.json)."""
    data = _json(_decode(file.read_bytes(), file), str(file))
    if not isinstance(data, dict):
        raise DatasetFormatError(f"{file}: must hold a JSON object, got a {type(data).__name__}")
    return data


def _read_arrow(file: Path) -> pa.Table:
    """An arrow file as ``save_to_disk`` writes it (IPC stream), or the IPC file format."""
    try:
        try:
            with pa.memory_map(str(file)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError):
            with pa.memory_map(str(file)) as source:
                table = pa.ipc.open_file(source).read_all()
        table.validate(full=True)  # checks that strings are UTF-8: to_pylist would raise on the first bad one
        return table
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise DatasetFormatError(
            f"{file}: truncated, damaged or not an Arrow IPC stream or file "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from exc


def _is_trajectory_file(file: Path) -> bool:
    return is_trajectory_schema(read_parquet_schema(file))


def _from_episodes(file: Path, min_reward: float) -> list[Conversation]:
    out = []
    vocab = (recorded_tokenizer(file) or {}).get("vocab")
    for number, episode in enumerate(read_episodes(file), 1):
        if episode.total_reward < min_reward:
            continue
        source = f"{file} row {number}"
        if not episode.messages:
            raise DatasetFormatError(f"{source}: episode has no messages (written by an old omrl rollout?)")
        conversation = record_to_conversation(episode_to_record(episode), source)
        # the ids it was played in: SFT trains them where the tokenizer is the same (an episode that opened with
        # a worked example is laid out again without it: SFT never learns the example, nor its prompt)
        if vocab and episode.token_ids and not episode.demo_messages:
            conversation.meta["rows"] = [(episode.token_ids[a:b], episode.loss_mask[a:b]) for a, b in episode.rows()]
            conversation.meta["vocab"] = vocab
        out.append(conversation)
    return out


# -- converting and writing -------------------------------------------------------------------------


def episode_to_record(episode: Episode) -> dict[str, Any]:
    """An OpenManus-RL conversation record of one episode, with its reward and outcome. A worked
    example that opened the chat is left out: it is not this episode, and SFT must not learn it again."""
    messages = without_demonstration(episode.messages, episode.demo_messages)
    return {
        "id": f"{episode.env}-{episode.split}-{episode.task_id}-{episode.sample}",
        "conversations": [
            {key: m[key] for key in ("role", "content", "tool_calls", "name", *REASONING_FIELDS) if key in m}
            for m in messages
        ],
        "reward": episode.total_reward,
        "won": episode.won,
        "env": episode.env,
        "task_id": episode.task_id,
        **({"chat_kwargs": episode.chat_kwargs} if episode.chat_kwargs else {}),
    }


def conversation_to_record(conv: Conversation, style: str = "openmanus") -> dict[str, Any]:
    """A record in ``style`` (openmanus: role/content; sharegpt: from/value)."""
    if style not in STYLES:
        raise OmrlError(f"unknown conversation style {style!r}; valid: {', '.join(STYLES)}")
    if style == "openmanus":
        messages = [dict(m) for m in conv.messages]
    else:
        messages = [{"from": _SHAREGPT_ROLES[m["role"]], "value": m["content"]} for m in conv.messages]
    return {"id": conv.id, "conversations": messages, **conv.meta}


def write_conversations(
    conversations: Iterable[Conversation], path: str | os.PathLike, style: str = "openmanus"
) -> Path:
    """Write conversations as ``.jsonl`` or ``.parquet`` atomically (temp file, then rename)."""
    path = Path(path)
    records = [conversation_to_record(c, style) for c in conversations]
    if path.suffix == ".parquet":
        try:
            table = pa.Table.from_pylist(records)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise OmrlError(
                f"cannot write {path}: the records' fields differ in type ({exc}); write .jsonl instead"
            ) from exc
        atomic_write_parquet(table, path)
    elif path.suffix == ".jsonl":
        atomic_write_text(path, "".join(to_json(r) + "\n" for r in records))
    else:
        raise OmrlError(f"cannot write {path}: unsupported output type {path.suffix!r}; use .jsonl or .parquet")
    return path


def reward_summary(conversations: Sequence[Conversation]) -> str:
    """One line about how many conversations there are and their mean reward, when known."""
    rewards = [float(c.meta["reward"]) for c in conversations if _is_number(c.meta.get("reward"))]
    mean = f", mean reward {sum(rewards) / len(rewards):.3f}" if rewards else ""
    return f"{len(conversations)} conversations{mean}"
