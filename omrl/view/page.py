"""The page: one HTML document with its stylesheet and script inlined.

Served, it fetches its data from the server's ``api/`` endpoints. Saved with ``--out``, it
carries a bounded number of episodes as JSON inside the document and opens offline: at most
``--max-episodes`` of them, and no more than :data:`DEFAULT_MAX_BYTES` of episodes, groups and
trees together (each answer's texts and token lists cut as :mod:`omrl.view.bounds` says). Either
way a Content-Security-Policy forbids loading anything from elsewhere, and the JSON placed
in the document has ``<``, ``>`` and ``&`` escaped, so no text from a model or an env can
close the script element that holds it.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from omrl.view import view_command
from omrl.view.store import EpisodeStore

if TYPE_CHECKING:
    from omrl.view.compare import Comparison

DEFAULT_MAX_EPISODES = 200
# JSON of the episodes, groups and trees a saved page embeds; the overview (config, curves) comes on top
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; connect-src {connect}"
)
_SLOTS = re.compile(r"__(CSP|CSS|JS|DATA)__")


def dumps(value: Any) -> str:
    """Strict JSON (NaN and infinities as null), ASCII only, so every browser parses it."""
    try:
        return json.dumps(value, allow_nan=False, default=str)
    except ValueError:  # a non-finite float somewhere: rare, so only then walk the whole value
        from omrl.data.trajectory import nonfinite_to_none  # only here: that module loads pyarrow

        return json.dumps(nonfinite_to_none(value), allow_nan=False, default=str)


def render(data: dict[str, Any] | None = None) -> str:
    """The page; with ``data`` (see :func:`embedded_data`) it needs no server."""
    assets = resources.files("omrl.view") / "assets"
    template = (assets / "view.html").read_text(encoding="utf-8")
    slots = {
        "CSP": _CSP.format(connect="'none'" if data is not None else "'self'"),
        "CSS": (assets / "view.css").read_text(encoding="utf-8"),
        "JS": (assets / "view.js").read_text(encoding="utf-8"),
        "DATA": "" if data is None else f'<script type="application/json" id="omrl-data">{script_json(data)}</script>',
    }
    # one pass over the template: text put into a slot is never searched for slots itself
    return _SLOTS.sub(lambda m: slots[m.group(1)], template)


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no ``</script>`` or ``<!--`` can appear in it."""
    return dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embedded_data(
    store: EpisodeStore,
    max_episodes: int = DEFAULT_MAX_EPISODES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    first: Sequence[int] = (),
) -> dict[str, Any]:
    """The first ``max_episodes`` episodes in full, with their groups and trees, and the overview;
    the episodes after the one that would take the embedded JSON past ``max_bytes`` are left out,
    so a run of long episodes still makes a page a browser opens (the note says so). The episodes
    ``first`` names (a comparison's changed ones) come before the others."""
    total = len(store.summaries)
    order = list(dict.fromkeys([i for i in first if 0 <= i < total] + list(range(total))))
    kept = [store.summary(i) for i in order[: max(0, max_episodes)]]
    embedded: dict[str, dict[str, Any]] = {"details": {}, "groups": {}, "trees": {}}
    used, full = 0, False
    for e in kept:
        parts = {"details": {str(e["id"]): store.episode(e["id"])}}
        if e["group"] not in embedded["groups"]:
            parts["groups"] = {e["group"]: store.group(e["group"])}
        if e["tree"] and e["group"] not in embedded["trees"]:
            parts["trees"] = {e["group"]: store.tree(e["group"])}
        size = sum(len(script_json(value)) for part in parts.values() for value in part.values())
        if used + size > max_bytes:
            full = True
            break
        used += size
        for name, part in parts.items():
            embedded[name].update(part)
    kept = sorted(kept[: len(embedded["details"])], key=lambda e: e["id"])
    unreadable = [d["unavailable"] for d in embedded["details"].values() if "unavailable" in d]
    note = ""
    if len(kept) < total:
        why = (
            f"past them its {max_bytes / 2**20:g} MiB bound on embedded episodes would be crossed"
            if full
            else f"--max-episodes {max_episodes}"
        )
        which = f"the first {len(kept)}" if not first else f"{len(kept)} (those the comparison lists, then the first)"
        note = (
            f"This saved page holds {which} of the run's {total} episodes ({why}); "
            f"`{view_command(store.source.path)}` serves them all."
        )
    if unreadable:  # a damaged row group whose summary columns read: its episodes are listed, their turns not
        note = (
            f"{note} {len(unreadable)} of its {len(kept)} episodes cannot be read, so the page lists them without "
            f"their turns (the first: {unreadable[0]})."
        ).strip()
    return {
        "note": note or "every episode is in this page",
        "run": {**store.overview(), "embedded_note": note},
        "summaries": kept,
        **embedded,
    }


def compare_data(
    comparison: Comparison, max_episodes: int = DEFAULT_MAX_EPISODES, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """A saved comparison: the comparison, and each side's :func:`embedded_data` (up to ``max_episodes``
    episodes of each, the changed ones first, and half of ``max_bytes``)."""
    overview = comparison.overview()
    sides = {}
    for side, store in comparison.sides.items():
        changed = [pair[side] for row in overview["changed"] for pair in row["changed"]]
        sides[side] = embedded_data(store, max_episodes, max_bytes // 2, first=changed)
    notes = [
        f"{side.upper()}: {data['run']['embedded_note']}"
        for side, data in sides.items()
        if data["run"]["embedded_note"]
    ]
    return {"run": {**overview, "embedded_note": " ".join(notes)}, "sides": sides}


def write_page(
    store: EpisodeStore | Comparison, out: str | os.PathLike, max_episodes: int = DEFAULT_MAX_EPISODES
) -> tuple[Path, int]:
    """Write the self-contained page to ``out`` (atomically); returns its path and how many episodes it
    holds whole (``max_episodes`` or fewer, where the byte bound of :func:`embedded_data` stopped it or
    an episode's row cannot be read; for a comparison, of both sides together)."""
    from omrl.atomic import atomic_write_text

    path = Path(out)
    if isinstance(store, EpisodeStore):
        data = embedded_data(store, max_episodes)
        kept = _whole(data)
    else:
        data = compare_data(store, max_episodes)
        kept = sum(_whole(side) for side in data["sides"].values())
    atomic_write_text(path, render(data))
    return path, kept


def _whole(data: dict[str, Any]) -> int:
    """How many of the episodes :func:`embedded_data` embedded are there whole (their rows could be read)."""
    return sum("unavailable" not in detail for detail in data["details"].values())
