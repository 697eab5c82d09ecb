"""Train splits clear of the test split's content, for engines whose splits are seeds.

A procedural engine's train and test splits use disjoint seeds, yet two seeds can give the same
question or board: where the content space is small, most test tasks also appear in train
(reasoning_gym's ``lcm``: 380 of 500). The test split stays as it is (published evals stay
comparable); a train task whose content is a test task's is drawn again, from further seeds, until
it is not. Content is compared by a hash of its text; the test split's hashes are computed once per
process and kept (``test_keys``).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Hashable, Iterable, Iterator, TypeVar

T = TypeVar("T")

#: how many times a train task is drawn again before it keeps its own content (a space that small
#: is mostly the test split's: the docs name such envs)
MAX_REDRAWS = 20

_TEST_KEYS: dict[Hashable, frozenset[str]] = {}


def content_key(text: object) -> str:
    """A short hash of a task's content (its question or board)."""
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def test_keys(cache_key: Hashable, texts: Callable[[], Iterable[object]]) -> frozenset[str]:
    """The content keys of ``texts()``, the test split's contents, computed once per ``cache_key``."""
    keys = _TEST_KEYS.get(cache_key)
    if keys is None:
        keys = _TEST_KEYS[cache_key] = frozenset(content_key(text) for text in texts())
    return keys


def clear_of(avoid: frozenset[str], candidates: Iterator[T], text: Callable[[T], object]) -> T:
    """The first of ``candidates`` (the task's own content, then its redraws) whose text is not in
    ``avoid``; the first candidate when none of the first ``1 + MAX_REDRAWS`` is."""
    first = next(candidates)
    if content_key(text(first)) not in avoid:
        return first
    for _, candidate in zip(range(MAX_REDRAWS), candidates):
        if content_key(text(candidate)) not in avoid:
            return candidate
    return first
