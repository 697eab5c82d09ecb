"""What a path given to ``omrl view`` holds: a run directory, a trajectory file or an eval report.

A run directory is searched (a few levels deep, skipping checkpoints and logger folders)
for ``metrics.jsonl``, ``config.yaml``, trajectory parquet files, readable episode JSONL
files with no parquet beside them, and eval reports. A file that cannot be used becomes a
:class:`Problem` naming it, and the rest is still shown; only a path with nothing usable
at all is an error. A link found in the run that leads out of it is never followed (a
warning names it): what a run dir links to is not the run's to show. Nor is anything but a
regular file opened (a warning names it): reading a FIFO or a device would hang the viewer.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.data.layouts import READABLE_SCHEMAS, missing_columns
from omrl.errors import OmrlError

METRICS_FILE = "metrics.jsonl"  # what omrl.training.metrics writes (not imported: it loads rich's progress bars)
CONFIG_FILE = "config.yaml"
TOKENIZER_FILE = "tokenizer.json"
SCHEMA_KEY = b"omrl.schema"
# the tokenizer a trajectory file records (omrl.data.trajectory.TOKENIZER_KEY; not imported: it loads pyarrow)
TOKENIZER_KEY = b"omrl.tokenizer"
# Folders a run keeps that hold no trajectories: walking them would only cost time.
_SKIP_DIRS = {"checkpoints", "tensorboard", "wandb", "__pycache__", "node_modules"}
# JSON files a saved Hugging Face model keeps beside the run's files: never eval reports.
_MODEL_JSON = {
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "state.json",
    "model.safetensors.index.json",
    "adapter_config.json",
}
_MAX_DEPTH = 4
_MAX_REPORT_BYTES = 200 * 1024 * 1024


@dataclass
class Problem:
    """Something wrong with one file. ``level`` is "error" when (part of) it could not be shown,
    "warning" when it was shown with a caveat."""

    file: str
    message: str
    level: str = "error"

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"file": self.file, "message": self.message, "level": self.level}


@dataclass
class RunSource:
    """The files found under one path, and what was wrong with the others."""

    path: Path
    kind: str  # "run" (a directory), "trajectory" (parquet), "records" (JSONL) or "report" (eval JSON)
    metrics: Path | None = None
    config: Path | None = None
    trajectories: list[Path] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)
    reports: list[Path] = field(default_factory=list)
    tokenizer: Path | None = None
    # the tokenizer fingerprint (name, size, vocab hash) the first trajectory file records, if any
    recorded_tokenizer: dict[str, Any] | None = None
    problems: list[Problem] = field(default_factory=list)

    def label(self, path: Path) -> str:
        """``path`` as the page shows it: relative to the run, or its name for a single file."""
        base = self.path if self.path.is_dir() else self.path.parent
        try:
            return str(path.relative_to(base))
        except ValueError:
            return str(path)

    @property
    def empty(self) -> bool:
        return not (self.metrics or self.config or self.trajectories or self.records or self.reports)


def discover(path: str | os.PathLike) -> RunSource:
    """Find what ``path`` holds; raise OmrlError when it holds nothing omrl wrote."""
    path = Path(path).expanduser()
    if not path.exists():
        raise OmrlError(
            f"{path}: no such file or directory; give a run directory, a trajectory parquet or "
            "JSONL, or an eval report JSON"
        )
    if not path.is_dir() and not path.is_file():
        raise OmrlError(
            f"{path} is {_kind_of(path)}, not a regular file: reading it could wait forever; give a run "
            "directory, a trajectory parquet or JSONL, or an eval report JSON"
        )
    source = _discover_dir(path) if path.is_dir() else _discover_file(path)
    swept = path / "sweep.json" if path.is_dir() else path
    if (
        source.empty and swept.name == "sweep.json" and swept.is_file()
    ):  # what `omrl sweep` writes: a table, not episodes
        raise OmrlError(
            f"{path} is what `omrl sweep` wrote: its numbers are in {swept} and its plot beside it in "
            "sweep.png; the viewer shows runs, rollouts and evals, so to see one cell's episodes play it with "
            "`omrl rollout --strategy S --budget B` and view that"
        )
    if source.empty and path.is_file():  # the one file could not be read: nothing else to show
        raise OmrlError("; ".join(str(p) for p in source.problems))
    if source.empty:
        found = f"; what it holds: {'; '.join(str(p) for p in source.problems)}" if source.problems else ""
        raise OmrlError(
            f"{path} is not an omrl run: it holds no readable {METRICS_FILE}, {CONFIG_FILE}, trajectory "
            "parquet/JSONL or eval report (give a run's output directory, e.g. runs/grpo-webshop-..., "
            f"or a file `omrl rollout` or `omrl eval` wrote){found}"
        )
    return source


def _discover_file(path: Path) -> RunSource:
    name = path.name
    suffix = path.suffix.lower()
    source = RunSource(path=path, kind="trajectory")
    if name == METRICS_FILE:
        source.kind, source.metrics = "run", path
        source.config = _beside(path, CONFIG_FILE, source)
    elif suffix == ".parquet":
        _add_parquet(source, path)
    elif suffix == ".jsonl":
        source.kind = "records"
        _add_records(source, path)
    elif suffix == ".json":
        source.kind = "report"
        _add_report(source, path)
        # omrl eval writes each episode whole beside its report: shown from there, turns and tokens
        episodes = episodes_of_report(path) if source.reports else None
        if episodes is not None:
            _add_parquet(source, episodes)
    elif suffix in (".yaml", ".yml"):
        source.kind, source.config = "run", path
    else:
        raise OmrlError(
            f"{path}: not something omrl view shows; give a run directory, a trajectory .parquet or "
            ".jsonl, or an eval report .json"
        )
    source.tokenizer = _beside(path, TOKENIZER_FILE, source)
    return source


def episodes_of_report(path: Path) -> Path | None:
    """The episodes file ``omrl eval`` wrote with the report at ``path``, if it is there: ``<name>.episodes.parquet``
    (``--report`` alone), or ``episodes.parquet`` in the report's folder (``--output-dir``, with or without
    ``--report``), taken for another name than report.json only where the report's config says it went there."""
    own = path.with_name(f"{path.stem}.episodes.parquet")
    if path.name != "report.json" and readable_inside(own, path.parent):
        return own
    shared = path.with_name("episodes.parquet")
    if not readable_inside(shared, path.parent):
        return None
    return shared if path.name == "report.json" or _wrote_episodes_beside(path) else None


