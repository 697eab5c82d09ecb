"""``MetricsLogger``: where every recipe's metrics go.

- ``<output_dir>/metrics.jsonl``: one JSON line per logged step, flushed at once. A run
  that resumes from step k first drops the lines after step k (the killed run logged
  steps it never checkpointed; they are trained again), so no step appears twice.
- TensorBoard (``<output_dir>/tensorboard``, :mod:`omrl.training.board`) when ``logging.tensorboard``
  is on and tensorboard is installed.
- wandb when ``logging.wandb_project`` is set and wandb is installed (the run id is
  kept in ``<output_dir>/wandb_run_id`` so a resumed run continues the same wandb run).
- A rich progress bar with a live metrics line on a terminal; elsewhere (CI, a log
  file) one plain line per logged step.

The recipe calls :meth:`MetricsLogger.log` after every optimizer step with whatever it
measured (loss, lr, tokens_per_s, step_time, reward, success, kl, entropy, ...); the
logger writes every ``logging.logging_steps`` steps and at the last step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from omrl.atomic import atomic_write_text, naming
from omrl.config.options import LoggingConfig
from omrl.env_errors import measured
from omrl.errors import OmrlError, short_repr
from omrl.evaluation import tool_call_health, tool_use
from omrl.rollout.spec import overlong

METRICS_FILE = "metrics.jsonl"
HEARTBEAT = "heartbeat"  # the key of a heartbeat record in metrics.jsonl
#: What recipes call after each step's logging and checkpoint: ``fn(step, metrics)``.
StepCallback = Callable[[int, dict[str, float]], None]
# Shown first on the progress line, in this order; other metrics follow in the order given.
#: what a step's console line shows (all of them go to metrics.jsonl, TensorBoard and wandb)
HEADLINE = ("loss", "reward", "success", "eval_success", "kl", "grad_norm", "lr", "step_time", "skipped_updates")


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (what a machine's RAM must hold).

    On Linux the high-water mark of this process's own memory (``VmHWM``): ``ru_maxrss`` outlives an
    ``exec``, so a run started from a larger process (a notebook, a sweep's driver) would report that
    process's peak as its own."""
    import resource
    import sys

    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 / 1e9 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):  # no procfs (macOS) or no such line
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9


