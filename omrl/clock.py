"""Where a step's wall time goes: seconds per part (generate, env, reward, forward, backward, ...),
measured on the main thread and logged as ``time/<part>`` with each step.

Parts nest, and only the outermost one running counts (an evaluation's generate calls are the eval's
time), so a step's parts add up to at most its time; what no part covers is logged as
``time/other``. Work on other threads (env instances stepping in parallel) counts as the time the
main thread waits for it. The deadline stages (:func:`omrl.supervisor.stage`) are parts too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

_seconds: dict[str, float] = {}
_depth = 0  # parts running now on the main thread


@contextlib.contextmanager
def timed(part: str) -> Iterator[None]:
    """Count the block's wall time toward ``part`` (on the main thread, when no other part runs)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost, started = _depth == 0, time.perf_counter()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if outermost:
            _seconds[part] = _seconds.get(part, 0.0) + time.perf_counter() - started


def take() -> dict[str, float]:
    """The seconds of each part since the last take, and start counting afresh."""
    taken = dict(_seconds)
    _seconds.clear()
    return taken


def breakdown(step_seconds: float, parts: dict[str, float]) -> dict[str, float]:
    """A step's ``time/<part>`` metrics, with ``time/other`` for what no part covers."""
    out = {f"time/{part}": value for part, value in sorted(parts.items())}
    out["time/other"] = max(0.0, step_seconds - sum(parts.values()))
    return out
