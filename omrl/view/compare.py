"""Two evals side by side (``omrl view evals/A evals/B``): their metrics with the difference, and per
task the episodes whose outcome changed, each a link into its own side's pages.

Episodes pair up by env, split, task id and sample number: the k-th sample of a task in one eval
against the k-th in the other. Samples of one task are drawn alike, so a pair that changed says
little alone; the task's wins on either side (and the changed pairs of every task together) say
more. An outcome is "won", "lost" or "env error" (an env failure measured nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.view.evals import ENV_ERROR
from omrl.view.sources import Problem
from omrl.view.store import EpisodeStore

SIDES = ("a", "b")
MAX_CHANGED_TASKS = 1000  # tasks listed with their changed episodes


class Comparison:
    """Two stores, ``a`` and ``b``, and what the compare page shows of them."""

    def __init__(self, a: EpisodeStore, b: EpisodeStore):
        self.sides = {"a": a, "b": b}

    def names(self) -> dict[str, str]:
        """Each side's name on the page: its path's name, with its folder when both names are alike
        (``evals/A/episodes.parquet`` against ``evals/B/episodes.parquet``)."""
        paths = {side: store.source.path for side, store in self.sides.items()}
        names = {side: path.name for side, path in paths.items()}
        if names["a"] == names["b"]:
            names = {side: _tail(path, paths["b" if side == "a" else "a"]) for side, path in paths.items()}
        return names

    def problems(self) -> list[Problem]:
        """What makes the two sides no like-for-like comparison: they played other envs (their differences
        then compare other tasks)."""
        envs = {side: _envs(store) for side, store in self.sides.items()}
        if envs["a"] == envs["b"]:
            return []
        played = "; ".join(f"{side.upper()}: {', '.join(names) or 'none named'}" for side, names in envs.items())
        return [
            Problem(
                "A vs B",
                f"the two sides played other envs ({played}): their metrics' differences compare other tasks",
                level="warning",
            )
        ]

    def overview(self) -> dict[str, Any]:
        """The compare page's data: each side, the metrics with their difference (b - a), and the tasks
        whose episodes changed outcome."""
        names = self.names()
        metrics, notes = {}, []
        for side, store in self.sides.items():
            metrics[side], where = side_metrics(store)
            notes.append(f"{side.upper()} ({names[side]}): {where}")
        return {
            "kind": "compare",
            "title": f"{names['a']} vs {names['b']}",
            "path": f"{self.sides['a'].source.path}  ·  {self.sides['b'].source.path}",
            "sides": {
                side: {"name": names[side], "path": str(store.source.path), "episodes": len(store.summaries)}
                for side, store in self.sides.items()
            },
            "metrics_from": notes,
            "metrics": metric_rows(metrics["a"], metrics["b"]),
            "problems": [
                {**problem.as_dict(), "file": f"{side.upper()}: {problem.file}"}
                for side, store in self.sides.items()
                for problem in store.problems
            ]
            + [problem.as_dict() for problem in self.problems()],
            **changed_tasks(self.sides["a"].summaries, self.sides["b"].summaries),
        }


def _envs(store: EpisodeStore) -> list[str]:
    return sorted({summary["env"] for summary in store.summaries if summary["env"]})


def side_metrics(store: EpisodeStore) -> tuple[dict[str, Any], str]:
    """One side's metrics, flat (``end_reasons: done``), and where they come from: its eval report, or,
    without one, a few computed from its episodes."""
    if store.reports:
        report = store.reports[0]
        more = f" (the first of its {len(store.reports)} reports)" if len(store.reports) > 1 else ""
        return _flat(report["metrics"]), f"the eval report {report['file']}{more}"
    measured = [e for e in store.summaries if e["end"] != ENV_ERROR]

    def mean(key: str) -> float | None:  # None: nothing measured (no episodes, or all env errors), not 0%
        return sum(e[key] for e in measured) / len(measured) if measured else None

    computed = {
        "episodes": len(store.summaries),
        "success_rate": mean("won"),
        "mean_score": mean("score"),
        "mean_reward": mean("reward"),
        "env_errors": len(store.summaries) - len(measured),
    }
    return computed, "no eval report: computed from its episodes"


def metric_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per metric of either side (a's order, then b's own): both values and b - a where both are numbers.

    >>> metric_rows({"success_rate": 0.5, "x": "s"}, {"success_rate": 0.75, "pass@2": 1.0})
    [{'metric': 'success_rate', 'a': 0.5, 'b': 0.75, 'diff': 0.25}, {'metric': 'x', 'a': 's', 'b': None, \
'diff': None}, {'metric': 'pass@2', 'a': None, 'b': 1.0, 'diff': None}]
    """
    rows = []
    for key in [*a, *(k for k in b if k not in a)]:
        va, vb = a.get(key), b.get(key)
        diff = vb - va if _number(va) and _number(vb) else None
        rows.append({"metric": key, "a": va, "b": vb, "diff": diff})
    return rows


def outcome(summary: dict[str, Any]) -> str:
    """ "won", "lost" or "env error"."""
    return "env error" if summary["end"] == ENV_ERROR else "won" if summary["won"] else "lost"


def changed_tasks(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task (env, split, task id) on both sides: each side's wins, and the samples whose outcome
    differs. Only tasks with a change are listed (the first :data:`MAX_CHANGED_TASKS`); the counts
    cover them all."""
    tasks = {side: _by_task(summaries) for side, summaries in zip(SIDES, (a, b))}
    both = [key for key in tasks["a"] if key in tasks["b"]]
    rows, flips, changed_count = [], {"won_to_lost": 0, "lost_to_won": 0, "other": 0}, 0
    for key in both:
        samples = {side: {s["sample"]: s for s in reversed(tasks[side][key])} for side in SIDES}  # the first of a pair
        changed = []
        for sample, first in sorted(samples["a"].items()):
            second = samples["b"].get(sample)
            if second is None or outcome(first) == outcome(second):
                continue
            pair = (outcome(first), outcome(second))
            name = {("won", "lost"): "won_to_lost", ("lost", "won"): "lost_to_won"}.get(pair, "other")
            flips[name] += 1
            changed.append({"sample": sample, "a": first["id"], "b": second["id"], "from": pair[0], "to": pair[1]})
        changed_count += bool(changed)
        if changed and len(rows) < MAX_CHANGED_TASKS:
            env, split, task = key
            rows.append(
                {
                    "env": env,
                    "split": split,
                    "task": task,
                    **{side: _wins(tasks[side][key]) for side in SIDES},
                    "changed": changed,
                }
            )
    return {
        "tasks": {
            "both": len(both),
            "only_a": sum(key not in tasks["b"] for key in tasks["a"]),
            "only_b": sum(key not in tasks["a"] for key in tasks["b"]),
            "changed": changed_count,
            "listed": len(rows),
        },
        "flips": flips,
        "changed": rows,
    }


def _by_task(summaries: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    tasks: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for summary in summaries:
        tasks.setdefault((summary["env"], summary["split"], summary["task"]), []).append(summary)
    return tasks


def _wins(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [s for s in summaries if s["end"] != ENV_ERROR]
    return {"won": sum(bool(s["won"]) for s in measured), "n": len(measured), "group": summaries[0]["group"]}


def _flat(metrics: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update({f"{key}: {sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tail(path: Path, other: Path) -> str:
    """``path`` by as many of its last parts as tell it from ``other``."""
    for depth in range(2, len(path.parts) + 1):
        if path.parts[-depth:] != other.parts[-depth:]:
            return str(Path(*path.parts[-depth:]))
    return str(path)
