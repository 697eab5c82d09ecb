"""The page: one HTML document with its stylesheet and script inlined.

Served, it fetches its data from the server's ``api/`` endpoints. Saved with ``--out``, it
carries a bounded number of episodes as JSON inside the document and opens offline. Either
way a Content-Security-Policy forbids loading anything from elsewhere, and the JSON placed
in the document has ``<``, ``>`` and ``&`` escaped, so no text from a model or an env can
close the script element that holds it.
"""

from __future__ import annotations

import json
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from omrl.view.store import EpisodeStore

DEFAULT_MAX_EPISODES = 200
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'; connect-src {connect}")
_SLOTS = re.compile(r"__(CSP|CSS|JS|DATA)__")


def dumps(value: Any) -> str:
    """Strict JSON (NaN and infinities as null), ASCII only, so every browser parses it."""
    try:
        return json.dumps(value, allow_nan=False, default=str)
    except ValueError:  # a non-finite float somewhere: rare, so only then walk the whole value
        return json.dumps(_finite(value), allow_nan=False, default=str)


def render(data: dict[str, Any] | None = None) -> str:
    """The page; with ``data`` (see :func:`embedded_data`) it needs no server."""
    assets = resources.files("omrl.view") / "assets"
    template = (assets / "view.html").read_text(encoding="utf-8")
    slots = {
        "CSP": _CSP.format(connect="'none'" if data is not None else "'self'"),
        "CSS": (assets / "view.css").read_text(encoding="utf-8"),
        "JS": (assets / "view.js").read_text(encoding="utf-8"),
        "DATA": "" if data is None else
        f'<script type="application/json" id="omrl-data">{script_json(data)}</script>',
    }
    # one pass over the template: text put into a slot is never searched for slots itself
    return _SLOTS.sub(lambda m: slots[m.group(1)], template)


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no ``</script>`` or ``<!--`` can appear in it."""
    return dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embedded_data(store: EpisodeStore, max_episodes: int = DEFAULT_MAX_EPISODES) -> dict[str, Any]:
    """The first ``max_episodes`` episodes in full, with their groups and trees, and the overview."""
    total = len(store.summaries)
    kept = [store.summary(i) for i in range(min(total, max(0, max_episodes)))]
    note = ""
    if len(kept) < total:
        note = (f"This saved page holds the first {len(kept)} of the run's {total} episodes (--max-episodes "
                f"{max_episodes}); `omrl view {store.source.path}` serves them all.")
    keys = list(dict.fromkeys(e["group"] for e in kept))
    trees = list(dict.fromkeys(e["group"] for e in kept if e["tree"]))
    return {
        "note": note or "every episode is in this page",
        "run": {**store.overview(), "embedded_note": note},
        "summaries": kept,
        "details": {str(e["id"]): store.episode(e["id"]) for e in kept},
        "groups": {key: store.group(key) for key in keys},
        "trees": {key: store.tree(key) for key in trees},
    }


def write_page(store: EpisodeStore, out: str | os.PathLike, max_episodes: int = DEFAULT_MAX_EPISODES) -> Path:
    """Write the self-contained page to ``out`` (atomically); returns its path."""
    from omrl.atomic import atomic_write_text

    path = Path(out)
    atomic_write_text(path, render(embedded_data(store, max_episodes)))
    return path


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
