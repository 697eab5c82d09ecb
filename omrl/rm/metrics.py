"""How good a reward model's scores are on held-out labels: accuracy, AUC, calibration, pair accuracy."""

from __future__ import annotations

import math
from typing import Sequence

CALIBRATION_BINS = 10


def auc(scores: Sequence[float], positives: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance a random positive outscores a random negative (ties count
    half; Mann-Whitney). NaN when one class is missing.

    >>> auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False])
    0.75
    """
    pos = [s for s, p in zip(scores, positives) if p]
    neg = [s for s, p in zip(scores, positives) if not p]
    if not pos or not neg:
        return float("nan")
    # rank-sum with average ranks for ties: O(n log n)
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, p in zip(ranks, positives) if p)
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def expected_calibration_error(probs: Sequence[float], targets: Sequence[float], bins: int = CALIBRATION_BINS) -> float:
    """Mean |predicted - observed| over equal-width probability bins, weighted by their counts (Guo et al. 2017).

    >>> expected_calibration_error([0.9, 0.9, 0.1, 0.1], [1, 1, 0, 0])
    0.1
    """
    if not probs:
        return float("nan")
    sums: dict[int, list[float]] = {}
    for p, t in zip(probs, targets):
        b = min(int(p * bins), bins - 1)
        acc = sums.setdefault(b, [0.0, 0.0, 0.0])
        acc[0] += p
        acc[1] += t
        acc[2] += 1
    return round(sum(abs(s[0] - s[1]) for s in sums.values()) / len(probs), 12)


def binary_report(probs: Sequence[float], targets: Sequence[float]) -> dict[str, float]:
    """Scores that are probabilities against targets in [0, 1] (positive: target >= 0.5)."""
    n = len(probs)
    positives = [t >= 0.5 for t in targets]
    return {
        "examples": n,
        "positive_share": sum(positives) / n if n else float("nan"),
        "accuracy": sum((p >= 0.5) == y for p, y in zip(probs, positives)) / n if n else float("nan"),
        "auc": auc(probs, positives),
        "brier": sum((p - t) ** 2 for p, t in zip(probs, targets)) / n if n else float("nan"),
        "ece": expected_calibration_error(probs, targets),
    }


def regression_report(values: Sequence[float], targets: Sequence[float]) -> dict[str, float]:
    """Raw scores against real-valued targets: mean squared error and Pearson correlation."""
    n = len(values)
    if not n:
        return {"examples": 0, "mse": float("nan"), "pearson": float("nan")}
    mv, mt = sum(values) / n, sum(targets) / n
    cov = sum((v - mv) * (t - mt) for v, t in zip(values, targets))
    sv = math.sqrt(sum((v - mv) ** 2 for v in values))
    st = math.sqrt(sum((t - mt) ** 2 for t in targets))
    return {
        "examples": n,
        "mse": sum((v - t) ** 2 for v, t in zip(values, targets)) / n,
        "pearson": cov / (sv * st) if sv and st else float("nan"),
    }


def pair_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """Share of pairs whose better episode scores higher (ties count half)."""
    if not chosen:
        return float("nan")
    return sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)) / len(chosen)
