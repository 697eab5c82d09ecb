"""KV states kept between generate calls of the ``hf`` backend, found again by their token ids.

A multi-turn rollout sends each episode's whole conversation every turn; all of it
but the newest tokens was already run through the model in the turn before. The
:class:`PrefixCache` keeps, per conversation, the keys and values of every layer
for the tokens it has seen, and answers "which stored tokens does this prompt
start with?" (the longest common prefix over all entries), so a turn only
computes the tokens after that prefix.

Two kinds of entries:

- an **episode** entry: one conversation so far (prompt plus the sampled reply,
  minus its last id, which was never fed back). The next turn's prompt starts with
  all of it; the entry is then superseded, and :meth:`PrefixCache.release` drops
  it when the episode ends.
- a **shared** entry: a prefix two different conversations began with (the system
  prompt and worked example every episode opens with). It stays across episodes
  until the weights change or memory runs short.

Entries hold plain per-layer tensors; :func:`to_dynamic_cache` and
:func:`from_dynamic_cache` move them in and out of transformers' ``DynamicCache``,
the cache the model's forward fills. Nothing here knows about the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Sequence

import torch

#: per layer (keys, values), each (batch, kv_heads, length, head_dim)
KV = list[tuple[torch.Tensor, torch.Tensor]]

#: the shortest prefix worth keeping as a shared entry (shorter ones save less than they cost to find)
MIN_SHARED = 16


def kv_length(kv: KV) -> int:
    """Tokens held by ``kv`` (its third dimension)."""
    return int(kv[0][0].shape[2]) if kv else 0


def kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def kv_bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes of keys and values one token holds in a decoder ``config``'s cache (every layer)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * element_size


def crop(kv: KV, length: int) -> KV:
    """The first ``length`` positions of ``kv`` (views: nothing is copied)."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


def to_dynamic_cache(kv: KV) -> Any:
    """A transformers ``DynamicCache`` holding ``kv`` (copied: the model appends to its own tensors)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys, values, layer)
    return cache


def from_dynamic_cache(cache: Any) -> KV:
    """The per-layer tensors of a ``DynamicCache`` (no copy)."""
    return [(keys, values) for keys, values, *_ in cache]


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two (length,) id tensors."""
    n = min(len(a), len(b))
    differ = torch.nonzero(a[:n] != b[:n])
    return int(differ[0, 0]) if len(differ) else n


@dataclass(eq=False)
class Entry:
    """Stored KV states of the tokens ``ids`` ((length,) long, CPU), ``kv`` of batch 1."""

    ids: torch.Tensor
    kv: KV
    shared: bool = False  # a prefix several conversations began with: kept across episodes
    used: int = 0  # the cache's clock when last stored or matched; the least recently used goes first

    @property
    def nbytes(self) -> int:
        return kv_bytes(self.kv)


class PrefixCache:
    """Entries of KV states, matched to prompts by their longest common prefix, within a memory cap.

    ``max_bytes`` bounds what the entries hold between calls (0: no bound); when a
    new entry would pass it, the least recently used entries go first, episode
    entries before shared ones. ``version`` is whatever identifies the weights the
    states were computed with: :meth:`check_version` drops everything when it changes.
    """

    def __init__(self, max_bytes: int = 0, min_shared: int = MIN_SHARED):
        self.max_bytes = max_bytes
        self.min_shared = min_shared
        self.entries: list[Entry] = []
        self.version: Hashable = None
        self.clock = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def check_version(self, version: Hashable) -> bool:
        """Drop every entry when ``version`` differs from the last one seen; True when it did."""
        if version == self.version:
            return False
        self.clear()
        self.version = version
        return True

    def clear(self) -> None:
        self.entries = []

    def tick(self) -> None:
        """Advance the clock: one call of the backend."""
        self.clock += 1

    def longest(self, ids: torch.Tensor, also: Iterable[Entry] = ()) -> tuple[Entry | None, int]:
        """The entry (stored, or one of ``also``) sharing the longest prefix with ``ids``, and that length.

        The length is at most ``len(ids) - 1``: the model must still see one token
        of the prompt to give the next token's logits.
        """
        best, best_len = None, 0
        for entry in [*self.entries, *also]:
            n = min(common_prefix(entry.ids, ids), len(ids) - 1)
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            best.used = self.clock
        return best, best_len

    def put(self, ids: torch.Tensor, kv: KV, *, shared: bool = False) -> Entry:
        """Store ``kv`` for ``ids``; makes room first when the cap would be passed."""
        for entry in self.entries:
            if entry.shared == shared and len(entry.ids) == len(ids) and common_prefix(entry.ids, ids) == len(ids):
                entry.used = self.clock  # the same tokens already (identical samples of one task)
                return entry
        entry = Entry(ids, kv, shared=shared, used=self.clock)
        if self.max_bytes and entry.nbytes > self.max_bytes:
            return entry  # larger than the whole cache: not kept
        self._make_room(entry.nbytes)
        self.entries.append(entry)
        return entry

    def share(self, source: Entry, length: int) -> Entry | None:
        """Keep the first ``length`` tokens of ``source`` as a shared entry, when no shared entry holds them yet.

        Called when a prompt matched ``source`` only partly: those ``length``
        tokens opened two different conversations, and will likely open more.
        """
        if length < self.min_shared or source.shared:
            return None
        ids = source.ids[:length]
        if any(e.shared and common_prefix(e.ids, ids) >= length for e in self.entries):
            return None
        kv = [(k.clone(), v.clone()) for k, v in crop(source.kv, length)]  # a view would keep all of source alive
        return self.put(ids.clone(), kv, shared=True)

    def drop(self, entry: Entry) -> None:
        """Forget ``entry`` (no error when it is already gone)."""
        self.entries = [e for e in self.entries if e is not entry]

    def release(self, conversations: Sequence[torch.Tensor] | None = None) -> None:
        """Drop the episode entries that ``conversations`` ((length,) id tensors) start with
        (every episode entry when None); shared entries stay."""
        if conversations is None:
            self.entries = [e for e in self.entries if e.shared]
            return

        def ended(entry: Entry) -> bool:
            return any(common_prefix(entry.ids, ids) == len(entry.ids) for ids in conversations)

        self.entries = [e for e in self.entries if e.shared or not ended(e)]

    def _make_room(self, incoming: int) -> None:
        if not self.max_bytes:
            return
        held = self.nbytes
        # oldest first, episode entries before shared ones (an opening serves every episode)
        for entry in sorted(self.entries, key=lambda e: (e.shared, e.used)):
            if held + incoming <= self.max_bytes:
                break
            self.drop(entry)
            held -= entry.nbytes
