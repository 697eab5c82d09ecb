"""``omrl rm eval``: how well a reward model scores held-out trajectories, and how well it picks.

Two parts:

- **Scores**: the model's score at every labelled position against the label its
  kind was trained on: accuracy, AUC, Brier score and calibration error for
  probabilities (``bce``), mean squared error and correlation for values; for an
  ``orm`` also the share of same-task pairs it orders right.
- **Selection** (``orm``, or a ``prm`` by its last turn's score): with G samples of a
  task in the file, best-of-N for N = 1, 2, 4, ... G by the first N samples of each
  task: the success of the one the model ranks highest, against a random pick (their
  mean success: pass@1) and the oracle (any of them won: pass@N), each with its
  standard error over tasks, and the gain over random with its paired standard error; the
  same for the env's score (``*_score``: partial credit, where success is rare).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from omrl.atomic import atomic_write_text
from omrl.data.trajectory import Episode, to_json
from omrl.rm.data import load_examples
from omrl.rm.labels import NO_OUTCOME, pairs
from omrl.rm.metrics import auc, binary_report, pair_accuracy, regression_report
from omrl.rm.model import RewardModel, ScoringInput


def evaluate_reward_model(
    model_path: str | Path, data: str, text: bool = False, reward_model: RewardModel | None = None
) -> dict[str, Any]:
    """The report of the reward model at ``model_path`` on the trajectory files at ``data``."""
    rm = reward_model or RewardModel.load(model_path)
    found, episodes, _ = load_examples(
        data,
        rm.kind,
        rm.label,
        max_seq_length=1 << 30,
        text_tokenizer=rm.tokenizer if text else None,
        for_training=False,
    )
    if not text:
        rm.check_tokenizer(episodes)
    values = rm.values([ScoringInput(ex.input_ids, ex.positions) for ex in found])
    flat_values = [v for vals in values for v in vals]
    targets = [t for ex in found for t in ex.targets]
    report: dict[str, Any] = {
        "model": str(model_path),
        "data": str(data),
        "kind": rm.kind,
        "objective": rm.objective,
        "label": rm.label,
        "text": bool(text),  # re-encoded with the reward model's tokenizer, or the episodes' own ids
    }
    if rm.objective == "bce":
        report["scores"] = binary_report([rm.to_score(v) for v in flat_values], targets)
    elif rm.objective == "bt":  # values only rank: their scale means nothing against the labels
        report["scores"] = {"examples": len(targets), "auc": auc(flat_values, [t >= 0.5 for t in targets])}
    else:
        report["scores"] = {
            **regression_report(flat_values, targets),
            "auc": auc(flat_values, [t >= 0.5 for t in targets]),
        }
    # a measure undefined on this data (auc of one outcome) is None: no NaN in the table or in the JSON
    report["scores"] = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in report["scores"].items()
    }
    if rm.kind == "orm":
        by_id = {id(ex): vals[0] for ex, vals in zip(found, values)}
        found_pairs = pairs(found, max_pairs_per_task=1 << 30)
        report["pairs"] = {
            "pairs": len(found_pairs),
            # no pair (every task's episodes earned alike): no accuracy, not a NaN in the table and the JSON
            "accuracy": pair_accuracy(
                [by_id[id(p.chosen)] for p in found_pairs], [by_id[id(p.rejected)] for p in found_pairs]
            )
            if found_pairs
            else None,
        }
    finished = [ep for ep in episodes if ep.turns and ep.end_reason not in NO_OUTCOME]
    report["selection"] = selection_curve(finished, rm.score_episodes(finished, text=text))
    return report


def selection_curve(episodes: Sequence[Episode], scores: Sequence[float]) -> list[dict[str, float]]:
    """Best-of-N success (and env score) of the pick by ``scores``, a random pick and the oracle, for
    N = 1, 2, 4, ... up to the fewest samples any task has (tasks with one sample only are left out)."""
    by_task: dict[tuple, list[tuple[Episode, float]]] = defaultdict(list)
    for ep, score in zip(episodes, scores):
        by_task[(ep.env, ep.split, ep.task_id)].append((ep, score))
    groups = [sorted(g, key=lambda pair: pair[0].sample) for g in by_task.values() if len(g) > 1]
    if not groups:
        return []
    most = min(len(g) for g in groups)
    out, n = [], 1
    while n <= most:
        row: dict[str, float] = {"n": n, "tasks": len(groups)}
        for measure, value in (("", lambda ep: float(ep.won)), ("_score", lambda ep: float(ep.score))):
            picked, random_pick, oracle = [], [], []
            for group in groups:
                first = group[:n]
                best = max(range(n), key=lambda i: (first[i][1], -i))  # the first of equal scores
                picked.append(value(first[best][0]))
                random_pick.append(sum(value(ep) for ep, _ in first) / n)
                oracle.append(max(value(ep) for ep, _ in first))
            gain = [p - r for p, r in zip(picked, random_pick)]  # paired by task: the gain's own standard error
            row.update(
                {
                    **_mean_se(f"selected{measure}", picked),
                    **_mean_se(f"random{measure}", random_pick),
                    **_mean_se(f"oracle{measure}", oracle),
                    **_mean_se(f"gain{measure}", gain),
                }
            )
        out.append(row)
        n *= 2
    return out


def _mean_se(name: str, values: Sequence[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return {name: mean, f"{name}_se": math.sqrt(var / len(values))}


def write_rm_report(report: dict[str, Any], path: str | Path) -> Path:
    """The report as JSON, written atomically."""
    path = Path(path)
    atomic_write_text(path, to_json(report, indent=2) + "\n")
    return path
