"""Learning curves: ``metrics.jsonl`` read line by line, its keys sorted into plot panels.

Unlike :func:`omrl.training.metrics.read_metrics`, which silently skips a bad line (right for
resuming), this reader says which line of which file was skipped and why, so the page can.
The panels are defined once here and used by both the page and ``omrl plot``.

A run over several envs logs each metric per env too, as ``<metric>/<env>`` (``success/gridworld``;
an env name may hold ``:``), and ``episodes/<env>`` for every env: those keys name the run's envs.
The per-env keys stay out of the ordinary panels (which then look as a one-env run's) and get
panels of their own, one per metric: its overall curve and a line per env (:func:`env_panels`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from omrl.env_results import finite_number
from omrl.supervisor import HEARTBEAT_FILE
from omrl.training.metrics import HEARTBEAT
from omrl.view.sources import Problem, readable_inside

# Not curves: the x axis and the wall-clock time of the line.
_NOT_PLOTTED = {"step", "time"}
# What the page shows of a heartbeat (omrl.supervisor): nothing else of the file goes into it.
_HEARTBEAT_FIELDS = ("time", "step", "stages", "open")
# The per-env key every env of a mixture logs each step (omrl.training.metrics.per_env_metrics).
_ENV_COUNT = "episodes"

# The panel of the seconds each part of a step took: every `time/` key's, whatever its name (panel_title).
_TIME_PARTS = "Where a step's time goes (s)"
# (title, file stem for `omrl plot`, which keys it holds). The first panel that takes a key gets it;
# a key no panel takes gets a panel of its own, since unrelated metrics rarely share a scale.
PANELS: list[tuple[str, str, Callable[[str], bool]]] = [
    ("Reward", "reward", lambda k: k == "reward" or k.startswith(("reward_", "reward/"))),
    ("Success and score", "success", lambda k: any(w in k for w in ("success", "score", "pass@"))),
    ("KL", "kl", lambda k: k == "kl" or k.startswith("kl_") or k.endswith("_kl")),
    ("Entropy", "entropy", lambda k: "entropy" in k),
    ("Loss", "loss", lambda k: "loss" in k),
    ("Lengths", "lengths", lambda k: k in ("turns", "tokens") or k.endswith("_tokens") or "length" in k),
    (_TIME_PARTS, "parts", lambda k: k.startswith("time/") or k == "prefill_time"),
    ("Step time (s)", "time", lambda k: k.endswith("_time")),
    ("Throughput (tokens/s)", "throughput", lambda k: "per_s" in k),
]


def read_metrics_file(path: Path, label: str) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The records of a metrics JSONL and a Problem for each line that could not be used."""
    problems: list[Problem] = []
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        return [], [Problem(label, f"cannot be read ({exc.strerror or exc})")]
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)  # text after the final newline: a line still being written
        try:
            record = json.loads(line)
        except ValueError:
            why = (
                "the last line is half-written (a run still writing, or killed mid-line)"
                if last
                else f"line {number} is not JSON"
            )
            problems.append(Problem(label, f"{why}; skipped", level="warning"))
            continue
        if isinstance(record, dict) and HEARTBEAT in record:  # the supervisor's, shown from heartbeat.json
            continue
        if not isinstance(record, dict) or not _is_finite(record.get("step")):
            problems.append(Problem(label, f"line {number} has no numeric step; skipped", level="warning"))
            continue
        records.append(record)
    if not records and not problems:
        problems.append(Problem(label, "empty: the run has logged no step yet", level="warning"))
    return records, problems


def read_heartbeat(run_dir: Path) -> dict[str, Any] | None:
    """The run's latest heartbeat (``heartbeat.json``, :mod:`omrl.supervisor`): each stage's progress, and
    the stages open when it was written; None when the run wrote none or it cannot be read, or it is no
    regular file of the run (a FIFO would hang the page, a link out of the run is not the run's to show)."""
    path = run_dir / HEARTBEAT_FILE
    if not readable_inside(path, run_dir):
        return None
    try:
        beat = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(beat, dict) or not isinstance(beat.get("stages"), dict):
        return None
    return {key: beat[key] for key in _HEARTBEAT_FIELDS if key in beat}


def columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"step": [...], "series": {key: [value or None, ...]}}``: one entry per record, in step order.

    A key a record lacks (eval metrics are logged every few steps) and a non-finite value are None.
    """
    records = sorted(records, key=lambda r: r["step"])
    keys: dict[str, None] = {}  # in first-seen order; a dict, so each lookup is O(1) at 100,000 steps
    for record in records:
        for k, v in record.items():
            if k not in keys and k not in _NOT_PLOTTED and _is_number(v):
                keys[k] = None
    series = {key: [_finite(r.get(key)) for r in records] for key in keys}
    return {"step": [r["step"] for r in records], "series": series}


def envs_of(keys: list[str]) -> list[str]:
    """The envs a run's metric keys name through ``episodes/<env>``, in first-seen order; none for a one-env run."""
    return [key.partition("/")[2] for key in keys if key.startswith(_ENV_COUNT + "/")]


def env_metric(key: str, envs: list[str]) -> tuple[str, str | None]:
    """``(metric, env)`` of a per-env key (``success/gridworld`` -> ``("success", "gridworld")``);
    ``(key, None)`` for a key of the whole run. The metric ends at the first ``/``, as the trainer names it."""
    metric, _, env = key.partition("/")
    return (metric, env) if env in envs else (key, None)


def panels(keys: list[str]) -> list[dict[str, Any]]:
    """The plot panels for these metric keys: ``[{"title", "name", "keys"}]`` in a fixed order.
    Per-env keys are left out: :func:`env_panels` draws them."""
    envs = envs_of(keys)
    taken: dict[str, list[str]] = {title: [] for title, _, _ in PANELS}
    own = []
    for key in keys:
        if env_metric(key, envs)[1] is not None:
            continue
        title = panel_title(key)
        if title is None:
            own.append(key)
        else:
            taken[title].append(key)
    result = [{"title": title, "name": name, "keys": taken[title]} for title, name, _ in PANELS if taken[title]]
    return result + [{"title": key, "name": _file_stem(key), "keys": [key]} for key in own]


def env_panels(keys: list[str]) -> list[dict[str, Any]]:
    """One panel per metric logged per env: ``{"title", "name", "metric", "keys", "labels"}``, its
    keys the overall curve (when logged) then one per env, labelled by env. In the order of the
    ordinary panels (reward, success, ...); none for a one-env run."""
    envs = envs_of(keys)
    per_metric: dict[str, list[str]] = {}
    for key in keys:
        metric, env = env_metric(key, envs)
        if env is not None:
            per_metric.setdefault(metric, []).append(key)
    ranks = {title: rank for rank, (title, _, _) in enumerate(PANELS)}
    order = sorted(per_metric, key=lambda m: ranks.get(panel_title(m) or "", len(ranks)))
    result = []
    for metric in order:
        env_keys = sorted(per_metric[metric], key=lambda k: envs.index(env_metric(k, envs)[1]))
        overall = [metric] if metric in keys else []
        result.append(
            {
                "title": f"{metric} by env",
                "name": _file_stem(metric),
                "metric": metric,
                "keys": overall + env_keys,
                "labels": [f"{metric} (all envs)"] * len(overall) + [env_metric(k, envs)[1] for k in env_keys],
            }
        )
    return result


def panel_title(key: str) -> str | None:
    """The title of the panel that takes ``key``, None when none does. A ``time/`` key is seconds spent
    in one part of the step whatever its name says (``time/score``: scoring), so only the time panel's."""
    if key.startswith("time/"):
        return _TIME_PARTS
    return next((title for title, _, takes in PANELS if takes(key)), None)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # bools too: a logged flag plots as 0/1


def _is_finite(value: Any) -> bool:
    return _is_number(value) and finite_number(value)  # an int too large for a float is not


def _finite(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return value if _is_finite(value) else None


def _file_stem(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in key)
