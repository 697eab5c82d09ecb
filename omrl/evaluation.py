"""Evaluation metrics over played episodes, the rich table, and the JSON report.

pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large
Language Models Trained on Code"): with n samples of a task of which c
succeeded, pass@k = 1 - C(n - c, k) / C(n, k), averaged over tasks.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Sequence

from omrl.data.trajectory import END_REASONS, Episode, to_json
from omrl.errors import OmrlError
from omrl.atomic import atomic_write_text
from omrl.rollout.convert import generated_tokens, token_exact, truncated_turns


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct.

    >>> round(pass_at_k(5, 2, 1), 4)
    0.4
    >>> round(pass_at_k(5, 2, 2), 4)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    0.7
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise OmrlError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the same value without huge binomials
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(samples: int) -> list[int]:
    """The k values reported for ``samples`` samples per task: 1, 2, 4, ... and ``samples`` itself."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return [*ks, samples]


def evaluate(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Every metric of a set of episodes (one or more samples per task), as a JSON-ready dict."""
    if not episodes:
        raise OmrlError("no episodes to evaluate")
    turns = [t for ep in episodes for t in ep.turns]
    stepped = [t for t in turns if t.action is not None]
    by_task: dict[tuple[str, str, int], list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_task[(ep.env, ep.split, ep.task_id)].append(ep)
    samples = min(len(group) for group in by_task.values())
    n = len(episodes)
    metrics: dict[str, Any] = {
        "episodes": n,
        "tasks": len(by_task),
        "samples_per_task": samples,
        "success_rate": sum(ep.won for ep in episodes) / n,
        "mean_score": sum(ep.score for ep in episodes) / n,
        "mean_reward": sum(ep.total_reward for ep in episodes) / n,
        "mean_turns": len(turns) / n,
        "invalid_action_rate": _rate(sum(bool(t.info.get("invalid")) for t in stepped), len(stepped)),
        "format_error_rate": _rate(sum(not t.format_ok for t in turns), len(turns)),
        "truncated_turn_rate": _rate(sum(truncated_turns(ep) for ep in episodes), len(turns)),
        "tokens_per_episode": sum(len(ep.token_ids) for ep in episodes) / n,
        "generated_tokens_per_episode": sum(generated_tokens(ep) for ep in episodes) / n,
        "env_errors": sum(ep.end_reason == "env_error" for ep in episodes),
        "not_token_exact": sum(not token_exact(ep) for ep in episodes),
        "end_reasons": {reason: count for reason, count in Counter(ep.end_reason for ep in episodes).items()},
    }
    for k in ks_for(samples):
        metrics[f"pass@{k}"] = sum(pass_at_k(len(g), sum(ep.won for ep in g), k) for g in by_task.values()) / len(by_task)
    metrics[f"best_of_{samples}_score"] = sum(max(ep.score for ep in g) for g in by_task.values()) / len(by_task)
    return metrics


def _rate(count: int, total: int) -> float:
    return count / total if total else 0.0


def metrics_table(metrics: dict[str, Any], title: str = "evaluation"):
    """A rich Table of the metrics (rates as percentages, end reasons one per row)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    percent = {"success_rate", "invalid_action_rate", "format_error_rate", "truncated_turn_rate"}
    for key, value in metrics.items():
        if key == "end_reasons":
            for reason in sorted(value, key=lambda r: END_REASONS.index(r) if r in END_REASONS else 99):
                table.add_row(f"ended: {reason}", str(value[reason]))
        elif key in percent or key.startswith("pass@"):
            table.add_row(key, f"{100 * value:.1f}%")
        elif isinstance(value, float):
            table.add_row(key, f"{value:.3f}")
        else:
            table.add_row(key, str(value))
    return table


def write_report(path: str | Path, metrics: dict[str, Any], episodes: Sequence[Episode],
                 config: dict[str, Any] | None = None) -> Path:
    """Write the JSON report (metrics, config, one summary line per episode) atomically."""
    report = {
        "metrics": metrics,
        "config": config or {},
        "episodes": [
            {"task_id": ep.task_id, "sample": ep.sample, "won": ep.won, "score": ep.score, "turns": ep.num_turns,
             "end_reason": ep.end_reason, "error": ep.error, "reward": ep.total_reward}
            for ep in episodes
        ],
    }
    path = Path(path)
    atomic_write_text(path, to_json(report, indent=2) + "\n")  # strict JSON: no NaN, no lone surrogate
    return path
