"""Agent conversations for SFT: read them from files, write them for sharing.

Accepted inputs (``load_conversations(path)``):

- a ``.jsonl`` file (one record a line) or a ``.json`` file (a list of records);
- a ``.parquet`` file: records as rows, or an ``omrl rollout`` trajectory file
  (each :class:`omrl.data.Episode`'s ``messages``);
- a directory written by Hugging Face ``datasets``' ``save_to_disk`` (``state.json``
  plus ``data-*.arrow`` stream files; a ``DatasetDict`` directory uses its ``train``
  split), read with pyarrow alone;
- any other directory: every ``.parquet`` and ``.jsonl`` file in it, in name order (less the readable
  ``.jsonl`` an ``omrl rollout`` writes beside each trajectory parquet: the same episodes).

A record holds its messages under ``conversations`` (or ``messages``), in the
OpenManus-RL form ``{"role": "user", "content": "..."}`` or the ShareGPT form
``{"from": "human", "value": "..."}`` (``human``/``gpt``/``system``). A record may
carry a numeric ``reward`` (an ``omrl rollout``'s readable JSONL: ``total_reward``): ``min_reward``
keeps records and episodes whose reward reaches it (rejection-sampling fine-tuning). A row that fits
none of this raises :class:`~omrl.data.record_files.DatasetFormatError` naming the file, the row (counted from 1) and what
was expected. An episode that holds no reply (a seat that never moved, a reset that failed) is
skipped, with a warning that counts them.

The token ids an episode was played in are trained only where it is read from its trajectory file
(:attr:`Conversation.played_rows`); a record written out holds its text alone, so an edited record
trains what it says.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from omrl.chat.replies import REASONING_FIELDS
from omrl.data.prompt_completion import as_chat_record
from omrl.data.record_files import (
    MESSAGE_KEYS,
    DatasetFormatError,
    data_files,
    is_trajectory_file,
    read_rows,
    write_records,
)
from omrl.data.trajectory import Episode, read_episodes, recorded_tokenizer
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
STYLES = ("openmanus", "sharegpt")
_SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
_NOT_IN_SHAREGPT = ("tool_calls", *REASONING_FIELDS, "name", "tool_call_id")  # what a from/value pair cannot hold
REWARD_KEYS = ("reward", "total_reward")  # a record's, else an omrl rollout's readable JSONL's
_EXPECTED = (
    "expected a record with a 'conversations' list of {'role', 'content'} messages (OpenManus-RL) "
    "or {'from', 'value'} messages (ShareGPT; roles human, gpt, system), or a 'prompt' and a 'completion' (TRL)"
)


@dataclass
class Conversation:
    """One chat to learn from, with where it came from (for error messages)."""

    messages: list[dict[str, str]]
    source: str  # e.g. "data/train.jsonl row 12"
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # reward, won, env, task_id ... when known
    # the ids an omrl rollout played it in (ids, loss mask per row) and the hash of the vocabulary they index: set
    # only when read from its trajectory file, never written into a record (a record trains its text)
    played_rows: list[tuple[list[int], list[int]]] = field(default_factory=list)
    played_vocab: str = ""


# -- reading ----------------------------------------------------------------------------------------


def load_conversations(path: str | os.PathLike, min_reward: float = float("-inf")) -> list[Conversation]:
    """Every conversation in ``path`` (a file or a directory) whose reward reaches ``min_reward``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DatasetFormatError(
            f"dataset {str(path)!r} does not exist; expected a .jsonl, .json or .parquet file, or a dataset directory"
        )
    conversations = []
    for file in data_files(path):
        if file.suffix == ".parquet" and is_trajectory_file(file):
            conversations += _from_episodes(file, min_reward)
            continue
        for number, row in read_rows(file):
            conv = record_to_conversation(row, f"{file} row {number}")
            if _keep(conv, min_reward):
                conversations.append(conv)
    _warn_empty_replies(conversations, path)
    return conversations


