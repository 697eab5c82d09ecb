"""The task ids of an ``agentgym`` env's splits: read from options (:func:`parse_splits`) or from an
omrl server's ``GET /tasks`` answer (:func:`task_ids_of`), and described in errors."""

from __future__ import annotations

from typing import Any, Sequence

from omrl.errors import ConfigError


def parse_splits(splits: Any, where: str = "plugins.agentgym.splits") -> dict[str, range]:
    """``{test: 100, train: 444}`` (counts from 0, in order) or ``{test: [0, 100]}`` -> ranges."""
    if not isinstance(splits, dict) or not splits:
        raise ConfigError(f"{where} must map split names to a count or [start, stop(, step)], got {splits!r}")
    out, next_start = {}, 0
    for name, value in splits.items():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[str(name)] = range(next_start, next_start + value)
        elif (
            isinstance(value, (list, tuple))
            and len(value) in (2, 3)
            and list(value[2:]) != [0]
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            out[str(name)] = range(*value)
        else:
            raise ConfigError(
                f"{where}.{name} must be a task count or [start, stop(, step)] of integers, got {value!r}"
            )
        next_start = out[str(name)].stop
    return out


def task_ids_of(answer: Any) -> Sequence[int] | None:
    """The ids in an omrl server's ``{"range": [start, stop, step]}`` or ``{"task_ids": [...]}``."""
    if not isinstance(answer, dict):
        return None
    bounds, ids = answer.get("range"), answer.get("task_ids")
    if isinstance(bounds, list) and len(bounds) == 3 and all(type(b) is int for b in bounds) and bounds[2]:
        return range(*bounds)
    return ids if isinstance(ids, list) and all(type(i) is int for i in ids) else None


def describe_ids(ids: Sequence[int]) -> str:
    if isinstance(ids, range):
        step = f" step {ids.step}" if ids.step != 1 else ""
        return f"{ids.start}..{ids[-1]}{step}" if len(ids) else "(empty)"
    return f"({len(ids)} ids)"
