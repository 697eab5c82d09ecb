"""Everything the page asks for, as JSON-ready dicts: the run overview, a page of episode
summaries (filtered and sorted), one episode in full, one group, one search tree.

The store holds only summaries (a few numbers per episode); whole episodes are read from
their files when asked for. Episode ids are positions in the store, stable for its life.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from omrl.config import redact, redact_text
from omrl.errors import OmrlError
from omrl.view import evals, games, groups
from omrl.view.bounds import MAX_GROUP_TEXT, TextBudget
from omrl.view.configtext import read_config
from omrl.view.detail import cut_answer, episode_detail
from omrl.view.metrics import columns, env_panels, panels, read_heartbeat, read_metrics_file
from omrl.view.readers import ParquetEpisodes, RecordEpisodes, ReportEpisodes, Unreadable
from omrl.view.sources import Problem, RunSource, discover
from omrl.view.tokens import TokenText, find_tokenizer

PAGE_SIZE = 50
MAX_PAGE = 500
MAX_GROUP = 64  # samples shown side by side
MAX_TREE_PATHS = 1000
SORTS = ("reward", "tokens", "turns", "score")


class EpisodeStore:
    """The episodes of a :class:`RunSource`, with the run's metrics, config and eval reports."""

    def __init__(self, source: RunSource, tokenizer: str | None = None):
        self.source = source
        self.problems: list[Problem] = list(source.problems)
        self._rollouts_read = set(self._step_rollouts())  # a live run writes more: the page says so
        self.token_text, self.tokenizer_note = self._tokenizer(tokenizer)
        label = self.source.label(self.source.config) if self.source.config else ""
        self.config_text, self.config, found = read_config(self.source.config, label)
        self.problems += found
        self.files: list[Any] = []
        self.summaries: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        for path in source.trajectories:
            self._add(lambda p=path: ParquetEpisodes(p, source.label(p)), path)
        for path in source.records:
            self._add(lambda p=path: RecordEpisodes(p, source.label(p)), path)
        for path in source.reports:
            self._add_report(path)
        errors = [str(problem) for problem in self.problems if problem.level == "error"]
        if source.path.is_file() and errors and not self.summaries:  # the one file given: nothing of it shown
            raise OmrlError("; ".join(errors))
        self._members: dict[str, list[int]] = {}
        self._games: dict[str, list[int]] = {}  # a game of several seats: the policy's episodes of it
        for summary in self.summaries:
            self._members.setdefault(summary["group"], []).append(summary["id"])
            if summary.get("game") is not None:
                self._games.setdefault(summary["game"], []).append(summary["id"])
        self.advantage_note = groups.advantage_note(any(f.has_advantages for f in self.files))
        self._metrics_cache: tuple[Any, dict[str, Any], list[Problem]] | None = None
        self._metrics_lock = threading.Lock()

    # -- loading ---------------------------------------------------------------------------

    def _tokenizer(self, name: str | None) -> tuple[TokenText | None, str]:
        try:
            return find_tokenizer(self.source, name)
        except Exception as exc:  # noqa: BLE001 - a bad tokenizer file costs token text, not the page
            if name:
                raise
            self.problems.append(Problem(self.source.label(self.source.tokenizer or self.source.path), str(exc)))
            return None, "the tokenizer could not be read (token ids shown)"

    def _add(self, make: Any, path: Path) -> None:
        import pyarrow as pa

        try:
            reader = make()
        except (pa.ArrowException, OSError, UnicodeDecodeError, ValueError) as exc:
            what = "truncated, damaged or not a parquet file" if path.suffix == ".parquet" else "cannot be read"
            detail = str(exc).strip().split("\n")[0][:200]
            self.problems.append(Problem(self.source.label(path), f"{what} ({detail}); its episodes are not shown"))
            return
        self.problems += reader.problems
        self._index(reader)

    def _add_report(self, path: Path) -> None:
        label = self.source.label(path)
        report = json.loads(path.read_text(encoding="utf-8"))  # discover() parsed it already
        by_env = {name: report.get(name) or {} for name in ("per_env", "macro", "micro")}  # a mixture's report
        self.reports.append({"file": label, "metrics": report.get("metrics") or {}, **by_env})
        beside = [p for p in (*self.source.trajectories, *self.source.records) if p.parent == path.parent]
        if not beside:  # the episodes file of the same eval holds them whole: listed once, from there
            self._index(ReportEpisodes(report, label))  # summaries only: the report keeps no turns
        if self.config_text == "" and isinstance(report.get("config"), dict):
            import yaml

            self.config_text = f"# from {label}\n" + yaml.safe_dump(redact(report["config"]), sort_keys=False)

    def _index(self, reader: Any) -> None:
        number = len(self.files)
        self.files.append(reader)
        base = len(self.summaries)
        for row, summary in enumerate(reader.summaries):
            summary.update(
                id=base + row,
                file=number,
                row=row,
                group=f"{number}:{summary['group']}",
                # the trainer's update columns (a training rollout) with this row's advantages in them: a
                # search path cut short, an env's failure are in the file but were left out of the update
                trained=bool(reader.has_advantages) and summary["advantage"] is not None,
                error=TextBudget()(redact_text(summary.get("error"))),  # episodes written before redaction
            )  # in every list page: kept short
            if "game" in summary:
                summary["game"] = games.game_key(number, summary)
            self.summaries.append(summary)

    def _curves(self) -> tuple[dict[str, Any], list[Problem]]:
        """The metrics' curves and the problems met reading them, parsed again only when
        ``metrics.jsonl`` changed (its size or modification time): a live run goes on writing it,
        but parsing 100,000 steps on every request of the page took seconds each time."""
        path = self.source.metrics
        if path is None:
            return {"step": [], "series": {}}, []
        try:
            seen = (path.stat().st_size, path.stat().st_mtime_ns)
        except OSError:
            seen = None  # read_metrics_file says why
        with self._metrics_lock:  # two requests at once parse it once
            if seen is None or self._metrics_cache is None or self._metrics_cache[0] != seen:
                records, found = read_metrics_file(path, self.source.label(path))
                self._metrics_cache = (seen, columns(records), found)
            return self._metrics_cache[1], self._metrics_cache[2]

    def _step_rollouts(self) -> list[Path]:
        folder = self.source.path / "rollouts"
        return sorted(folder.glob("step-*.parquet")) if self.source.kind == "run" and folder.is_dir() else []

    def _unread_rollouts(self) -> list[Problem]:
        """A warning where the run wrote step rollouts since the viewer read it (a live run): its curves
        are read again, but its episodes are those of when the viewer started."""
        newer = [path for path in self._step_rollouts() if path not in self._rollouts_read]
        if not newer:
            return []
        return [
            Problem(
                self.source.label(newer[-1]),
                f"{len(newer)} step rollout file{'s' * (len(newer) > 1)} written since the viewer read the run "
                f"({'the newest ' * (len(newer) > 1)}named here) {'are' if len(newer) > 1 else 'is'} not listed: "
                "restart omrl view to see the episodes",
                level="warning",
            )
        ]

    # -- what the page asks for ---------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Everything but the episodes: metrics (read again when the file changed: a live run goes on writing), config,
        eval reports, what the filters can choose from, and every problem found."""
        curves, found = self._curves()
        problems = self.problems + found + self._unread_rollouts()
        s = self.summaries
        return {
            "path": str(self.source.path),
            "kind": self.source.kind,
            "title": self.source.path.name,
            "config": self.config_text,
            "metrics": curves,
            "stages": read_heartbeat(self.source.metrics.parent) if self.source.metrics is not None else None,
            "panels": panels(list(curves["series"])),
            "env_panels": env_panels(list(curves["series"])),
            "envs": self.env_counts(),
            "reports": self.reports,
            "problems": [p.as_dict() for p in problems],
            "files": [{"file": f.label, "episodes": len(f.summaries)} for f in self.files],
            "episodes": len(s),
            "tokenizer": self.tokenizer_note,
            "advantage": self.advantage_note,
            "tasks": self.tasks(),
            "facets": {
                "env": sorted({e["env"] for e in s}),
                "split": sorted({e["split"] for e in s}),
                "end": sorted({e["end"] for e in s}),
                "file": [f.label for f in self.files],
                "reward": [min((e["reward"] for e in s), default=0.0), max((e["reward"] for e in s), default=0.0)],
                "trees": any(e["tree"] for e in s),
                "seat": sorted({e["seat"] for e in s if "seat" in e}),  # games of several seats: filter by seat
                "outcome": [o for o in games.OUTCOMES if any(e.get("outcome") == o for e in s)],
                "trained": any(f.has_advantages for f in self.files),  # else no advantage or trained column
                # a step rollout saved before omrl recorded advantages: the page says they were not recorded
                "unrecorded": any(f.step_rollout and not f.has_advantages for f in self.files),
            },
        }

    def tasks(self) -> dict[str, Any] | None:
        """Per task of the files not trained on (an eval's, a rollout's), its samples and pass@k; None
        unless some task has several samples (see :func:`omrl.view.evals.task_table`)."""
        untrained = {number for number, f in enumerate(self.files) if not (f.has_advantages or f.step_rollout)}
        return evals.task_table(self.summaries, untrained)

    def env_counts(self) -> list[dict[str, Any]]:
        """``[{"env", "episodes"}]``: how many episodes of each env, in the order the files first show them."""
        counts: dict[str, int] = {}
        for summary in self.summaries:
            counts[summary["env"]] = counts.get(summary["env"], 0) + 1
        return [{"env": env, "episodes": n} for env, n in counts.items()]

    def query(self, params: dict[str, str]) -> dict[str, Any]:
        """A page of summaries: filters env, split, task, group, success (won/lost), end, file,
        rmin, rmax, and for games seat and outcome; sort one of SORTS, "-" first for descending; offset and limit."""
        items = [e for e in self.summaries if matches(e, params)]
        key = params.get("sort", "")
        if key.lstrip("-") in SORTS:
            name = key.lstrip("-")
            unknown = [e for e in items if e[name] is None]  # a report's token counts: listed last either way
            items = sorted(
                (e for e in items if e[name] is not None), key=lambda e: e[name], reverse=key.startswith("-")
            )
            items += unknown
        offset = max(0, _int(params.get("offset"), 0))
        limit = min(MAX_PAGE, max(1, _int(params.get("limit"), PAGE_SIZE)))
        page = [dict(e) for e in items[offset : offset + limit]]
        return {"total": len(items), "offset": offset, "limit": limit, "items": page}

    def episode(self, episode_id: int) -> dict[str, Any]:
        """One episode in full: turns, reward breakdown, and the token view's arrays."""
        summary = self.summary(episode_id)
        reader = self.files[summary["file"]]
        try:
            row = reader.row(summary["row"])
        except Unreadable as exc:
            return {"summary": summary, "unavailable": str(exc)}
        detail = episode_detail(summary, row, self.token_text)
        if reader.has_advantages and not summary["trained"]:
            detail["left_out"] = groups.left_out_note(summary)
        if summary.get("game") is not None:
            detail["game"] = self.game(summary["game"])
        return detail

    def game(self, key: str) -> dict[str, Any]:
        """The whole game the episode of a seat belongs to: every seat's moves in play order (:mod:`omrl.view.games`)."""
        members = []
        for i in self._games.get(key, [])[: games.MAX_SEAT_EPISODES]:
            try:
                members.append((self.summaries[i], self.files[self.summaries[i]["file"]].row(self.summaries[i]["row"])))
            except Unreadable:
                continue
        return {"key": key, **games.game_view(members, TextBudget(limit=MAX_GROUP_TEXT))}

    def group(self, key: str) -> dict[str, Any]:
        """The samples of one task in one batch, side by side: what GRPO compared."""
        ids = self._members.get(key)
        if ids is None:
            raise KeyError(f"no group {key!r}")
        members = []
        expected = None
        cut = TextBudget(limit=MAX_GROUP_TEXT)  # side by side, each text shorter than in an episode's own view
        for i in ids[:MAX_GROUP]:
            summary = dict(self.summaries[i])
            try:
                row = self.files[summary["file"]].row(summary["row"])
                turns = [
                    {
                        "observation": cut(t.get("observation") or ""),
                        "response": cut(t.get("response") or ""),
                        "action": cut(t.get("action")),
                        "reward": t.get("reward"),
                        "format_ok": t.get("format_ok"),
                    }
                    for t in row.get("turns") or []
                ]
                infos = [groups.info_dict(t.get("info")) for t in row.get("turns") or []]
                expected = expected if expected is not None else cut_answer(evals.expected_answer(infos), cut)
                members.append(
                    {
                        "summary": summary,
                        "instruction": cut(row.get("instruction") or ""),
                        "turns": turns,
                        "rewards": evals.component_sums(row.get("rewards")),
                    }
                )
            except Unreadable as exc:
                members.append({"summary": summary, "unavailable": str(exc), "turns": [], "rewards": {}})
        everyone = [self.summaries[i] for i in ids]
        return {
            "key": key,
            "size": len(ids),
            "shown": len(members),
            "members": members,
            "expected": expected,
            "trained": any(e["trained"] for e in everyone),
            "advantage": self._advantage_line(everyone),
            "passes": evals.passes(everyone),  # pass@k for k = 1..n over the group's samples
        }

    def _advantage_line(self, members: list[dict[str, Any]]) -> str | None:
        """What a group's page says of its advantages: as recorded, "not recorded" for a step rollout saved
        before omrl kept them, or nothing for samples never trained on (an eval's, a rollout's)."""
        if any(e["trained"] for e in members):
            return groups.advantage_note(True)
        if any(self.files[e["file"]].step_rollout for e in members):
            return groups.advantage_note(False)
        return None

    def tree(self, key: str) -> dict[str, Any]:
        """The search tree the paths of one group were cut from."""
        ids = [i for i in self._members.get(key, []) if self.summaries[i]["tree"]]
        if not ids:
            raise KeyError(f"no search tree in group {key!r}")
        paths = []
        for i in ids[:MAX_TREE_PATHS]:
            try:
                paths.append((self.summaries[i], self.files[self.summaries[i]["file"]].row(self.summaries[i]["row"])))
            except Unreadable:
                continue
        return {"key": key, "paths": len(ids), **groups.build_tree(paths)}

    def summary(self, episode_id: int) -> dict[str, Any]:
        """One episode's summary, its recorded advantage included; KeyError for an id the run does not have."""
        if not 0 <= episode_id < len(self.summaries):
            raise KeyError(f"no episode {episode_id} (this run has {len(self.summaries)})")
        return dict(self.summaries[episode_id])


def open_run(path: str | os.PathLike, tokenizer: str | None = None) -> EpisodeStore:
    """Discover what ``path`` holds and index its episodes."""
    return EpisodeStore(discover(path), tokenizer)


def matches(summary: dict[str, Any], params: dict[str, str]) -> bool:
    """Whether an episode summary passes the list's filters (empty ones pass everything)."""
    if params.get("env") and summary["env"] != params["env"]:
        return False
    if params.get("split") and summary["split"] != params["split"]:
        return False
    if params.get("task") and str(summary["task"]) != params["task"].strip():
        return False
    if params.get("group") and summary["group"] != params["group"]:
        return False
    if params.get("success") in ("won", "lost") and summary["won"] != (params["success"] == "won"):
        return False
    if params.get("end") and summary["end"] != params["end"]:
        return False
    if params.get("file") and str(summary["file"]) != params["file"]:
        return False
    for key in ("seat", "outcome"):
        if params.get(key) and summary.get(key) != params[key]:
            return False
    low, high = _float(params.get("rmin")), _float(params.get("rmax"))
    if low is not None and summary["reward"] < low or high is not None and summary["reward"] > high:
        return False
    return True


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None
