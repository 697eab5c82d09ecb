"""Conversation record files: which files a dataset path stands for, the records in each, and the
``.jsonl`` and ``.parquet`` files :func:`write_records` writes.

A parquet file of records written here keeps each record's free-form fields as JSON text, as a
trajectory file does (:mod:`omrl.data.trajectory`): each message's ``tool_calls``, and under ``meta``
every field beside ``id`` and the messages (``reward``, ``chat_kwargs``...). A table's columns would
otherwise give each record the keys of all the others, as nulls: tools' schemas and tool-call
arguments would change, and a ``reward`` some records lack would read back as null. The file's
metadata marks it (``omrl.schema``: ``conversations/1``), so it reads back exactly as written.
"""

from __future__ import annotations

import codecs
import json
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from omrl.atomic import atomic_write_parquet, atomic_write_text
from omrl.data.trajectory import is_trajectory_schema, read_parquet, read_parquet_schema, to_json
from omrl.errors import OmrlError

RECORDS_SCHEMA = b"conversations/1"
_SCHEMA_KEY = b"omrl.schema"
_JSON_MESSAGE_FIELDS = ("tool_calls",)  # a message's fields that are not text
MESSAGE_KEYS = ("conversations", "messages")  # where a record holds its messages
_VALID_JSON = "valid: a JSON list of records, or JSON lines (one record per line)"


class DatasetFormatError(OmrlError):
    """A dataset file or row that is not in a supported format."""


def is_trajectory_file(file: Path) -> bool:
    return is_trajectory_schema(read_parquet_schema(file))


# -- which files -----------------------------------------------------------------------------------


def data_files(path: Path) -> list[Path]:
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
        return data_files(path / "train")
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
    passed = sorted(p.name for p in path.rglob("*.json") if p.is_file())
    if passed:  # in a folder, JSON is as often a config or a report as data: named, not read
        warnings.warn(
            f"{path}: left out {len(passed)} .json file(s) ({', '.join(passed[:3])}{', ...' if len(passed) > 3 else ''}): "
            "a folder is read for its .parquet and .jsonl files; name a .json file of records itself to read it",
            stacklevel=2,
        )
    if not files:
        raise DatasetFormatError(
            f"{path}: no .parquet or .jsonl files, and not a save_to_disk directory (no state.json)"
        )
    return _without_readable_copies(path, files)


def _without_readable_copies(folder: Path, files: list[Path]) -> list[Path]:
    """``files`` less the readable ``.jsonl`` that ``omrl rollout`` writes beside each trajectory parquet
    (the same name): read both, every episode would be trained twice."""
    present = set(files)
    copies = [
        f
        for f in files
        if f.suffix == ".jsonl"
        and f.with_suffix(".parquet") in present
        and is_trajectory_file(f.with_suffix(".parquet"))
    ]
    if copies:
        names = ", ".join(str(f.relative_to(folder)) for f in copies)
        warnings.warn(
            f"{folder}: read {len(copies)} rollout trajectory files, not the readable .jsonl beside each ({names}): "
            "they hold the same episodes",
            stacklevel=3,
        )
    return [f for f in files if f not in copies]


# -- the records in a file -------------------------------------------------------------------------


def read_rows(file: Path) -> Iterator[tuple[int, Any]]:
    """(row number from 1, record) for every record in one file."""
    if file.suffix == ".jsonl" or (file.suffix == ".json" and _starts_with(file, b"{")):
        if file.suffix == ".json":
            _refuse_objects_over_lines(file)
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
        written_here = (table.schema.metadata or {}).get(_SCHEMA_KEY) == RECORDS_SCHEMA
        number = 0
        for batch in table.to_batches():
            for row in batch.to_pylist():
                number += 1
                yield number, _record_of(row, f"{file} row {number}") if written_here else row


