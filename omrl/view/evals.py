"""What the page says of evaluated episodes: the answer an env expected, each task's pass@k, and
each reward component's sum.

An eval's episodes were never trained on; what tells a reader how the model did is whether each
answer matched the expected one, and, with several samples a task, how often. The pass@k here is
the report's own estimator (:func:`omrl.evaluation.pass_at_k`), per task instead of averaged, over
the episodes that measured the model (an ``env_error`` is neither a win nor a loss).
"""

from __future__ import annotations

from typing import Any

from omrl.evaluation import ks_for, pass_at_k

# The turn info keys an env puts its accepted answer(s) under: the answer rewards read the first two
# (omrl_plugins.rewards.outcome.GROUND_TRUTH_KEYS; not imported, the viewer loads no plugin).
EXPECTED_KEYS = ("ground_truth", "answer", "expected")
ENV_ERROR = "env_error"
MAX_TASK_ROWS = 1000  # rows of the overview's per-task table


def expected_answer(infos: list[dict[str, Any]]) -> str | list[str] | None:
    """The answer the env expected, from the last turn's info that records one (a list when several
    answers count); None when no turn records one.

    >>> expected_answer([{"ground_truth": "7"}, {"won": True, "ground_truth": ["7", "seven"]}])
    ['7', 'seven']
    >>> expected_answer([{"answer": 42}, {}])
    '42'
    >>> expected_answer([{"won": False}]) is None
    True
    """
    for info in reversed(infos):
        for key in EXPECTED_KEYS:
            value = info.get(key)
            if isinstance(value, (list, tuple)):
                return [str(v) for v in value] if value else None
            if value is not None and not isinstance(value, dict):
                return str(value)
    return None


def component_sums(rewards: Any) -> dict[str, float]:
    """Each reward component summed over an episode's turns (``rewards`` as a row holds it: a list of
    ``(name, per-turn values)`` pairs, or a dict).

    >>> component_sums([("format", [0.1, 0.1]), ("total", [0.1, None])])
    {'format': 0.2, 'total': 0.1}
    """
    pairs = rewards.items() if isinstance(rewards, dict) else rewards or []
    return {name: float(sum(v for v in values or [] if v is not None)) for name, values in pairs}


def passes(summaries: list[dict[str, Any]], ks: list[int] | None = None) -> dict[str, Any]:
    """One task's samples as the page shows them: ``n`` (those that measured the model), ``won`` and
    ``pass`` (``[{"k", "value"}]``, for ``ks`` or every k from 1 to n; k above n is left out).

    >>> passes([{"won": True, "end": "done"}, {"won": False, "end": "done"}, {"won": False, "end": "env_error"}])
    {'n': 2, 'won': 1, 'env_errors': 1, 'pass': [{'k': 1, 'value': 0.5}, {'k': 2, 'value': 1.0}]}
    """
    measured = [s for s in summaries if s["end"] != ENV_ERROR]
    n, won = len(measured), sum(bool(s["won"]) for s in measured)
    chosen = range(1, n + 1) if ks is None else [k for k in ks if k <= n]
    return {
        "n": n,
        "won": won,
        "env_errors": len(summaries) - n,
        "pass": [{"k": k, "value": pass_at_k(n, won, k)} for k in chosen],
    }


def task_table(summaries: list[dict[str, Any]], include: set[int]) -> dict[str, Any] | None:
    """Per task (env, split, task id) of the files numbered in ``include`` (an eval's or a rollout's, not a
    training run's step rollouts, whose samples of one task come from models of different steps): its
    samples, wins and pass@k at the report's k (1, 2, 4, ... and the most samples of a task); None when no
    task has two samples to estimate it from."""
    tasks: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for summary in summaries:
        if summary["file"] in include:
            tasks.setdefault((summary["file"], summary["env"], summary["split"], summary["task"]), []).append(summary)
    most = max((sum(s["end"] != ENV_ERROR for s in group) for group in tasks.values()), default=0)
    if most < 2:
        return None
    ks = ks_for(most)
    rows = []
    for (file, env, split, task), group in list(tasks.items())[:MAX_TASK_ROWS]:
        keys = {s["group"] for s in group}
        rows.append(
            {
                "file": file,
                "env": env,
                "split": split,
                "task": task,
                "group": group[0]["group"] if len(keys) == 1 else None,  # a link to the samples side by side
                "mean_reward": sum(s["reward"] for s in group) / len(group),
                **passes(group, ks),
            }
        )
    return {"ks": ks, "rows": rows, "tasks": len(tasks)}
