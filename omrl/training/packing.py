"""Conversations -> training rows: shifted labels, packing, length-bucketed micro-batches.

Labels are shifted here, per conversation, so a packed row never asks one
conversation's last token to predict the next conversation's first:
``labels[t]`` is the token the model should predict at position t
(``input_ids[t + 1]``) when that token is an assistant token, else -100.

A packed row concatenates conversations and restarts ``position_ids`` at 0 for
each. Passed to a Hugging Face model with ``attention_mask=None`` and
``use_cache=False``, transformers (5.x masking_utils) turns the position resets
into a block-diagonal causal mask for sdpa and eager attention, so attention
stays inside each conversation; the test suite checks that a packed row's
logits equal each conversation's own. Padding goes at the end of a row and
continues the last positions: causal attention means no real token sees it.
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from dataclasses import dataclass
from typing import Sequence

import torch

from omrl.chat import conversation_rows
from omrl.data.conversations import Conversation
from omrl.data.trajectory import tokenizer_fingerprint
from omrl.errors import OmrlError

IGNORE_INDEX = -100


@dataclass
class Row:
    """One training sequence: one conversation, or several packed."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    num_conversations: int = 1

    def __len__(self) -> int:
        return len(self.input_ids)


def shifted_labels(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[int]:
    """``labels[t] = input_ids[t + 1]`` where ``loss_mask[t + 1]`` is 1, else -100 (last is -100).

    >>> shifted_labels([5, 6, 7, 8], [0, 0, 1, 1])
    [-100, 7, 8, -100]
    """
    return [input_ids[t + 1] if loss_mask[t + 1] else IGNORE_INDEX for t in range(len(input_ids) - 1)] + [IGNORE_INDEX]


def tokenize_conversations(
    tokenizer,
    conversations: Sequence[Conversation],
    max_seq_length: int,
    history: str = "keep",
    template_kwargs: dict | None = None,
) -> tuple[list[Row], int, int]:
    """One row per conversation, truncated to ``max_seq_length``; returns (rows, number dropped,
    number truncated).

    A conversation is dropped when truncation leaves it no assistant token to learn from. An episode
    of an omrl rollout file whose tokenizer is this one is its own rows: the ids sampled and the template's
    text between them, as they were played (in whichever history mode). Other ids come from
    :func:`omrl.chat.conversation_rows`: the layout the rollout generates in, one row
    per conversation unless the ``as_template`` history splits it (each split row is a row here).
    Text that cannot reach the first ``max_seq_length`` tokens is cut before tokenizing, so a
    megabytes-long message costs no more than one that just fills the row.
    """
    if max_seq_length < 2:
        raise OmrlError(f"max_seq_length must be at least 2, got {max_seq_length}")
    # no token spans more characters than the longest vocabulary entry (byte-level or sentencepiece)
    longest_token = max((len(token) for token in tokenizer.get_vocab()), default=1)
    budget = max_seq_length * longest_token + 1024  # the margin keeps the tokens at the cut unchanged
    rows, dropped, truncated = [], 0, 0
    vocab = tokenizer_fingerprint(tokenizer)["vocab"] if any(c.played_rows for c in conversations) else None
    for conv in conversations:
        if conv.played_rows and conv.played_vocab == vocab:
            split = conv.played_rows  # a rollout's episode, by this tokenizer: the very ids it was played in
        else:
            messages = _cut_text(conv.messages, budget)
            if not any(m["role"] == "assistant" for m in messages):  # cut before the first reply
                dropped += 1
                continue
            try:
                # a rollout's episode is rendered as it was played (its tools, its template options)
                kwargs = {**(template_kwargs or {}), **(conv.meta.get("chat_kwargs") or {})}
                split = conversation_rows(tokenizer, messages, history, **kwargs)
            except OmrlError as exc:
                raise OmrlError(f"{conv.source}: {exc}") from exc
        kept = 0
        for ids, mask in split:
            labels = shifted_labels(ids, mask)[:max_seq_length]
            if all(label == IGNORE_INDEX for label in labels):
                continue  # no reply within the cut: dropped, not counted as cut too
            truncated += len(ids) > max_seq_length
            ids = ids[:max_seq_length]
            rows.append(Row(ids, labels, list(range(len(ids)))))
            kept += 1
        dropped += not kept
    return rows, dropped, truncated


def _cut_text(messages: Sequence[dict], budget: int) -> list[dict]:
    """The messages with at most ``budget`` characters of content in all (later text cut off)."""
    out = []
    for message in messages:
        if budget <= 0:
            break
        content = message.get("content") or ""
        out.append({**message, "content": content[:budget]} if len(content) > budget else message)
        budget -= len(content)
    return out


def pack_rows(rows: Sequence[Row], max_seq_length: int) -> list[Row]:
    """Pack rows into as few rows of at most ``max_seq_length`` tokens as best-fit decreasing finds."""
    return [_concat([rows[i] for i in members]) for members in pack_bins([len(r) for r in rows], max_seq_length)]


def pack_bins(lengths: Sequence[int], max_seq_length: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of at most ``max_seq_length`` tokens, best-fit decreasing.

    Deterministic: ties are broken by the order given.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, bin index), sorted
    for i in order:
        need = lengths[i]
        if need > max_seq_length:
            raise OmrlError(f"a row of {need} tokens does not fit max_seq_length={max_seq_length}")
        at = bisect.bisect_left(free, (need, -1))
        if at < len(free):
            room, b = free.pop(at)
        else:
            room, b = max_seq_length, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(free, (room - need, b))
    return bins


def _concat(rows: Sequence[Row]) -> Row:
    out = Row([], [], [], len(rows))
    for row in rows:
        out.input_ids += row.input_ids
        out.labels += row.labels
        out.position_ids += row.position_ids
    return out


def micro_batches(rows: Sequence[Row], size: int) -> list[list[int]]:
    """Row indices grouped ``size`` at a time among rows of similar length (little padding)."""
    if size < 1:
        raise OmrlError(f"optim.micro_batch_size must be >= 1, got {size}")
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
    return [order[i : i + size] for i in range(0, len(order), size)]


def collate(rows: Sequence[Row], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``labels`` and ``position_ids`` tensors [bs, longest row]."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row)
        input_ids[i, :n] = torch.tensor(row.input_ids)
        labels[i, :n] = torch.tensor(row.labels)
        last = row.position_ids[-1]
        position_ids[i] = torch.tensor(row.position_ids + list(range(last + 1, last + 1 + width - n)))
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


def fingerprint(rows: Sequence[Row]) -> str:
    """A hash of every row's ids and labels: resuming on changed data is refused."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(array("q", [*row.input_ids, -1, *row.labels, -2]).tobytes())
    return digest.hexdigest()[:16]