def _refuse_objects_over_lines(file: Path) -> None:
    """A ``.json`` opening with ``{`` is read as JSON lines; one whose first object spans several lines (a
    pretty-printed record, or ``{"data": [...]}``) is not, and would read as "row 1: not valid JSON".
    Only a file whose first line is no JSON is read whole: JSON lines may be large."""
    with file.open("rb") as f:
        first = next((raw for raw in f if raw.strip()), b"")
    try:
        json.loads(first.decode("utf-8-sig"))
        return
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        pass
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        return  # reading its lines names the byte
    start = len(text) - len(text.lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return  # reading its lines says where row 1 breaks
    if "\n" not in text[start:end]:  # JSON text holds no raw newline but between values
        return
    if text[end:].strip():
        raise DatasetFormatError(f"{file}: holds JSON objects over several lines each, not one a line; {_VALID_JSON}")
    raise DatasetFormatError(f"{file}: holds one JSON object ({_what_object(value)}), not records; {_VALID_JSON}")


def _what_object(value: dict[str, Any]) -> str:
    """What a .json's one object seems to be: a record, records under one key, or something else."""
    key = next((k for k in MESSAGE_KEYS if k in value), None)
    if key:
        return f"it has {key!r}, so it is one record, it seems: put it in a list"
    if len(value) == 1:
        key, inner = next(iter(value.items()))
        if isinstance(inner, list) and inner and all(isinstance(item, dict) for item in inner):
            return f"its one key {key!r} holds a list of {len(inner)} objects, the records it seems: save that list"
    keys = ", ".join(map(str, list(value)[:10])) + (", ..." if len(value) > 10 else "")
    return f"keys: {keys}" if value else "an empty object"


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
        return json.loads(text.rstrip("\r\n"))  # a row cut short is wrong where it stops, not on the next line
    except json.JSONDecodeError as exc:
        place = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise DatasetFormatError(f"{where}: not valid JSON ({exc.msg} at {place})") from exc
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


# -- writing, and reading back what was written ----------------------------------------------------


def write_records(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write records (``{"id", "conversations", ...}``) as ``.jsonl`` or ``.parquet`` atomically."""
    if path.suffix == ".parquet":
        atomic_write_parquet(_records_table(records), path)
    elif path.suffix == ".jsonl":
        atomic_write_text(path, "".join(to_json(r) + "\n" for r in records))
    else:
        raise OmrlError(f"cannot write {path}: unsupported output type {path.suffix!r}; use .jsonl or .parquet")
    return path


def _records_table(records: Sequence[dict[str, Any]]) -> pa.Table:
    """Records as a table of ``id``, ``conversations`` (each message a struct of text fields; a field
    a message lacks is null) and ``meta`` (the other fields, as JSON text)."""
    # parquet writes no struct without fields: a file of no records has the usual two
    fields = list(dict.fromkeys(key for r in records for m in r["conversations"] for key in m)) or ["role", "content"]
    message = pa.struct([(key, pa.string()) for key in fields])
    schema = pa.schema(
        [("id", pa.string()), ("conversations", pa.list_(message)), ("meta", pa.string())],
        metadata={_SCHEMA_KEY: RECORDS_SCHEMA},
    )
    return pa.Table.from_pylist([_row_of(r) for r in records], schema=schema)


def _row_of(record: dict[str, Any]) -> dict[str, Any]:
    """A record as its parquet row: its free-form fields as JSON text."""
    meta = {key: value for key, value in record.items() if key not in ("id", "conversations")}
    return {
        "id": record["id"],
        "conversations": [
            {key: to_json(value) if key in _JSON_MESSAGE_FIELDS else value for key, value in m.items()}
            for m in record["conversations"]
        ],
        "meta": to_json(meta) if meta else None,
    }


def _record_of(row: dict[str, Any], where: str) -> dict[str, Any]:
    """A record as :func:`write_records` was given it, from its parquet row (a message's null field: one it lacked)."""
    messages = [
        {
            key: _json(value, where) if key in _JSON_MESSAGE_FIELDS else value
            for key, value in m.items()
            if value is not None
        }
        for m in row.get("conversations") or []
    ]
    meta = _json(row["meta"], where) if row.get("meta") else {}
    if not isinstance(meta, dict):
        raise DatasetFormatError(
            f"{where}: 'meta' must hold a JSON object of the record's fields, got {type(meta).__name__}"
        )
    return {"id": row.get("id") or "", "conversations": messages, **meta}
