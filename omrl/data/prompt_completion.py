"""TRL's prompt-completion records (``{"prompt": ..., "completion": ...}``) as the chat SFT trains on: a
text prompt becomes a user message and a text completion the assistant's reply; lists of messages (TRL's
conversational form) are taken as they are. The chat is then laid out by the model's chat template, as
every SFT row is, and the loss falls on the completion's assistant messages."""

from __future__ import annotations

from typing import Any

from omrl.data.record_files import DatasetFormatError
from omrl.errors import short_repr

KEYS = ("prompt", "completion")


def as_chat_record(row: dict[str, Any], source: str) -> dict[str, Any] | None:
    """``row`` with ``messages`` (its prompt's, then its completion's) in place of its prompt and completion;
    None where it is no prompt-completion record."""
    if not all(row.get(key) is not None for key in KEYS):
        return None
    messages = [
        *_part(row["prompt"], "user", source, "prompt"),
        *_part(row["completion"], "assistant", source, "completion"),
    ]
    return {**{k: v for k, v in row.items() if k not in KEYS}, "messages": messages}


def _part(value: Any, role: str, source: str, key: str) -> list[Any]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, (list, tuple)) and value:
        return list(value)
    raise DatasetFormatError(f"{source}: '{key}' must be text or a non-empty list of messages, got {short_repr(value)}")
