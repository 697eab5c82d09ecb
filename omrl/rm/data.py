"""Reward-model training data: trajectory files -> labelled rows, packed and batched.

A row is one sequence (one example, or several packed with restarting position ids,
as SFT packs; see :mod:`omrl.training.packing`) with the positions its head is
trained at and their targets. Bradley-Terry pairs are never packed: a pair is two
rows that always travel in the same micro-batch.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from omrl.data.trajectory import Episode, check_tokenizer, read_episodes
from omrl.errors import OmrlError
from omrl.rm.labels import Example, check_outcomes, examples, pairs
from omrl.training.packing import pack_bins


@dataclass
class RmRow:
    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # where in the row the head is read
    targets: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def trajectory_files(path: str) -> list[Path]:
    """``path`` itself, or every ``.parquet`` under a directory (in name order)."""
    root = Path(path).expanduser()
    if root.is_dir():
        files = sorted(p for p in root.rglob("*.parquet") if p.is_file())
        if not files:
            raise OmrlError(f"{root} holds no .parquet trajectory files; write some with `omrl rollout`")
        return files
    if not root.exists():
        raise OmrlError(f"no trajectory file or directory at {root}")
    if root.suffix in (".jsonl", ".json"):  # the readable copy omrl rollout writes beside its parquet
        beside = root.with_suffix(".parquet")
        hint = f"; use {beside} beside it" if beside.exists() else ""
        raise OmrlError(
            f"{root} is a JSONL file; reward models train on the trajectory .parquet that omrl rollout writes "
            f"(it holds the token ids and per-turn labels the JSONL lacks){hint}"
        )
    return [root]


class TokenIdError(OmrlError):
    """A trajectory holding a token id that the model's tokenizer does not have."""


def check_token_ids(episodes: Sequence[Episode], source: str | Path, tokenizer: Any) -> None:
    """TokenIdError naming the file, row and id of the first token id outside ``tokenizer``'s vocabulary.

    Such ids (a -1, an id of another model's vocabulary: written by a server that sent them) would
    fail the model's embedding lookup mid-run, or pass as some other token; they are found when the
    data is loaded, before any work."""
    vocab = len(tokenizer)
    for row, ep in enumerate(episodes):
        if not ep.token_ids or 0 <= min(ep.token_ids) and max(ep.token_ids) < vocab:
            continue
        bad = next(t for t in ep.token_ids if not 0 <= t < vocab)
        raise TokenIdError(
            f"{source} row {row} (task {ep.task_id}, {ep.env}) holds the token id {bad}, outside "
            f"the tokenizer's vocabulary (0 to {vocab - 1}): it was played with another model's "
            "tokenizer or written from a server's bad answer; play it again, or drop the row"
        )


def check_trajectory_ids(path: str, tokenizer: Any) -> None:
    """:func:`check_token_ids` on every trajectory file at ``path``."""
    for file in trajectory_files(path):
        check_tokenizer(file, tokenizer, tokenizer.name_or_path)
        check_token_ids(read_episodes(file), file, tokenizer)


def load_examples(
    path: str,
    kind: str,
    label: str,
    max_seq_length: int,
    text_tokenizer: Any = None,
    for_training: bool = True,
    tokenizer: Any = None,
) -> tuple[list[Example], list[Episode], int]:
    """Every labelled example of the trajectory files at ``path``, the episodes, and how many were cut.

    Files are labelled one at a time: tree node ids and task groups are per file.
    ``for_training``: refuse data whose labels are all the same. ``tokenizer``: the model's, whose
    vocabulary the episodes' own ids must be in (:func:`check_token_ids`; not needed with
    ``text_tokenizer``, which re-encodes the chats).
    """
    out, all_episodes, cut = [], [], 0
    for file in trajectory_files(path):
        if tokenizer is not None and text_tokenizer is None:  # the file's own ids are trained on
            check_tokenizer(file, tokenizer, tokenizer.name_or_path)
        episodes = read_episodes(file)
        if tokenizer is not None and text_tokenizer is None:
            check_token_ids(episodes, file, tokenizer)
        found, n_cut = examples(episodes, kind, label, str(file), max_seq_length, text_tokenizer)
        out += found
        all_episodes += episodes
        cut += n_cut
    if for_training:
        check_outcomes(out, label, path, cut, max_seq_length)
    return out, all_episodes, cut


def pointwise_rows(found: Sequence[Example], max_seq_length: int, packing: bool) -> list[RmRow]:
    """One row per example, or examples packed best-fit into rows of at most ``max_seq_length``."""
    rows = [_row([ex]) for ex in found]
    if not packing:
        return rows
    return [_row([found[i] for i in members]) for members in pack_bins([len(r) for r in rows], max_seq_length)]


def pair_rows(
    found: Sequence[Example], max_pairs_per_task: int, source: str, seed: int = 0
) -> list[tuple[RmRow, RmRow]]:
    """(chosen, rejected) rows of every pair; OmrlError when no task has two different outcomes."""
    found_pairs = pairs(found, max_pairs_per_task, seed)
    if not found_pairs:
        raise OmrlError(
            f"{source} has no task with two episodes of different outcomes, so there are no pairs "
            "for objective=bt; play more samples per task (group_size) or use objective=bce"
        )
    return [(_row([p.chosen]), _row([p.rejected])) for p in found_pairs]


def _row(members: Sequence[Example]) -> RmRow:
    row = RmRow()
    for ex in members:
        offset = len(row.input_ids)
        row.input_ids += ex.input_ids
        row.position_ids += list(range(len(ex.input_ids)))
        row.positions += [offset + p for p in ex.positions]
        row.targets += ex.targets
    return row


def collate(rows: Sequence[RmRow], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``position_ids`` [bs, L]; ``row``/``position`` [n] index the labelled
    tokens and ``targets`` [n] holds their labels."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    row_index, positions, targets = [], [], []
    for i, row in enumerate(rows):
        n = len(row)
        input_ids[i, :n] = torch.tensor(row.input_ids)
        last = row.position_ids[-1]
        position_ids[i] = torch.tensor(row.position_ids + list(range(last + 1, last + 1 + width - n)))
        row_index += [i] * len(row.positions)
        positions += row.positions
        targets += row.targets
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "row": torch.tensor(row_index),
        "position": torch.tensor(positions),
        "targets": torch.tensor(targets, dtype=torch.float32),
    }


def fingerprint(rows: Sequence[RmRow]) -> str:
    """A hash of every row's ids, positions and targets: resuming on changed data is refused."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(array("q", [*row.input_ids, -1, *row.positions, -2]).tobytes())
        digest.update(array("d", row.targets).tobytes())
    return digest.hexdigest()[:16]