def _warn_empty_replies(conversations: Sequence[Conversation], path: Path) -> None:
    """Warn of assistant messages with no text, tool call or reasoning: SFT teaches an empty turn there."""
    empty = [
        (conv.source, i)
        for conv in conversations
        for i, m in enumerate(conv.messages)
        if m["role"] == "assistant"
        and not m["content"].strip()
        and not m.get("tool_calls")
        and not any(m.get(key) for key in REASONING_FIELDS)
    ]
    if empty:
        warnings.warn(
            f"{len(empty)} assistant message(s) in {path} hold no text and no tool call (the first: {empty[0][0]}, "
            f"message {empty[0][1]}): training on them teaches the model to end its turn at once; fill or drop them",
            stacklevel=3,
        )


def without_demonstration(messages: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """``messages`` less the ``count`` messages of a worked example that follow the system prompt."""
    return messages[:1] + messages[1 + count :]


def record_to_conversation(row: Any, source: str) -> Conversation:
    """Validate one record and normalise its messages to ``{"role", "content"}``."""
    if not isinstance(row, dict):
        raise DatasetFormatError(f"{source}: is a {type(row).__name__}; {_EXPECTED}")
    given = [k for k in MESSAGE_KEYS if row.get(k) is not None]  # a parquet of both forms: the other is null
    if len(given) > 1:  # one would be trained, the other carried along unread
        raise DatasetFormatError(f"{source}: has both {' and '.join(repr(k) for k in given)}; give the messages once")
    key = given[0] if given else next((k for k in MESSAGE_KEYS if k in row), None)
    if key is None and (chat := as_chat_record(row, source)) is not None:  # TRL's: as the chat it stands for
        row, key = chat, "messages"
    if key is None:
        raise DatasetFormatError(
            f"{source}: has no 'conversations' or 'messages' key (keys: {', '.join(map(str, row))}); {_EXPECTED}"
        )
    raw = row[key]
    if not isinstance(raw, (list, tuple)) or not raw:
        raise DatasetFormatError(f"{source}: '{key}' must be a non-empty list of messages; {_EXPECTED}")
    messages = [_message(m, f"{source} message {i}") for i, m in enumerate(raw)]
    demo = row.get("demo_messages") or 0  # an omrl rollout's JSONL: the env's worked example is not this episode
    if not isinstance(demo, int) or demo < 0 or demo >= len(messages):
        raise DatasetFormatError(f"{source}: 'demo_messages' must be a count of messages after the first, got {demo!r}")
    messages = without_demonstration(messages, demo)
    if messages[0]["role"] not in ("system", "user"):  # a reply needs a prompt to follow
        raise DatasetFormatError(
            f"{source}: message 0 has role {messages[0]['role']!r}; a conversation opens with a system or user message"
        )
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetFormatError(f"{source}: has no assistant ('assistant' or 'gpt') message to learn from")
    meta = {k: v for k, v in row.items() if k not in (key, "id", "demo_messages")}
    _tools_into_chat_kwargs(meta, source)
    if meta.get("reward") is not None and not _is_number(meta["reward"]):  # null: not scored, as with no reward
        raise DatasetFormatError(f"{source}: 'reward' must be a finite number, got {short_repr(meta['reward'])}")
    _check_chat_kwargs(meta.get("chat_kwargs"), source)
    return Conversation(messages, source, str(row.get("id", "")), meta)


def _message(message: Any, where: str) -> dict[str, Any]:
    """``{"role", "content"}``, plus a reply's reasoning (``reasoning_content``, ``thinking`` or ``reasoning``: text) and ``tool_calls`` (a list of
    calls; the content may then be empty or null) when the record has them."""
    # a null field is an absent one: a parquet of both forms gives every message all four fields
    if isinstance(message, dict) and message.get("role") is not None and "content" in message:
        role, content = message["role"], message["content"]
    elif isinstance(message, dict) and message.get("from") is not None and "value" in message:
        role, content = message["from"], message["value"]
    elif isinstance(message, dict) and ({"role", "content"} <= message.keys() or {"from", "value"} <= message.keys()):
        raise DatasetFormatError(
            f"{where}: its role is missing ('role' and 'from' are null or absent) in {short_repr(message)}; "
            f"valid roles: {', '.join(ROLE_ALIASES)}"
        )
    else:
        raise DatasetFormatError(
            f"{where}: {message!r} is not a message; expected {{'role': ..., "
            "'content': ...} or {'from': ..., 'value': ...}"
        )
    if not isinstance(role, str) or role not in ROLE_ALIASES:
        raise DatasetFormatError(f"{where}: unknown role {short_repr(role)}; valid: {', '.join(ROLE_ALIASES)}")
    calls = message.get("tool_calls")
    if calls is not None:
        _check_tool_calls(calls, where)
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
    for key in ("name", "tool_call_id"):  # which call a tool result answers: templates may write either
        if isinstance(message.get(key), str) and out["role"] == "tool":
            out[key] = message[key]
    return out


def _check_tool_calls(calls: Any, where: str) -> None:
    """A list of calls, each ``{"function": {"name", "arguments"}}`` or the bare function (templates read both)."""
    if not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise DatasetFormatError(
            f"{where}: tool_calls must be a list of calls ({{'function': {{'name', "
            f"'arguments'}}}}), got {short_repr(calls)}"
        )
    for number, call in enumerate(calls):
        function = call.get("function", call)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise DatasetFormatError(
                f"{where}: tool call {number} has no function name; expected {{'function': {{'name': ..., "
                "'arguments': ...}}"
            )
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, (dict, str)):
            raise DatasetFormatError(
                f"{where}: tool call {number}'s arguments must be an object or its JSON text, got {short_repr(arguments)}"
            )


