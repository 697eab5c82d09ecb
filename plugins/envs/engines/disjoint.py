"""Train splits clear of the test split's content, for engines whose splits are seeds.

A procedural engine's train and test splits use disjoint seeds, yet two seeds can give the same
question or board: where the content space is small, most test tasks also appear in train
(reasoning_gym's ``lcm``: 380 of 500; TextArena's FrozenLake-v0: 462 of 500 in the first 1,000 train
ids). The test split stays as it is (published evals stay comparable); a train task whose content is
a test task's is drawn again, from further seeds, until it is not. Content is compared by a hash of
its text (a question, or a board as the game first shows it). The test split's hashes are computed
once per process and kept (``test_keys``), and, with a ``disk`` name, once per machine: they are
written to ``$OMRL_HOME/split-keys/`` (generating 500 test questions takes minutes for some datasets),
under a name that holds the package's version and the split's settings, so another version or
setting computes its own (deleting the folder has them computed again).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

#: how many times a train task is drawn again before it keeps its own content (a space that small
#: is mostly the test split's: the docs name such envs)
MAX_REDRAWS = 20
#: the version of how keys are made: a change to ``content_key`` or to what an engine hashes bumps it,
#: so that keys written by an older omrl are not read
KEY_FORMAT = 1

_TEST_KEYS: dict[Hashable, frozenset[str]] = {}
_KEY = re.compile(r"[0-9a-f]{16}")


def content_key(text: object) -> str:
    """A short hash of a task's content (its question or board)."""
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def test_keys(
    cache_key: Hashable, texts: Callable[[], Iterable[object]], disk: Sequence[str] | None = None
) -> frozenset[str]:
    """The content keys of ``texts()``, the test split's contents, computed once per ``cache_key``;
    with ``disk`` (what names the contents: engine, package version, env, settings), also kept on disk
    and read from there by later processes."""
    keys = _TEST_KEYS.get(cache_key)
    if keys is None:
        path = _disk_path(disk) if disk is not None else None
        stored = _read_keys(path) if path is not None else None
        if stored is None:
            stored = [content_key(text) for text in texts()]
            if path is not None:
                _write_keys(path, stored)
        keys = _TEST_KEYS[cache_key] = frozenset(stored)
    return keys


def package_version(distribution: str) -> str:
    """The installed version of ``distribution`` (a part of a ``disk`` name), or ``unknown``."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _disk_path(disk: Sequence[str]):
    from omrl.home import omrl_home

    name = hashlib.sha256(json.dumps([KEY_FORMAT, *disk]).encode()).hexdigest()[:32]
    return omrl_home() / "split-keys" / f"{name}.json"


def _read_keys(path) -> list[str] | None:
    """The keys stored at ``path``; None when there are none, or the file is damaged (computed again)."""
    try:
        keys = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(keys, list) and keys and all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys)):
        return None
    return keys


def _write_keys(path, keys: list[str]) -> None:
    from omrl.atomic import atomic_write_text

    try:
        atomic_write_text(path, json.dumps(keys))
    except OSError:  # a read-only home: the next process computes them again
        pass


def shared_boards_note(shared: str) -> str:
    """What an env's description says of a game with too few boards for splits of their own."""
    return f"Train and test share {shared}: a test score measures play on boards seen in training, not generalisation."


def clear_of(
    avoid: frozenset[str], candidates: Iterator[T], text: Callable[[T], object], redraws: int = MAX_REDRAWS
) -> T:
    """The first of ``candidates`` (the task's own content, then its redraws) whose text is not in
    ``avoid``; the first candidate when none of the first ``1 + redraws`` is."""
    first = next(candidates)
    if content_key(text(first)) not in avoid:
        return first
    for _, candidate in zip(range(redraws), candidates):
        if content_key(text(candidate)) not in avoid:
            return candidate
    return first
