"""Episodes from the three kinds of files: trajectory parquet, readable JSONL records, eval reports.

Each reader gives a summary per episode at once (what the episode list shows and filters on)
and the full row of one episode on demand, as the dict ``pyarrow`` gives for a trajectory
parquet row, so the page code has one shape to deal with. Summaries of a parquet file are
read from a few columns (a list's length and sum with numpy), never from the token arrays
as Python lists: that is what keeps a 10,000-episode run quick to open.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from omrl.view.games import seat_fields
from omrl.view.groups import is_step_rollout, trained_mean
from omrl.view.sources import Problem

# Columns a summary needs, when the file has them (older schema versions lack some).
_SCALARS = ("env", "task_id", "split", "won", "score", "end_reason", "group", "sample", "error", "info")


class Unreadable(Exception):
    """One episode of a file could not be read; the message names what is wrong."""


class ParquetEpisodes:
    """A trajectory parquet: summaries from a few columns, one row group in memory at a time."""

    def __init__(self, path: Path, label: str):
        import pyarrow.parquet as pq

        self.path, self.label, self.problems = path, label, []
        self._file = pq.ParquetFile(path)
        self._starts = []  # the first row of each row group
        start = 0
        for index in range(self._file.metadata.num_row_groups):
            self._starts.append(start)
            start += self._file.metadata.row_group(index).num_rows
        self._cache: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.summaries = self._read_summaries()
        self.step_rollout = is_step_rollout(path)  # trained on, its advantages recorded or not
        # a step rollout with the column recorded the update's, none where no episode was trained on
        recorded = self.step_rollout and "advantages" in self._file.schema_arrow.names
        self.has_advantages = recorded or any(summary["advantage"] is not None for summary in self.summaries)

    def _read_summaries(self) -> list[dict[str, Any]]:
        import pyarrow.compute as pc

        schema = self._file.schema_arrow
        names = set(schema.names)
        turn_fields = {f.name for f in schema.field("turns").type.value_type} if "turns" in names else set()
        columns = [c for c in (*_SCALARS, "rewards", "loss_mask", "advantages") if c in names]
        columns += [f"turns.list.element.{f}" for f in ("reward", "node_id") if f in turn_fields]
        table = self._readable_groups(columns)
        if table is None:
            return []
        rows = table.select([c for c in _SCALARS if c in names]).to_pylist()
        tokens, generated = _lengths_and_sums(table.column("loss_mask")) if "loss_mask" in names else ([], [])
        turns = table.column("turns") if "turns" in table.column_names else None
        turn_counts = pc.list_value_length(turns).fill_null(0).to_pylist() if turns is not None else []
        in_tree = [0] * len(rows)
        if "node_id" in turn_fields:
            node_ids = pc.struct_field(pc.list_flatten(turns), "node_id")
            _, in_tree = _lengths_and_sums(turns, pc.greater_equal(node_ids.fill_null(-1), 0))
        totals = [_total(r) for r in table.column("rewards").to_pylist()] if "rewards" in names else []
        recorded = "advantages" in names and "loss_mask" in names  # episode/5 on: what the trainer computed
        advantages = _trained_means(table.column("advantages"), table.column("loss_mask")) if recorded else []
        summaries = []
        for i, row in enumerate(rows):
            score = _number(row.get("score"))
            total = totals[i] if totals and totals[i] is not None else score
            summaries.append(
                {
                    **_where_played(row),
                    "reward": total,
                    "score": score,
                    "end": row.get("end_reason") or "",
                    "turns": turn_counts[i] if turn_counts else 0,
                    "tokens": tokens[i] if tokens else 0,
                    "generated": generated[i] if generated else 0,
                    "error": row.get("error"),
                    "tree": bool(in_tree[i]) if len(in_tree) else False,
                    "advantage": advantages[i] if advantages else None,
                    **seat_fields(row.get("info")),  # a seat of a game: its seat, player, outcome, game
                }
            )
        return summaries

    def _readable_groups(self, columns: list[str]) -> Any:
        """``columns`` of every row group that can be read, as one table (None: not one can); a damaged
        group costs its own episodes, named in a problem, not the file's."""
        import pyarrow as pa

        tables, self._rows = [], []  # _rows: the file row of each summary
        for group, start in enumerate(self._starts):
            count = self._file.metadata.row_group(group).num_rows
            try:
                tables.append(self._file.read_row_group(group, columns=columns))
            except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
                self.problems.append(
                    Problem(
                        self.label,
                        f"rows {start}..{start + count - 1} (row group {group}) cannot be read "
                        f"({_first_line(exc)}); their episodes are not shown",
                    )
                )
                continue
            self._rows.extend(range(start, start + count))
        return pa.concat_tables(tables) if tables else None

    def row(self, index: int) -> dict[str, Any]:
        """Episode ``index`` of the file (the ``index``-th summary) as a dict (its row group is read once
        and kept)."""
        import pyarrow as pa

        index = self._rows[index]
        group = max(g for g, start in enumerate(self._starts) if start <= index)
        try:
            with self._lock:  # two requests for one row group read it once
                table = self._cache.get(group)
                if table is None:
                    table = self._file.read_row_group(group)
                    self._cache = {group: table}  # one row group in memory: a file's can be hundreds of MB
            return table.slice(index - self._starts[group], 1).to_pylist()[0]
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise Unreadable(f"{self.label}: row {index} cannot be read ({_first_line(exc)})") from exc


