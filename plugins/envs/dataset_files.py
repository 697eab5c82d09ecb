"""Reading the ``dataset`` env's files (JSONL, JSON, parquet or a ``datasets`` directory) as prompts and answers.

The options that name the files and columns are described in :mod:`omrl_plugins.envs.dataset`;
errors name the file and the line or row at fault.
"""

from __future__ import annotations

import functools
import json
import math
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.errors import ConfigError, short_repr
from omrl_plugins.rewards.answers import final_number

NAME = "dataset"
PROMPT_KEYS = ("prompt", "question", "problem", "input")
ANSWER_KEYS = ("answer", "ground_truth", "solution", "target", "reward_model.ground_truth")
FORMATS = "a .jsonl file (or .json), a .parquet file, or a directory saved by datasets' save_to_disk"
_MISSING = object()


@dataclass(frozen=True)
class Item:
    """One row: the prompt and the answers that count (at least one)."""

    prompt: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Data:
    """Both splits of a dataset, as read (shared by every instance built with the same options)."""

    train: tuple[Item, ...]
    test: tuple[Item, ...]
    prompt_key: str
    answer_key: str


def load_data(
    path: str, prompt_key: str, answer_key: str, test_path: str, test_fraction: float, seed: int, match: str
) -> Data:
    """Both splits of the dataset the options name; read once while the files stay as they are."""
    return _load_data(
        path, prompt_key, answer_key, test_path, test_fraction, seed, match, _stamp(path), _stamp(test_path)
    )


def _stamp(path: str) -> tuple:
    """What the files under ``path`` look like now (names, sizes, times): the read cache's key."""
    if not path:
        return ()
    root = Path(path).expanduser()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists())


@functools.lru_cache(maxsize=8)
def _load_data(
    path: str,
    prompt_key: str,
    answer_key: str,
    test_path: str,
    test_fraction: float,
    seed: int,
    match: str,
    *stamps: tuple,
) -> Data:
    rows, columns = read_rows(path, "path", "train")
    prompt_key = prompt_key or _first_key(PROMPT_KEYS, rows[0][1], columns, path, "prompt")
    answer_key = answer_key or _first_key(ANSWER_KEYS, rows[0][1], columns, path, "answer")
    if not test_path and not test_fraction and "test" in dict_splits(path):
        test_path = path  # a DatasetDict with its own test split
    if test_path:
        test_rows, test_columns = read_rows(test_path, "test_path", "test")
        train = _items(rows, columns, prompt_key, answer_key, match)
        test = _items(test_rows, test_columns, prompt_key, answer_key, match)
    else:
        items = _items(rows, columns, prompt_key, answer_key, match)
        train, test = split_items(items, test_fraction, seed)
    warn_overlap(train, test, f"test_path {test_path}" if test_path else f"test_fraction {test_fraction:g} of {path}")
    return Data(tuple(train), tuple(test), prompt_key, answer_key)


def warn_overlap(train: list[Item], test: list[Item], where: str) -> None:
    """Warn where test prompts are train prompts too (the same file given twice, or rows repeated in one
    file that the split put on both sides): a held-out score would measure what training saw."""
    seen = {item.prompt.strip() for item in train}
    shared = sum(item.prompt.strip() in seen for item in test)
    if shared:
        warnings.warn(
            f"{shared} of the {len(test)} test prompts ({where}) are train prompts too: an evaluation on the test "
            "split is then partly on what training saw; give a test file of other questions, or remove repeated rows",
            stacklevel=2,
        )


