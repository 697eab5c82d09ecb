"""Evaluation metrics over played episodes, the rich table, and the JSON report.

pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large
Language Models Trained on Code"): with n samples of a task of which c
succeeded, pass@k = 1 - C(n - c, k) / C(n, k), averaged over tasks.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from omrl.atomic import atomic_write_text
from omrl.config.redaction import redact_text
from omrl.data.trajectory import END_REASONS, Episode, to_json
from omrl.env_errors import measured
from omrl.errors import OmrlError
from omrl.rollout.convert import generated_tokens, token_exact, truncated_turns
from omrl.rollout.spec import overlong


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


@contextmanager
def held_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Hold the warnings raised while episodes play, for :func:`replay_warnings` to show once it is
    known which episodes they speak of (all of them at once when playing fails)."""
    failed: BaseException | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield caught
        except BaseException as exc:  # noqa: BLE001 - shown, then raised again as it was
            failed = exc
    if failed is not None:
        replay_warnings(caught, [])
        raise failed


def replay_warnings(caught: Sequence[warnings.WarningMessage], episodes: Sequence[Episode]) -> None:
    """Show held warnings, but not "all rewards are 0" when no episode was measured: the env failed,
    and that is said on its own (an exit naming the reasons), not as advice to check the reward weights."""
    from omrl.rewards import ZeroRewardWarning

    for warning in caught:
        if issubclass(warning.category, ZeroRewardWarning) and episodes and not measured(episodes):
            continue
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def evaluate(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Every metric of a set of episodes (one or more samples per task), as a JSON-ready dict.

    Success, score, reward, pass@k and the format error and invalid action rates are over the
    :func:`measured` episodes only; ``env_errors``
    (and ``env_error_rate``) and ``overlong_prompts`` (where there are some) count the others beside
    them. Counting an env failure, or a prompt longer than the context, as a loss would report a dead
    server, or a setting, as a weak model.
    """
    if not episodes:
        raise OmrlError("no episodes to evaluate")
    turns = [t for ep in episodes for t in ep.turns]
    played = measured(episodes)
    # the replies' faults, over the measured episodes' turns: a turn an env or a broken template
    # failed (left unparsed, format_ok False) is not the model's format error
    judged = [t for ep in played for t in ep.turns]
    stepped = [t for t in judged if t.action is not None]
    # a game's seats are samples of different players: pass@k is over one seat's games of a task
    # (pooled, one of two zero-sum seats wins every game)
    by_task: dict[tuple[str, str, int, str], list[Episode]] = defaultdict(list)
    for ep in played:
        by_task[(ep.env, ep.split, ep.task_id, ep.info.get("seat", ""))].append(ep)
    samples = max((len(group) for group in by_task.values()), default=0)
    n, m, too_long = len(episodes), len(played), sum(overlong(ep) for ep in episodes)
    metrics: dict[str, Any] = {
        "episodes": n,
        "tasks": len({(ep.env, ep.split, ep.task_id) for ep in episodes}),
        "samples_per_task": samples,
        "success_rate": _rate(sum(ep.won for ep in played), m),
        "mean_score": _rate(sum(ep.score for ep in played), m),
        "mean_reward": _rate(sum(ep.total_reward for ep in played), m),
        "mean_turns": len(turns) / n,
        "invalid_action_rate": _rate(sum(bool(t.info.get("invalid")) for t in stepped), len(stepped)),
        "format_error_rate": _rate(sum(not t.format_ok for t in judged), len(judged)),
        "truncated_turn_rate": _rate(sum(truncated_turns(ep) for ep in episodes), len(turns)),
        "tokens_per_episode": sum(len(ep.token_ids) for ep in episodes) / n,
        "generated_tokens_per_episode": sum(generated_tokens(ep) for ep in episodes) / n,
        "env_errors": n - m - too_long,
        "env_error_rate": (n - m - too_long) / n,
        **({"overlong_prompts": too_long} if too_long else {}),  # the setting's failures: no model turn
        "not_token_exact": sum(not token_exact(ep) for ep in episodes),
        "end_reasons": {reason: count for reason, count in Counter(ep.end_reason for ep in episodes).items()},
        **tool_use(played),
        **tool_call_health(played),
    }
    if not by_task:  # every episode failed in the env: no rate of the model to report, not even 0%
        metrics.update(dict.fromkeys(UNMEASURED))
        return metrics
    for k in ks_for(samples):  # a task whose env failed some samples counts where it has k measured ones
        groups = [g for g in by_task.values() if len(g) >= k]
        metrics[f"pass@{k}"] = sum(pass_at_k(len(g), sum(ep.won for ep in g), k) for g in groups) / len(groups)
        if len(groups) < len(by_task):  # over fewer tasks than pass@1: it can fall as k grows, so say so
            metrics[f"pass@{k}_tasks"] = len(groups)
    metrics[f"best_of_{samples}_score"] = sum(max(ep.score for ep in g) for g in by_task.values()) / len(by_task)
    return metrics


#: the metrics over measured episodes, None (shown "-") when none was measured: a 0% would read as the model's
UNMEASURED = ("success_rate", "mean_score", "mean_reward", "invalid_action_rate", "format_error_rate")


def tool_use(episodes: Sequence[Episode]) -> dict[str, float]:
    """How the episodes used tools, read from the turns an env marked as tool calls (``info["tool"]``):
    ``tool_call_rate`` (the share of episodes with a call), ``tool_calls_per_episode`` and
    ``valid_tool_call_rate`` (the share of calls that ran without ``info["tool_error"]``: code that
    raised or timed out, bad arguments, a call over the limit). Empty when no turn called a tool, so an
    env without tools reports nothing about them."""
    calls = [[t.info for t in ep.turns if t.info.get("tool")] for ep in episodes]
    made = sum(len(c) for c in calls)
    if not made:
        return {}
    return {
        "tool_call_rate": sum(bool(c) for c in calls) / len(episodes),
        "tool_calls_per_episode": made / len(episodes),
        "valid_tool_call_rate": sum(not info.get("tool_error") for c in calls for info in c) / made,
    }


#: attempts whose call is lost: the reply meant a call that no parser can read
MALFORMED = ("invalid_json", "unclosed", "missing_name")


def tool_call_health(episodes: Sequence[Episode]) -> dict[str, float]:
    """How well the policy writes tool calls, over the turns that offered tools and had their attempts
    classified (``info["tool_calls"]``, by the rollout or the gateway; see :mod:`omrl.chat.tool_calls`):
    ``valid_call_turn_rate`` (the share of those turns with a well-formed call to an offered tool),
    ``tool_call_attempts`` (attempts per such turn), ``malformed_tool_call_rate`` (the share of attempts
    no parser can read) and ``tool_call_<status>_rate`` for each status. Empty where no turn offered tools."""
    from omrl.chat.tool_calls import STATUSES

    turns = [t.info["tool_calls"] for ep in episodes for t in ep.turns if isinstance(t.info.get("tool_calls"), list)]
    if not turns:
        return {}
    statuses = [a.get("status") for calls in turns for a in calls if isinstance(a, dict)]
    out = {
        "valid_call_turn_rate": sum(any(a.get("status") == "ok" for a in calls) for calls in turns) / len(turns),
        "tool_call_attempts": len(statuses) / len(turns),
        "malformed_tool_call_rate": _rate(sum(s in MALFORMED for s in statuses), len(statuses)),
    }
    out.update({f"tool_call_{status}_rate": _rate(statuses.count(status), len(statuses)) for status in STATUSES})
    return out


def _rate(count: int, total: int) -> float:
    return count / total if total else 0.0


def episodes_by_env(episodes: Sequence[Episode]) -> dict[str, list[Episode]]:
    """The episodes of each env (``Episode.env``), envs in the order they first appear."""
    out: dict[str, list[Episode]] = {}
    for ep in episodes:
        out.setdefault(ep.env, []).append(ep)
    return out


def evaluate_by_env(
    episodes: Sequence[Episode], overall: dict[str, Any], extra: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A mixture's metrics per env and averaged two ways, for the report's ``per_env``, ``macro`` and ``micro``.

    ``per_env``: :func:`evaluate` of each env's episodes, plus that env's ``extra`` metrics (its reward
    terms). ``macro``: the mean over envs of every rate and mean (a float) all envs have, each env
    counting alike however many episodes it played; ``micro``: the same keys from ``overall`` (the run's
    metrics over every episode, which stay the report's top-level ``metrics``). An env with no measured
    episode (every one failed in the env) has its rates None and is left out of ``macro``: its name goes
    in ``macro_left_out``, present only then. With no env measured, ``macro`` and ``micro`` are empty.
    """
    per_env = {env: {**evaluate(mine), **(extra or {}).get(env, {})} for env, mine in episodes_by_env(episodes).items()}
    left_out = [env for env, metrics in per_env.items() if metrics["success_rate"] is None]
    averaged = [metrics for env, metrics in per_env.items() if env not in left_out]
    shared = (
        [key for key in averaged[0] if all(_averaged(metrics.get(key)) for metrics in averaged)] if averaged else []
    )
    return {
        "per_env": per_env,
        "macro": {key: sum(metrics[key] for metrics in averaged) / len(averaged) for key in shared},
        "micro": {key: overall[key] for key in shared if key in overall},
        **({"macro_left_out": left_out} if left_out else {}),
    }


def _averaged(value: Any) -> bool:
    """Rates and means are floats; counts (episodes, env_errors) and labels are not averaged over envs."""
    return isinstance(value, float)


PERCENT = {
    "success_rate",
    "invalid_action_rate",
    "format_error_rate",
    "truncated_turn_rate",
    "env_error_rate",
    "tool_call_rate",
    "valid_tool_call_rate",
    "valid_call_turn_rate",
    "malformed_tool_call_rate",
}


def shown_metric(key: str, value: Any) -> str:
    """A metric's value as the tables show it: rates as percentages, floats to 3 decimals, "-" for a
    rate nothing measured (None)."""
    if value is None:
        return "-"
    if key in PERCENT or (key.startswith("pass@") and not key.endswith("_tasks")):
        return f"{100 * value:.1f}%"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def metrics_table(metrics: dict[str, Any], title: str = "evaluation"):
    """A rich Table of the metrics (rates as percentages, end reasons one per row)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if key == "end_reasons":
            for reason in sorted(value, key=lambda r: END_REASONS.index(r) if r in END_REASONS else 99):
                table.add_row(f"ended: {reason}", str(value[reason]))
        else:
            table.add_row(key, shown_metric(key, value))
    return table


# the per-env table's columns (the report has every metric): metric key, header
ENV_COLUMNS = (
    ("episodes", "eps"),
    ("success_rate", "success"),
    ("mean_score", "score"),
    ("mean_reward", "reward"),
    ("format_error_rate", "fmt err"),
    ("env_error_rate", "env err"),
)


def env_table(by_env: dict[str, Any], title: str = "per env"):
    """A rich Table of :func:`evaluate_by_env`: a row per env, then ``macro`` (each env alike) and
    ``micro`` (each episode alike), a column per main metric and per pass@k beyond pass@1."""
    from rich import box
    from rich.table import Table

    per_env = by_env["per_env"]
    passes = [key for key in by_env["macro"] if key.startswith("pass@") and key != "pass@1"]
    columns = [*ENV_COLUMNS, *((key, key) for key in passes)]
    # no outer edge, one space between columns, env names whole: reasoning-gym:basic_arithmetic and six
    # columns fit 80 characters
    caption = "macro: the mean of the envs' values; micro: over every episode"
    if any(f"{key}_tasks" in metrics for key in passes for metrics in per_env.values()):
        caption += "; pass@k (n): over the n tasks with k samples the env did not fail"
    if by_env.get("macro_left_out"):
        caption += f"; macro leaves out {', '.join(by_env['macro_left_out'])} (no episode measured)"
    table = Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True
    )
    table.add_column("env", no_wrap=True)
    for _, header in columns:
        table.add_column(header, justify="right", no_wrap=True)
    rows = [*per_env.items(), ("macro", by_env["macro"]), ("micro", by_env["micro"])]
    for label, metrics in rows:
        table.add_row(label, *(_cell(key, metrics) if key in metrics else "" for key, _ in columns))
    return table


def _cell(key: str, metrics: dict[str, Any]) -> str:
    """A metric in the per-env table; a pass@k over fewer tasks than the env measured says how many: "75.0% (3)"."""
    tasks = metrics.get(f"{key}_tasks")
    return shown_metric(key, metrics[key]) + (f" ({tasks})" if tasks is not None else "")


def write_report(
    path: str | Path,
    metrics: dict[str, Any],
    episodes: Sequence[Episode],
    config: dict[str, Any] | None = None,
    by_env: dict[str, Any] | None = None,
) -> Path:
    """Write the JSON report (metrics, config, one summary line per episode) atomically. A mixture's
    report adds ``by_env`` (:func:`evaluate_by_env`: ``per_env``, ``macro``, ``micro``) beside the
    metrics, and each episode's line names its env; a single env's report has neither."""
    report = {
        "metrics": metrics,
        **(by_env or {}),
        "config": config or {},
        "episodes": [
            {
                **({"env": ep.env} if by_env else {}),
                "task_id": ep.task_id,
                "sample": ep.sample,
                "won": ep.won,
                "score": ep.score,
                "turns": ep.num_turns,
                "end_reason": ep.end_reason,
                "error": redact_text(ep.error),  # an env's error may quote a command with its --api-key
                "reward": ep.total_reward,
            }
            for ep in episodes
        ],
    }
    path = Path(path)
    atomic_write_text(path, to_json(report, indent=2) + "\n")  # strict JSON: no NaN, no lone surrogate
    return path