class RecordEpisodes:
    """Readable JSONL records (``omrl rollout``'s .jsonl): turns and chat, but no token ids."""

    def __init__(self, path: Path, label: str):
        self.path, self.label, self.problems = path, label, []
        self.has_advantages = self.step_rollout = False
        self._offsets: list[int] = []
        self.summaries = []
        with path.open("rb") as f:
            lines = f.read().split(b"\n")
        offset = 0
        for number, line in enumerate(lines, start=1):
            start, offset = offset, offset + len(line) + 1
            if not line.strip():
                continue
            record = self._parse(line, number, last=number == len(lines))
            if record is not None:
                self._offsets.append(start)
                self.summaries.append(_record_summary(record))

    def _parse(self, line: bytes, number: int, last: bool) -> dict[str, Any] | None:
        try:
            record = json.loads(line)
        except ValueError:
            why = "the last line is half-written" if last else f"line {number} is not JSON"
            self.problems.append(Problem(self.label, f"{why}; skipped", level="warning"))
            return None
        if not isinstance(record, dict) or "turns" not in record:
            self.problems.append(
                Problem(self.label, f"line {number} is not an episode record; skipped", level="warning")
            )
            return None
        return record

    def row(self, index: int) -> dict[str, Any]:
        with self.path.open("rb") as f:
            f.seek(self._offsets[index])
            record = json.loads(f.readline())
        return _record_row(record)


class ReportEpisodes:
    """The per-episode summary lines of an eval report (it holds no turns or tokens)."""

    def __init__(self, report: dict[str, Any], label: str):
        self.label, self.problems = label, []
        self.has_advantages = self.step_rollout = False
        env = str(((report.get("config") or {}).get("env") or {}).get("name", ""))
        split = str(((report.get("config") or {}).get("env") or {}).get("split", ""))
        episodes = report.get("episodes") if isinstance(report.get("episodes"), list) else []
        # a group is one task's samples; in a mixture's report, task ids of different envs may be equal
        pairs: dict[tuple[str, Any], int] = {}
        mixed = any(isinstance(ep, dict) and ep.get("env") for ep in episodes)
        self.summaries = [
            {
                "env": str(ep.get("env") or env),  # a mixture's report names each episode's env
                "split": split,
                "task": ep.get("task_id"),
                "group": (
                    pairs.setdefault((str(ep.get("env")), ep.get("task_id")), len(pairs))
                    if mixed
                    else ep.get("task_id") or 0
                ),
                "sample": ep.get("sample") or 0,
                "won": bool(ep.get("won")),
                "reward": _number(ep.get("reward")),
                "score": _number(ep.get("score")),
                "end": ep.get("end_reason") or "",
                "turns": ep.get("turns") or 0,
                "tokens": None,  # unknown: a report counts no tokens
                "generated": None,
                "error": ep.get("error"),
                "tree": False,
                "advantage": None,
            }
            for ep in episodes
            if isinstance(ep, dict)
        ]

    def row(self, index: int) -> dict[str, Any]:
        raise Unreadable(
            f"{self.label}: an eval report keeps one summary line per episode, not its turns or tokens "
            "(omrl eval writes them whole beside it, in episodes.parquet or <report name>.episodes.parquet: open that "
            "file or its folder)"
        )


