"""Resuming a sweep: the setup every cell of ``<out>/sweep.json`` shares, and the cells a run with the same
setup may keep. The setup is the config less the cell list and output, the task ids, and the content of the
model (:func:`model_content`) and of the files plugins read (:func:`plugin_content`), so a model or a reward
model retrained at the same path does not add cells to the earlier one's table."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from omrl.config.options import SweepRunConfig
from omrl.errors import ConfigError

# config keys that say which cells to play and where, not how: a resumed sweep may change them
NOT_SETUP = ("command", "description", "strategies", "budgets", "out", "resume")
CONTENT = "model_content"  # the setup key that says which model content the cells were played with
PLUGIN_CONTENT = "plugin_files"  # ... and which content the files and folders plugin options name held
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")


def setup_of(cfg: SweepRunConfig, tasks: Sequence[Any]) -> dict[str, Any]:
    """What every cell shares (the config less the cell list and output, plus the task ids; a
    mixture's tasks as [env, split, id]): a sweep resumes only cells played with the same setup."""
    from omrl.config import to_dict

    setup = {k: v for k, v in to_dict(cfg).items() if k not in NOT_SETUP}
    tasks = [list(t) if isinstance(t, tuple) else int(t) for t in tasks]
    setup = {**setup, CONTENT: model_content(cfg.model.name), "tasks": tasks}
    files = plugin_content(setup.get("plugins"))
    if files:  # only where a plugin reads one: a record of a sweep that read none stays as it was
        setup[PLUGIN_CONTENT] = files
    return json.loads(json.dumps(setup))  # as it reads back from the file


def plugin_content(plugins: Any) -> dict[str, dict[str, str]]:
    """The content of each local file or folder a plugin option names (``plugins.rm.path``: a reward
    model retrained or replaced there scores other cells), keyed ``<plugin>.<option>``, as
    :func:`model_content` identifies a folder."""
    out = {}
    for name, options in sorted((plugins or {}).items()):
        for key, value in sorted((options or {}).items()) if isinstance(options, dict) else ():
            path = Path(value).expanduser() if isinstance(value, str) and value else None
            if path is not None and path.exists():
                out[f"{name}.{key}"] = _content(path, [path]) if path.is_file() else model_content(str(path))
    return out


def model_content(name: str) -> dict[str, str]:
    """Which model a sweep plays, by content: a path names whatever is there now, and a model
    retrained at the same path must not add cells to the earlier model's table.

    For a local directory (a built-in name's included): ``manifest_sha256``, the sha256 of the
    :data:`~omrl.models.MODEL_MANIFEST` omrl writes beside a run's final model (itself the sha256 of
    every file, so any change to the weights changes it); for a directory without one (a Hugging
    Face download, an older omrl's model, a built-in), ``files_sha256``, the sha256 of its weights
    files' names, sizes and modification times (copying the model without keeping times counts as
    another model; a rewrite that keeps all three goes unseen). A hub id is identified by its name
    only (``hub_id``): the hub's cache keeps one revision a name.
    """
    from omrl.home import omrl_home
    from omrl.models.builtin import BUILTIN_MODELS

    path = omrl_home() / "models" / name if name in BUILTIN_MODELS else Path(name).expanduser()
    if not path.is_dir():
        return {"hub_id": name}
    files = sorted(p for p in path.iterdir() if p.is_file())
    return _content(path, [p for p in files if p.name.endswith(WEIGHTS_SUFFIXES)] or files)


def _content(path: Path, files: list[Path]) -> dict[str, str]:
    """The folder ``path``'s manifest's sha256 where omrl wrote one, else that of ``files``' names, sizes
    and modification times."""
    from omrl.models import MODEL_MANIFEST

    manifest = path / MODEL_MANIFEST
    if manifest.is_file():
        return {"manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()}
    listing = "".join(f"{p.name}\t{p.stat().st_size}\t{p.stat().st_mtime_ns}\n" for p in files)
    return {"files_sha256": hashlib.sha256(listing.encode("utf-8")).hexdigest()}


def read_record(path: Path) -> tuple[Any, list[dict[str, Any]]] | None:
    """The (setup, cells) of the sweep record ``path``, every cell checked (None where there is none yet);
    ConfigError naming what is damaged. Run before any model loads: a bad cell would otherwise fail the
    resumed sweep after it played the cells left, its table and plot unwritten."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        old, cells = record["setup"], record["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a sweep record ({exc}); give another --out, or resume=false to overwrite it"
        ) from exc
    if not isinstance(old, dict):
        raise ConfigError(f"{path} is damaged: its setup is {_short(old)}; give another --out, or resume=false")
    if not isinstance(cells, list):
        raise ConfigError(f"{path} is damaged: its cells are not a list; give another --out, or resume=false")
    for i, cell in enumerate(cells):
        problem = _cell_problem(cell)
        if problem:
            raise ConfigError(f"{path} is damaged: cell {i} {problem}; give another --out, or resume=false")
    return old, cells


def finished_cells(path: Path, setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells ``path`` holds when it was written with ``setup``; ConfigError when with another."""
    record = read_record(path)
    if record is None:
        return []
    old, cells = record
    _check_same_model(path, old, setup)
    was, now = old.get(PLUGIN_CONTENT) or {}, setup.get(PLUGIN_CONTENT) or {}
    replaced = [key for key in sorted({*was, *now}) if was.get(key) != now.get(key)]
    if replaced:
        where = ", ".join(f"plugins.{key}={value_at(setup['plugins'], key)}" for key in replaced)
        raise ConfigError(
            f"{path} holds cells played with other content at {where} (retrained or replaced since); they "
            "would mix two in one table: give another --out, or resume=false to start over there"
        )
    changed = _differences(old, setup)
    if old.get("model") != setup.get("model"):  # another model: that its content differs goes without saying
        changed = [line for line in changed if not line.startswith(f"{CONTENT}.")]
    if changed:
        raise ConfigError(
            f"{path} holds a sweep with other settings ({'; '.join(changed[:3])}); give another "
            "--out, or resume=false to start over there"
        )
    return list(cells)


# what the table and the plot read of each cell: a number, or (budget_used) None where there is no budget
CELL_NUMBERS = (
    "tasks",
    "success_rate",
    "success_se",
    "any_success_rate",
    "mean_score",
    "generated_tokens_per_task",
    "max_generated_tokens",
    "budget_exhausted",
    "wall_seconds",
    "env_errors",
)


def _cell_problem(cell: Any) -> str:
    """What is wrong with a cell read back from a sweep record ('' when nothing): a hand edit or a bad
    merge would otherwise fail the resumed sweep after it played the cells left, its table unwritten."""
    if not isinstance(cell, dict):
        return f"is {_short(cell)}, not a mapping"
    missing = [key for key in ("strategy", "budget", *CELL_NUMBERS, "budget_used") if key not in cell]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not isinstance(cell["strategy"], str):
        return f"has strategy {_short(cell['strategy'])}, not a name"
    if cell["budget"] is not None and (isinstance(cell["budget"], bool) or not isinstance(cell["budget"], int)):
        return f"has budget {_short(cell['budget'])}, not a whole number or null"
    for key in (*CELL_NUMBERS, "budget_used"):
        value = cell[key]
        if not (key == "budget_used" and value is None) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            return f"has {key} {_short(value)}, not a number"
    return ""


def value_at(plugins: dict[str, Any], key: str) -> Any:
    """``plugins[name][option]`` for ``key`` ``name.option`` (an option of a plugin whose name has dots
    splits at its last one)."""
    name, _, option = key.rpartition(".")
    return (plugins.get(name) or {}).get(option)


def _check_same_model(path: Path, old: Any, setup: dict[str, Any]) -> None:
    """ConfigError when the cells in ``path`` were played by other model content than ``setup``'s,
    or when the record does not say (an older omrl wrote it): the two would share one table."""
    name = setup["model"]["name"]
    if isinstance(old.get("model"), dict) and old["model"].get("name") != name:
        return  # another model named: the settings' differences say so, not "retrained or replaced"
    if CONTENT not in old:
        raise ConfigError(
            f"{path} does not record which model content its cells were played with (an older "
            f"omrl wrote it), so {name} now may not be the model they measured; give another "
            "--out, or resume=false to start over there"
        )
    if old[CONTENT] != setup[CONTENT]:
        raise ConfigError(
            f"{path} holds a sweep of another model at {name} ({_content_label(old[CONTENT])} "
            f"there, {_content_label(setup[CONTENT])} now: retrained or replaced since); its cells "
            "would mix two models in one table: give another --out, or resume=false to start over there"
        )


def _content_label(content: Any) -> str:
    """``{"manifest_sha256": "3f2a..."}`` as ``manifest sha256 3f2a...`` (12 hex digits tell models apart)."""
    if not isinstance(content, dict) or len(content) != 1:
        return _short(content)
    ((kind, value),) = content.items()
    return f"{kind.replace('_', ' ')} {str(value)[:12]}{'...' if len(str(value)) > 12 else ''}"


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(set(old) | set(new), key=str)
            for d in _differences(old.get(key), new.get(key), f"{path}.{key}" if path else key)
        ]
    return [] if old == new else [f"{path or 'setup'}: {_short(old)} there, {_short(new)} now"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