def _check_chat_kwargs(kwargs: Any, source: str) -> None:
    """A record's chat template options (an omrl rollout's: the tools it was played with) are keyword arguments."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise DatasetFormatError(
            f"{source}: 'chat_kwargs' must be an object of chat template options (e.g. {{'tools': [...]}}), "
            f"got {short_repr(kwargs)}"
        )
    tools = kwargs.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        raise DatasetFormatError(
            f"{source}: chat_kwargs 'tools' must be a list of tool schemas (objects), got {short_repr(tools)}"
        )


def _tools_into_chat_kwargs(meta: dict[str, Any], source: str) -> None:
    """A record's top-level ``tools`` (OpenAI's fine-tuning format, TRL's datasets; a list of schemas, or its
    JSON text in a parquet column) is what the chat template renders the conversation with: moved into its
    ``chat_kwargs``, where SFT reads it. Left where it was, the replies' calls would be learned without the
    tools ever shown."""
    tools = meta.pop("tools", None)
    if tools is None:
        return
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise DatasetFormatError(
                f"{source}: 'tools' must be a list of tool schemas (or its JSON text), got {short_repr(tools)}"
            ) from None
    kwargs = meta.get("chat_kwargs") or {}
    if isinstance(kwargs, dict) and kwargs.get("tools") not in (None, tools):
        raise DatasetFormatError(f"{source}: 'tools' and chat_kwargs 'tools' differ; give the tools once")
    meta["chat_kwargs"] = {**kwargs, "tools": tools} if isinstance(kwargs, dict) else kwargs


def _is_number(value: Any) -> bool:
    """A finite int or float, not a bool (NaN rewards would pass no threshold and poison every mean)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def reward_of(conv: Conversation) -> float | None:
    """The conversation's reward: its record's ``reward``, else an ``omrl rollout`` readable JSONL's
    ``total_reward``; None where there is none (or null), or it is not a finite number."""
    key = next((key for key in REWARD_KEYS if conv.meta.get(key) is not None), None)
    return float(conv.meta[key]) if key and _is_number(conv.meta[key]) else None


def _keep(conv: Conversation, min_reward: float) -> bool:
    if min_reward == float("-inf"):
        return True
    reward = reward_of(conv)
    if reward is None:
        raise DatasetFormatError(
            f"{conv.source}: min_reward={min_reward} needs a numeric 'reward' in every record (omrl rollout "
            "output, its readable JSONL's 'total_reward' and `omrl data convert` records have one)"
        )
    return reward >= min_reward