def _lengths_and_sums(lists: Any, values: Any = None) -> tuple[list[int], list[int]]:
    """Per row of a list column: its length, and the sum of its values (or of ``values``, aligned
    with the flattened lists). numpy's reduceat over the list offsets: no Python loop over tokens,
    and no token-long intermediate array beyond the values themselves."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    array = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    if isinstance(array, pa.ChunkedArray):  # a column with no chunks at all
        return [], []
    offsets = np.asarray(array.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    flat = pc.list_flatten(array) if values is None else values
    flat = flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat
    numbers = (pc.fill_null(flat, 0) if flat.null_count else flat).to_numpy(zero_copy_only=False)
    sums = np.zeros(len(lengths), dtype=np.int64)
    filled = lengths > 0
    if filled.any():  # each non-empty row sums from its start to the next non-empty row's start
        starts = (offsets[:-1] - offsets[0])[filled]
        sums[filled] = np.add.reduceat(numbers, starts, dtype=np.int64)
    return lengths.tolist(), sums.tolist()


def _trained_means(advantages: Any, loss_mask: Any) -> list[float | None]:
    """Per row, its recorded advantages' mean over its trained tokens (:func:`~omrl.view.groups.trained_mean`), read
    from the flattened lists one numpy slice a row: no token arrays as Python lists."""
    adv_offsets, adv_values = _flat(advantages)
    mask_offsets, mask_values = _flat(loss_mask)
    return [
        trained_mean(
            adv_values[adv_offsets[i] : adv_offsets[i + 1]], mask_values[mask_offsets[i] : mask_offsets[i + 1]]
        )
        for i in range(len(adv_offsets) - 1)
    ]


def _flat(lists: Any) -> tuple[Any, Any]:
    """(offsets from 0, values) of a list column, as numpy arrays (nulls read as 0)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    array = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    if isinstance(array, pa.ChunkedArray):  # a column with no chunks at all
        return np.zeros(1, dtype=np.int64), np.zeros(0)
    offsets = np.asarray(array.offsets, dtype=np.int64)
    flat = pc.list_flatten(array)
    flat = flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat
    values = (pc.fill_null(flat, 0) if flat.null_count else flat).to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values


def _total(rewards: list[tuple[str, list[float]]] | None) -> float | None:
    """The composed reward of an episode: its "total" component summed over turns."""
    for name, values in rewards or []:
        if name == "total":
            return float(sum(v for v in values or [] if v is not None))
    return None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _where_played(row: dict[str, Any]) -> dict[str, Any]:
    """A summary's first fields, alike for a parquet row and a JSONL record: env, split, task,
    group, sample and whether it was won."""
    return {
        "env": row.get("env") or "",
        "split": row.get("split") or "",
        "task": row.get("task_id"),
        "group": row.get("group") or 0,
        "sample": row.get("sample") or 0,
        "won": bool(row.get("won")),
    }


def _record_summary(record: dict[str, Any]) -> dict[str, Any]:
    return {
        **_where_played(record),
        "reward": _number(record.get("total_reward", record.get("score"))),
        "score": _number(record.get("score")),
        "end": record.get("end_reason") or "",
        "turns": record.get("num_turns") or len(record.get("turns") or []),
        "tokens": record.get("tokens") or 0,
        "generated": record.get("generated_tokens") or 0,
        "error": record.get("error"),
        "tree": False,
        "advantage": None,
        **seat_fields(record.get("info")),
    }


def _record_row(record: dict[str, Any]) -> dict[str, Any]:
    """A readable record in a parquet row's shape: each turn's observation and response come
    from the chat (system prompt and worked example left out), token arrays are empty."""
    messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    chat = messages
    if messages and messages[0].get("role") == "system":
        chat = messages[1 + int(record.get("demo_messages") or 0) :]
    users = [m.get("content", "") for m in chat if m.get("role") == "user"]
    replies = [m.get("content", "") for m in chat if m.get("role") == "assistant"]
    turns = []
    for i, turn in enumerate(record.get("turns") or []):
        turns.append(
            {
                **turn,
                "observation": users[i] if i < len(users) else "",
                "response": replies[i] if i < len(replies) else "",
                "info": "{}",
                "span": [0, 0],
            }
        )
    return {
        **record,
        "turns": turns,
        "rewards": list((record.get("rewards") or {}).items()),
        "token_ids": [],
        "loss_mask": [],
        "logprobs": [],
        "end_reason": record.get("end_reason"),
    }


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().split("\n")[0][:200]) or type(exc).__name__