def peak_memory() -> dict[str, float]:
    """``peak_rss_gb`` and, once this process has used a GPU, ``peak_gpu_gb``: the most GPU memory
    its tensors have held so far (torch's allocator; the GPU's own total is higher by the cache)."""
    import torch

    out = {"peak_rss_gb": peak_rss_gb()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


def rollout_metrics(episodes, seconds: float, reward_summary: dict[str, float]) -> dict[str, float]:
    """Means over a rollout's episodes (reward, success and score over those that did not fail in the
    env and got a model turn; turns, response tokens, well-formed replies over all), env errors (a count
    and a share), the episodes whose opening prompt did not fit the context (``overlong_prompts``),
    generation speed, each reward term's mean (``reward_<name>``), and the rows
    the chat history made: ``rows_per_episode`` (1 unless ``as_template`` split episodes) and
    ``prefix_breaks`` (how many new rows it started, summed)."""
    n = max(1, len(episodes))
    # the others measured no model: the env failed, or the opening prompt left no room in the context
    played = measured(episodes)
    too_long = sum(overlong(ep) for ep in episodes)
    m = max(1, len(played))
    turns = sum(ep.num_turns for ep in episodes)
    generated = sum(sum(ep.loss_mask) for ep in episodes)
    metrics = {
        "reward": sum(ep.total_reward for ep in played) / m,
        "success": sum(ep.won for ep in played) / m,
        "score": sum(ep.score for ep in played) / m,
        "turns": turns / n,
        "response_tokens": generated / n,
        "format_ok": sum(t.format_ok for ep in episodes for t in ep.turns) / max(1, turns),
        "env_errors": float(len(episodes) - len(played) - too_long),
        "env_error_rate": (len(episodes) - len(played) - too_long) / n,
        "overlong_prompts": float(too_long),
        "tokens_per_s": generated / max(seconds, 1e-9),
        "rollout_time": seconds,
        "rows_per_episode": sum(1 + len(ep.row_starts) for ep in episodes) / n,
        "prefix_breaks": float(sum(len(ep.row_starts) for ep in episodes)),
        **cut_counts(episodes),
    }
    metrics.update({f"reward_{k}": float(v) for k, v in reward_summary.items()})
    metrics.update(tool_use(played))
    metrics.update(tool_call_health(played))
    return metrics


#: the token ledger: each way a rollout cuts an episode short, by the end reason it records
#: (``Episode.end_reason``; a search's ``budget``), and the replies cut at their token cap
CUTS = {"cut_max_context": "max_context", "cut_max_turns": "max_turns", "cut_budget": "budget"}


def cut_counts(episodes: list[Any]) -> dict[str, float]:
    """The token ledger of a rollout, as counts: ``cut_replies`` (replies cut at ``generation.max_new_tokens``,
    the room left in the context, or, behind the gateway, the agent's own ``max_tokens``), and the episodes cut at the context window (``cut_max_context``),
    the turn cap (``cut_max_turns``) or a search's token budget (``cut_budget``). Nothing is cut silently."""
    replies = sum(bool(t.info.get("rollout", {}).get("truncated")) for ep in episodes for t in ep.turns)
    ends = [ep.end_reason for ep in episodes]
    return {"cut_replies": float(replies), **{key: float(ends.count(reason)) for key, reason in CUTS.items()}}


#: per-env metrics that are counts (they add up over envs and processes); the others are means
PER_ENV_COUNTS = (
    "episodes",
    "env_errors",
    "overlong_prompts",
    "prefix_breaks",
    "prefill_tokens",
    "prefill_reused",
    "cut_replies",
    *CUTS,
)


def per_env_metrics(
    episodes: list[Any], seconds: float, summaries: dict[str, dict[str, float]], envs: list[str]
) -> dict[str, float]:
    """Each of :func:`rollout_metrics` for each env's episodes, named ``<metric>/<env>`` (``success/webshop``),
    with ``episodes/<env>``, and the prompt tokens the engine computed and took from its cache for the
    env's turns (``prefill_tokens/<env>``, ``prefill_reused/<env>``, ``prefill_hit_rate/<env>``, where
    the backend tells them per prompt). Speeds (``tokens_per_s``, decode and prefill tokens a second)
    and ``rollout_time`` are the rollout's only: every env's episodes share its generate calls, so a
    per-env speed would be made up. Weighted by ``episodes/<env>`` (by the episodes that did not fail
    in the env, for reward, success and score), the means add up to the overall metrics."""
    out: dict[str, float] = {}
    for env in envs:
        mine = [ep for ep in episodes if ep.env == env]
        if not mine:
            continue
        metrics = rollout_metrics(mine, seconds, summaries.get(env, {}))
        del metrics["tokens_per_s"], metrics["rollout_time"]
        metrics["episodes"] = float(len(mine))
        metrics.update(prefill_counts(mine))
        out.update({f"{key}/{env}": value for key, value in metrics.items()})
    return out


def prefill_counts(episodes: list[Any]) -> dict[str, float]:
    """The prompt tokens computed and reused for these episodes' turns, from what each turn recorded
    (``info["rollout"]``); nothing when the backend did not tell them per prompt."""
    recorded = [t.info["rollout"] for ep in episodes for t in ep.turns if "prefill_reused" in t.info.get("rollout", {})]
    if not recorded:
        return {}
    computed = sum(r["prefill_tokens"] for r in recorded)
    reused = sum(r["prefill_reused"] for r in recorded)
    out = {"prefill_tokens": float(computed), "prefill_reused": float(reused)}
    if computed + reused:
        out["prefill_hit_rate"] = reused / (computed + reused)
    return out


def board_tag(key: str) -> str:
    """A metric's TensorBoard tag: the held-out evaluation's (``eval_*``) under ``eval/``, the rest under ``train/``."""
    return f"eval/{key[len('eval_') :]}" if key.startswith("eval_") else f"train/{key}"


class MetricsLogger:
    """Metrics to metrics.jsonl, TensorBoard, wandb and the console. Use as a context manager."""

    def __init__(
        self,
        output_dir: str | os.PathLike,
        cfg: LoggingConfig,
        total_steps: int,
        *,
        start_step: int = 0,
        run_config: dict[str, Any] | None = None,
        console: Console | None = None,
        description: str = "train",
    ):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.every = max(1, cfg.logging_steps)
        self.total_steps = total_steps
        self.console = console or Console(stderr=True)
        self.path = self.output_dir / METRICS_FILE
        _truncate_after(self.path, start_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._writing = threading.Lock()  # the supervisor's heartbeat writes from its own thread
        self._logged_since_beat = False
        self._tensorboard = self._open_tensorboard(cfg, start_step)
        self._wandb = self._open_wandb(cfg, run_config)
        self._progress: Progress | None = None
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[line]}"),
                console=self.console,
            )
            self._task = self._progress.add_task(description, total=total_steps, completed=start_step, line="")
            self._progress.start()

    def _open_tensorboard(self, cfg: LoggingConfig, start_step: int):
        if not cfg.tensorboard:
            return None
        if importlib.util.find_spec("tensorboard") is None:  # said once: the run goes on without its events
            self.warn(
                "logging.tensorboard is on but tensorboard is not installed, so no TensorBoard events are "
                "written (metrics.jsonl has every number): pip install 'omrl[tensorboard]', or logging.tensorboard=false"
            )
            return None
        from omrl.training.board import Board

        # purge_step drops events a killed run wrote after its last checkpoint.
        return Board(self.output_dir / "tensorboard", purge_step=start_step + 1 if start_step else None)

    def _open_wandb(self, cfg: LoggingConfig, run_config: dict[str, Any] | None):
        if not cfg.wandb_project:
            return None
        if importlib.util.find_spec("wandb") is None:
            self.warn(
                f"logging.wandb_project={cfg.wandb_project!r} but wandb is not installed "
                "(pip install wandb); logging to metrics.jsonl only"
            )
            return None
        import wandb

        id_file = self.output_dir / "wandb_run_id"
        # our own id (wandb takes any short lowercase string): wandb's helpers for one have moved between versions
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        atomic_write_text(id_file, run_id)
        return wandb.init(
            project=cfg.wandb_project, id=run_id, resume="allow", config=run_config, dir=str(self.output_dir)
        )

    def log(self, step: int, metrics: dict[str, float]) -> bool:
        """Show ``metrics`` for optimizer step ``step``; write them out on the logging cadence.

        Returns whether the step was written. Non-finite values are written as null.
        """
        line = step_line(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, line=line)
        if step % self.every and step != self.total_steps:
            return False
        record = {"step": step, **{k: _finite_or_none(v) for k, v in metrics.items()}, "time": round(time.time(), 3)}
        with self._writing, naming(self.path):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            self._logged_since_beat = True
        if self._tensorboard is not None:
            self._tensorboard.add(step, metrics, board_tag)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)
        if self._progress is None:
            self.console.print(f"step {step}/{self.total_steps} {line}", highlight=False, soft_wrap=True)
        return True

    def heartbeat(self, record: dict[str, Any]) -> None:
        """The supervisor's heartbeat (:mod:`omrl.supervisor`), as a line of its own, when no step was
        logged since the last one: a run that is slow or stuck still shows what each stage is doing."""
        with self._writing, naming(self.path):
            if self._logged_since_beat or self._file.closed:
                self._logged_since_beat = False
                return
            self._file.write(json.dumps({HEARTBEAT: record, "time": record["time"]}) + "\n")
            self._file.flush()

    def warn(self, message: str) -> None:
        """A warning on the console, above the progress bar."""
        self.console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        board, self._tensorboard = self._tensorboard, None
        try:
            if board is not None:
                board.close()
        finally:
            if self._wandb is not None:
                self._wandb.finish()
                self._wandb = None
            with naming(self.path):
                self._file.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NullLogger:
    """The logger of every process but the main one: the main process logs for the whole run."""

    def log(self, step: int, metrics: dict[str, float]) -> bool:
        return False

    def warn(self, message: str) -> None:
        pass

    def close(self) -> None:
        pass