def _wrote_episodes_beside(path: Path) -> bool:
    """Whether the eval report at ``path`` (not report.json) put its episodes in its own folder: its config
    names an output_dir, and that folder holds the report (``--output-dir D --report D/x.json``). A report
    whose config names neither cannot tell: then only where no report.json beside it claims them."""
    try:
        config = json.loads(path.read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return False
    config = config if isinstance(config, dict) else {}
    if "output_dir" not in config and "report" not in config:
        return not path.with_name("report.json").exists()
    if not config.get("output_dir"):  # --report alone: its episodes are <name>.episodes.parquet
        return False
    named = Path(str(config.get("report") or "report.json"))
    return named.name == path.name and os.path.normpath(named.parent) == os.path.normpath(str(config["output_dir"]))


def _discover_dir(root: Path) -> RunSource:
    source = RunSource(path=root, kind="run")
    source.metrics = _beside(root / METRICS_FILE, METRICS_FILE, source)
    source.config = _beside(root / CONFIG_FILE, CONFIG_FILE, source)
    source.tokenizer = _beside(root / TOKENIZER_FILE, TOKENIZER_FILE, source)
    for path in _walk(root, source):
        if path.parent == root and path.name in (METRICS_FILE, CONFIG_FILE, TOKENIZER_FILE):
            continue  # read (or named, a link leading out) just above
        if not _stays_inside(path, root, source) or not _regular(path, source):
            continue
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            _add_parquet(source, path)
        elif suffix == ".jsonl" and path.name != METRICS_FILE:
            if not path.with_suffix(".parquet").exists():  # else it is the parquet's readable copy
                _add_records(source, path, quiet=True)
        elif suffix == ".json" and path.name not in _MODEL_JSON:
            _add_report(source, path, quiet=True)
    return source


def _walk(root: Path, source: RunSource) -> list[Path]:
    """Files under ``root``, sorted (step-000002 before step-000010), skipping non-run folders. A linked
    folder is never walked into (os.walk's default); one that leads out of ``root`` is named."""
    found = []
    base_depth = len(root.parts)
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).parts) - base_depth
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".") and depth < _MAX_DEPTH)
        for linked in [Path(folder) / d for d in dirs if os.path.islink(Path(folder) / d)]:
            _stays_inside(linked, root, source)
        found += [Path(folder) / f for f in files if not f.startswith(".")]
    return sorted(found)