def split_items(items: list[Item], test_fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """(train, test): ``test_fraction`` of the rows (at least one when it is above 0) drawn with
    ``seed``; both keep the file's order."""
    if not test_fraction:
        return items, []
    count = max(1, round(len(items) * test_fraction))
    if count >= len(items):
        raise ConfigError(
            f"{NAME} option test_fraction={test_fraction} takes all {len(items)} rows for the test split "
            "and leaves none to train on; lower it or add rows"
        )
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    chosen = set(order[:count])
    return [it for i, it in enumerate(items) if i not in chosen], [it for i, it in enumerate(items) if i in chosen]


def read_rows(path: str, option: str, dict_split: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(where, row) for every row of ``path`` (``where`` names the file and the line or row) and the
    file's columns; ConfigError for a missing, empty or unreadable file. A DatasetDict directory gives
    its ``dict_split`` split."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"{NAME} option {option}={path!r}: no such file or directory; valid: {FORMATS}")
    if file.is_dir():
        rows = _saved_dataset_rows(file, option, dict_split)
    elif file.suffix == ".parquet":
        rows = _parquet_rows(file)
    elif file.suffix in (".jsonl", ".json"):
        rows = _json_rows(file)
    else:
        raise ConfigError(f"{NAME} option {option}={path!r}: unsupported file type {file.suffix!r}; valid: {FORMATS}")
    if not rows:
        raise ConfigError(f"{NAME} option {option}={path!r}: the file holds no rows; expected {FORMATS}")
    columns: dict[str, None] = {}
    for where, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: is {_short(row)}, not an object of columns (e.g. prompt, answer)")
        columns.update(dict.fromkeys(map(str, row)))
    return rows, list(columns)


def _json_rows(file: Path) -> list[tuple[str, Any]]:
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{file} line {line}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from exc
    if file.suffix == ".json" and text.lstrip().startswith("["):
        records = _parse_json(text, str(file), "a list of objects")
        if not isinstance(records, list):
            raise ConfigError(f"{file}: a .json dataset must be a list of objects (or JSON lines)")
        return [(f"{file} record {i}", record) for i, record in enumerate(records, 1)]
    return [
        (f"{file} line {number}", _parse_json(line, f"{file} line {number}", "one JSON object per line (JSONL)"))
        for number, line in enumerate(text.split("\n"), 1)  # not splitlines: JSON strings may hold U+2028 raw
        if line.strip()
    ]


def _parse_json(text: str, where: str, expected: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); expected {expected}") from exc
    except (RecursionError, ValueError) as exc:  # nested too deeply; an int of thousands of digits
        raise ConfigError(f"{where}: unreadable JSON ({type(exc).__name__}); expected {expected}") from exc


def _parquet_rows(file: Path) -> list[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(file).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow's many error types: not a parquet file, a cut one
        raise ConfigError(f"{file}: not a readable parquet file ({type(exc).__name__}: {exc})") from exc
    return [(f"{file} row {i}", record) for i, record in enumerate(records, 1)]


def dict_splits(path: str) -> list[str]:
    """The splits of a ``datasets`` DatasetDict directory (read from its ``dataset_dict.json``), else []."""
    index = Path(path).expanduser() / "dataset_dict.json"
    try:
        splits = json.loads(index.read_text(encoding="utf-8")).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in splits if isinstance(s, str)] if isinstance(splits, list) else []


def _saved_dataset_rows(directory: Path, option: str, dict_split: str) -> list[tuple[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            f"{NAME} option {option}={str(directory)!r} is a directory: the {NAME} env reads one saved by Hugging "
            "Face datasets' save_to_disk, which needs the datasets package: pip install datasets (or give a "
            ".jsonl or .parquet file)"
        ) from exc
    try:
        loaded = datasets.load_from_disk(str(directory))
    except Exception as exc:  # noqa: BLE001 - datasets' FileNotFoundError, a broken state.json...
        raise ConfigError(
            f"{NAME} option {option}={str(directory)!r}: not a dataset saved by datasets' save_to_disk "
            f"({type(exc).__name__}: {exc}); valid: {FORMATS}"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if dict_split not in loaded:
            raise ConfigError(
                f"{NAME} option {option}={str(directory)!r}: a DatasetDict without a {dict_split!r} split "
                f"(splits: {', '.join(loaded) or 'none'}); give the split's directory, e.g. {directory / next(iter(loaded), 'train')}"
            )
        loaded = loaded[dict_split]
        directory = directory / dict_split
    return [(f"{directory} row {i}", record) for i, record in enumerate(loaded.to_list(), 1)]


def _lookup(row: dict[str, Any], key: str) -> Any:
    """``row[key]``; a dotted key not in the row reads nested fields (``reward_model.ground_truth``)."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _first_key(candidates: tuple[str, ...], row: dict[str, Any], columns: list[str], path: str, what: str) -> str:
    for key in candidates:
        if _lookup(row, key) is not _MISSING:
            return key
    raise ConfigError(
        f"{path}: no {what} column found (tried {', '.join(candidates)}); its columns: "
        f"{', '.join(columns[:30])}; set plugins.{NAME}.{what}_key=COLUMN"
    )


def _items(
    rows: list[tuple[str, dict[str, Any]]], columns: list[str], prompt_key: str, answer_key: str, match: str
) -> list[Item]:
    items = []
    for where, row in rows:
        values = []
        for key, what in ((prompt_key, "prompt"), (answer_key, "answer")):
            value = _lookup(row, key)
            if value is _MISSING:
                raise ConfigError(
                    f"{where}: has no {what} column {key!r} (its columns: {', '.join(map(str, row)) or 'none'}; "
                    f"the file's: {', '.join(columns[:30])}); set plugins.{NAME}.{what}_key=COLUMN"
                )
            values.append(value)
        item = Item(_prompt_text(values[0], where, prompt_key), _answers(values[1], where, answer_key))
        if match == "numeric" and not any(final_number(answer) for answer in item.answers):
            raise ConfigError(
                f"{where}: answer {item.answers[0]!r} holds no number, which match=numeric needs; "
                "use match=exact or match=math for text answers"
            )
        items.append(item)
    return items


def _prompt_text(value: Any, where: str, key: str) -> str:
    """A prompt as text: text as it is, a chat's messages' contents one paragraph each, up to its
    last user message (the assistant's reply after it is the answer, not the question)."""
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value)
    ):
        roles = [m.get("role") for m in value]
        if "user" in roles:
            value = value[: len(roles) - roles[::-1].index("user")]
        elif "assistant" in roles:
            raise ConfigError(
                f"{where}: prompt {key!r} is a chat without a user message; valid: a chat whose last "
                "user message asks the question (the messages after it are left out)"
            )
        value = "\n\n".join(m["content"] for m in value)
    if not isinstance(value, str):
        raise ConfigError(
            f"{where}: prompt {key!r} is {_short(value)}; valid: text, or a chat (a list of {{role, content}} messages)"
        )
    if not value.strip():
        raise ConfigError(f"{where}: prompt {key!r} is empty")
    return value


def _answers(value: Any, where: str, key: str) -> tuple[str, ...]:
    """The accepted answers as text: one answer, or a non-empty list of them."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    answers = tuple(_answer_text(v) for v in values)
    if not values or any(answer is None for answer in answers):
        raise ConfigError(
            f"{where}: answer {key!r} is {_short(value)}; valid: text, a number, or a non-empty list of those"
        )
    if not all(answer.strip() for answer in answers):  # type: ignore[union-attr]
        raise ConfigError(f"{where}: answer {key!r} is empty")
    return answers  # type: ignore[return-value]


def _answer_text(value: Any) -> str | None:
    """Text as it is, a finite number as text (``72.0`` -> ``"72"``); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    return str(value)


def _short(value: Any) -> str:
    """``value`` for an error message: cut to a line, with its type (``True (bool)``)."""
    return f"{short_repr(value)} ({type(value).__name__})"