def _from_episodes(file: Path, min_reward: float) -> list[Conversation]:
    out = []
    vocab = (recorded_tokenizer(file) or {}).get("vocab")
    episodes = read_episodes(file)
    empty = failed = 0
    for number, episode in enumerate(episodes, 1):
        if episode.end_reason == "env_error":  # the env, a tool or a reward failed: no measure of the model
            failed += 1
            continue
        if not any(
            m.get("role") == "assistant" for m in without_demonstration(episode.messages, episode.demo_messages)
        ):
            empty += 1  # a seat that never moved, an env that failed before the first reply: nothing to learn
            continue
        if episode.total_reward < min_reward:
            continue
        conversation = record_to_conversation(episode_to_record(episode), f"{file} row {number}")
        # the ids it was played in: SFT trains them where the tokenizer is the same (an episode that opened with
        # a worked example is laid out again without it: SFT never learns the example, nor its prompt)
        if vocab and episode.token_ids and not episode.demo_messages:
            conversation.played_rows = [(episode.token_ids[a:b], episode.loss_mask[a:b]) for a, b in episode.rows()]
            conversation.played_vocab = vocab
        out.append(conversation)
    if failed:
        warnings.warn(
            f"{file}: skipped {failed} of {len(episodes)} episodes that ended env_error (the env, a tool, the agent "
            "or a reward failed on them): their reward is no measure of the model, so they are not learned from",
            stacklevel=3,
        )
    if empty:
        warnings.warn(
            f"{file}: skipped {empty} of {len(episodes)} episodes that hold no reply to learn from (a seat that "
            "never moved, or an env that failed before the first reply)",
            stacklevel=3,
        )
    return out


# -- converting and writing -------------------------------------------------------------------------


def episode_to_record(episode: Episode) -> dict[str, Any]:
    """An OpenManus-RL conversation record of one episode, with its reward and outcome (and, for a seat of a
    game, the seat, in its id too: the seats of one game are one task's sample each). A worked example that
    opened the chat is left out: it is not this episode, and SFT must not learn it again."""
    messages = without_demonstration(episode.messages, episode.demo_messages)
    seat = episode.info.get("seat")
    return {
        "id": f"{episode.env}-{episode.split}-{episode.task_id}-{episode.sample}" + (f"-{seat}" if seat else ""),
        "conversations": [
            {
                key: m[key]
                for key in ("role", "content", "tool_calls", "name", "tool_call_id", *REASONING_FIELDS)
                if key in m
            }
            for m in messages
        ],
        "reward": episode.total_reward,
        "won": episode.won,
        "env": episode.env,
        "task_id": episode.task_id,
        **({"seat": seat, "outcome": episode.info.get("outcome")} if seat else {}),
        **({"chat_kwargs": episode.chat_kwargs} if episode.chat_kwargs else {}),
    }


def conversation_to_record(conv: Conversation, style: str = "openmanus") -> dict[str, Any]:
    """A record in ``style`` (openmanus: role/content; sharegpt: from/value)."""
    if style not in STYLES:
        raise OmrlError(f"unknown conversation style {style!r}; valid: {', '.join(STYLES)}")
    if style == "openmanus":
        messages = [dict(m) for m in conv.messages]
    else:
        messages = [{"from": _SHAREGPT_ROLES[m["role"]], "value": m["content"]} for m in _sharegpt_ready(conv)]
    return {"id": conv.id, "conversations": messages, **conv.meta}


def _sharegpt_ready(conv: Conversation) -> list[dict[str, Any]]:
    """The messages, refused where ShareGPT's from/value pairs would drop a tool call, reasoning or a tool's name."""
    for number, message in enumerate(conv.messages):
        lost = next((key for key in _NOT_IN_SHAREGPT if key in message), None)
        if lost:
            named = f" (id {conv.id!r})" if conv.id else ""
            raise DatasetFormatError(
                f"{conv.source}{named}: ShareGPT records cannot carry message {number}'s {lost}; "
                "write the default style (--style openmanus), which keeps it"
            )
    return conv.messages


def write_conversations(
    conversations: Iterable[Conversation], path: str | os.PathLike, style: str = "openmanus"
) -> Path:
    """Write conversations as ``.jsonl`` or ``.parquet`` atomically (temp file, then rename); a parquet
    file reads back as written (:mod:`omrl.data.record_files`)."""
    return write_records([conversation_to_record(c, style) for c in conversations], Path(path))


def reward_summary(conversations: Sequence[Conversation]) -> str:
    """One line about how many conversations there are and their mean reward, when known (and over how
    many of them, when some have none)."""
    rewards = [reward for c in conversations if (reward := reward_of(c)) is not None]
    scored = f" ({len(rewards)} of {len(conversations)} scored)" if len(rewards) < len(conversations) else ""
    mean = f", mean reward {sum(rewards) / len(rewards):.3f}{scored}" if rewards else ""
    return f"{len(conversations)} conversations{mean}"