def _beside(path: Path, name: str, source: RunSource) -> Path | None:
    candidate = path if path.name == name else path.parent / name
    if not os.path.lexists(candidate) or not _stays_inside(candidate, candidate.parent, source):
        return None
    return candidate if _regular(candidate, source) else None


def _regular(path: Path, source: RunSource) -> bool:
    """Whether ``path`` is a regular file (a link's target counted): anything else (a FIFO, a socket,
    a device, a folder named like a file) is never opened, since reading a FIFO no one writes to
    waits forever. It becomes a warning naming it."""
    if path.is_file():
        return True
    source.problems.append(
        Problem(source.label(path), f"{_kind_of(path)}, not a regular file; not read", level="warning")
    )
    return False


def _kind_of(path: Path) -> str:
    """What ``path`` is, in words, when it is not a regular file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "a broken link"
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    )
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def _stays_inside(path: Path, root: Path, source: RunSource) -> bool:
    """Whether ``path`` (found in ``root``, not named by the user) is really there: a link that leads
    out of ``root`` is never followed, or a run dir holding ``config.yaml -> ~/.netrc`` would put a
    private file in a page meant to be shared. It becomes a warning naming the link."""
    if _inside(path, root):
        return True
    what = "a folder" if path.is_dir() else "a file"
    source.problems.append(
        Problem(source.label(path), f"a link to {what} outside the run directory; not followed", level="warning")
    )
    return False


def _inside(path: Path, root: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def readable_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, found in ``root``, may be read: a regular file that stays inside ``root``. Quiet:
    for the files read again while the page is open (a heartbeat), or only for a hint (a report
    beside a trajectory file); the walk of a run directory already named what it would not read."""
    return _inside(path, root) and path.is_file()


def _add_parquet(source: RunSource, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        source.problems.append(
            Problem(source.label(path), f"truncated, damaged or not a parquet file ({_first_line(exc)})")
        )
        return
    tag = (schema.metadata or {}).get(SCHEMA_KEY, b"")
    if not tag.startswith(b"episode/"):
        source.problems.append(
            Problem(
                source.label(path),
                "not an omrl trajectory file (no omrl.schema episode/N in its metadata); skipped",
                level="warning",
            )
        )
        return
    missing = missing_columns(schema) if tag in READABLE_SCHEMAS else []
    if missing:  # cut down after it was written: what was cut would show as defaults (won as lost)
        what = f"lacks the column(s) {', '.join(missing)}: not a whole omrl trajectory file; skipped"
        source.problems.append(Problem(source.label(path), what))
        return
    source.trajectories.append(path)
    if source.recorded_tokenizer is None:
        try:
            recorded = json.loads((schema.metadata or {}).get(TOKENIZER_KEY, b"null"))
        except ValueError:
            recorded = None
        source.recorded_tokenizer = recorded if isinstance(recorded, dict) else None


def _add_records(source: RunSource, path: Path, quiet: bool = False) -> None:
    """A JSONL of readable episode records (what ``omrl rollout`` writes beside its parquet)."""
    first = _first_json_line(path)
    if isinstance(first, dict) and "turns" in first and "task_id" in first:
        source.records.append(path)
    elif not quiet:
        what = "an empty file" if first is None else "not omrl episode records (each line needs task_id and turns)"
        source.problems.append(Problem(source.label(path), what))


def _add_report(source: RunSource, path: Path, quiet: bool = False) -> None:
    """An eval report: a JSON object with "metrics" (and usually "episodes")."""
    try:
        if path.stat().st_size > _MAX_REPORT_BYTES:
            raise ValueError("larger than 200 MB")
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if not quiet or "report" in path.name:
            source.problems.append(Problem(source.label(path), f"not a readable eval report ({_first_line(exc)})"))
        return
    if isinstance(report, dict) and isinstance(report.get("metrics"), dict):
        source.reports.append(path)
    elif not quiet:
        source.problems.append(Problem(source.label(path), 'not an omrl eval report (no "metrics" object)'))


def _first_json_line(path: Path) -> object:
    """The first non-empty line of ``path`` parsed as JSON; None for an empty file, "" when unreadable."""
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, ValueError):
        return ""
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n")[0]
    return text[:200] or type(exc).__name__