def step_line(metrics: dict[str, Any]) -> str:
    """The console's line for a step: the :data:`HEADLINE` metrics it has, and how many more went to
    the files (a step logs 30-40 numbers; all of them on one line read badly in a log or a pipe)."""
    shown = {key: metrics[key] for key in HEADLINE if key in metrics}
    line = " ".join(f"{key} {value:.2e}" if key == "lr" else f"{key} {value:.4g}" for key, value in shown.items())
    more = len(metrics) - len(shown)
    return f"{line} (+{more} in {METRICS_FILE})" if more else line


def read_metrics(output_dir: str | os.PathLike, heartbeats: bool = False) -> list[dict[str, Any]]:
    """The step records of ``<output_dir>/metrics.jsonl`` (an unreadable line, as a crash leaves last, and
    a line that is no record are skipped); with ``heartbeats``, the supervisor's heartbeat records too
    (``{"heartbeat": {...}}``)."""
    path = Path(output_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        if heartbeats or HEARTBEAT not in record:
            records.append(record)
    return records


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _truncate_after(path: Path, step: int) -> None:
    """Keep only the records of steps <= ``step`` (rewritten atomically)."""
    if not path.exists():
        return
    records = read_metrics(path.parent)
    for record in records:
        number = record.get("step", 0)
        if isinstance(number, bool) or not isinstance(number, int):
            raise OmrlError(
                f"{path} holds a record whose step is not a whole number ({short_repr(record)}); "
                "remove that line, then resume again"
            )
    kept = [json.dumps(r) + "\n" for r in records if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(kept))
