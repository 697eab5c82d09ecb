"""Where a run resumes: the newest intact checkpoint of its output directory, whose config must be the
run's own (:func:`resume_point`).

Resuming with a config that differs from the saved one fails naming the keys, except keys in
:data:`MAY_CHANGE_ON_RESUME` (they change neither the data nor the maths: logging, checkpoint
cadence, stage deadlines, gradient checkpointing, the NaN patience), keys raised that extend a run
(:data:`EXTEND_ON_RESUME`) and secrets (tokens, keys: ``state.json`` holds them redacted, see
:func:`omrl.config.redact`). A damaged checkpoint is skipped for the one before it; one an older omrl
wrote, with no manifest, is refused until ``omrl checkpoint trust`` vouches for it.
"""

from __future__ import annotations

import json
import os
import shlex
import warnings
from pathlib import Path
from typing import Any, Iterable

from omrl.training.checkpoint import CHECKPOINTS_DIR, CheckpointError, complete_checkpoints, latest_checkpoint
from omrl.training.checkpoint_marker import damage, has_manifest

# Dotted config keys (or prefixes ending in ".") that may differ between a run and its resumption.
MAY_CHANGE_ON_RESUME = (
    "deadlines.",  # how long a stage may take: a run a too tight one stopped goes on with a longer one
    "description",
    # where the generation server is, not what is trained: a server that failed may come back elsewhere
    "generation.base_url",
    "generation.api_key_env",
    "generation.weight_dir",
    "generation.request_retries",  # and how long to wait for it: a slow server's run resumes with more patience
    "generation.request_timeout_s",
    "logging.",
    "model.gradient_checkpointing",
    "optim.max_nan_steps",
    "resume",
)
# keys that extend a run rather than change it: raised on resume, a run (finished or not) goes on
EXTEND_ON_RESUME = ("steps", "num_train_epochs")


def resume_point(
    output_dir: str | os.PathLike,
    config: dict[str, Any],
    resume: bool,
    defaults: dict[str, Any] | None = None,
    renamed: dict[str, str] | None = None,
) -> Path | None:
    """Where a recipe starts: with ``resume``, the checkpoint to continue from (see
    :func:`resume_checkpoint`); else None, refusing to start fresh over an earlier run's checkpoints."""
    if resume:
        return resume_checkpoint(output_dir, config, defaults=defaults, renamed=renamed)
    if latest_checkpoint(output_dir) is not None:
        raise CheckpointError(
            f"{output_dir} holds checkpoints of an earlier run; pass --resume to continue it, "
            "or choose another output_dir"
        )
    metrics = Path(output_dir) / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:  # a run that logged steps, then stopped before a checkpoint
        raise CheckpointError(
            f"{output_dir} holds an earlier run (its metrics.jsonl) with no checkpoint to resume; a fresh run "
            "would write over it: choose another output_dir, or delete that one"
        )
    return None


#: the keys of a run config that name datasets (sft, rm train): kept absolute as the model folder is
DATASET_KEYS = ("dataset", "eval_dataset")


def paths_as_saved(cfg: Any) -> None:
    """Set run config ``cfg``'s local model folder and datasets to their absolute paths, as its checkpoints
    and config.yaml keep them: a run started in one folder resumes from any other."""
    from omrl.data.mixture import dataset_as_saved

    cfg.model.name = model_as_saved(cfg.model.name)
    for key in DATASET_KEYS:
        if isinstance(getattr(cfg, key, None), str):
            setattr(cfg, key, dataset_as_saved(getattr(cfg, key)))


def model_as_saved(name: Any) -> Any:
    """A local model folder as its absolute path, as a run's checkpoints keep it, so that the run resumes from
    any folder (``--model ../runs/sft`` there is ``runs/sft`` here); a built-in or hub name as it is."""
    from omrl.models.builtin import BUILTIN_MODELS

    if not isinstance(name, str) or name in BUILTIN_MODELS or not Path(name).expanduser().exists():
        return name
    return str(Path(name).expanduser().resolve())


def _moved(saved: Any, given: Any) -> bool:
    """Whether the model folder a run kept (an absolute path) is gone and ``given`` is a folder of its name:
    the project moved, or the run is resumed on another machine, where the path cannot be the same."""
    if not (isinstance(saved, str) and isinstance(given, str) and Path(saved).is_absolute()):
        return False
    return not Path(saved).exists() and Path(given).is_dir() and Path(saved).name == Path(given).name


def check_same_config(
    saved: dict[str, Any],
    current: dict[str, Any],
    may_change: Iterable[str] = MAY_CHANGE_ON_RESUME,
    defaults: dict[str, Any] | None = None,
    renamed: dict[str, str] | None = None,
) -> None:
    """Raise naming every key (outside ``may_change``) whose value differs between the configs.

    An option the saved run did not have yet (a newer omrl added it) only warns when it is at its
    value in ``defaults``: the run can go on, and the user learns what it now uses. ``renamed``
    maps dotted keys an older omrl saved to their names now."""
    from omrl.config import redact
    from omrl.data.mixture import dataset_as_saved

    allowed = tuple(may_change)
    # redacted as the current config is: a checkpoint from before a redaction rule holds the secret in clear
    old = {(renamed or {}).get(k, k): v for k, v in _flatten(redact(saved)).items()}
    new = _flatten(json.loads(json.dumps(current, default=str)))
    for config in (old, new):  # an older run kept the folder as typed: resolved from here, where it was typed
        if "model.name" in config:
            config["model.name"] = model_as_saved(config["model.name"])
        for key in DATASET_KEYS:
            if key in config:
                config[key] = dataset_as_saved(config[key])
    if _moved(old.get("model.name"), new.get("model.name")):
        warnings.warn(
            f"the run's model folder {old['model.name']} is gone; resuming on {new['model.name']}, which has its "
            "name (a project moved): give the same model the run started from",
            stacklevel=2,
        )
        old["model.name"] = new["model.name"]
    default = _flatten(json.loads(json.dumps(defaults or {}, default=str)))
    added = sorted(k for k in set(new) - set(old) if k in default and default[k] == new[k])
    if added:
        warnings.warn(
            f"resuming a run made before omrl had the option(s) {', '.join(added)}: they take their "
            f"defaults ({', '.join(f'{k}={new[k]!r}' for k in added)})",
            stacklevel=2,
        )
    differ = [
        k
        for k in sorted(set(old) | set(new))
        if k not in added
        and old.get(k, "<absent>") != new.get(k, "<absent>")
        and not _secret(k)
        and not any(k == a or (a.endswith(".") and k.startswith(a)) for a in allowed)
        and not _extended(k, old.get(k), new.get(k))
    ]
    if differ:
        details = "; ".join(f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in differ)
        raise CheckpointError(
            f"cannot resume: the config differs from the checkpoint's in {details}. "
            f"Use the original values, or start a new run in another output_dir "
            f"(keys that may change: {', '.join(a + '*' if a.endswith('.') else a for a in allowed)}; "
            f"that may be raised: {', '.join(EXTEND_ON_RESUME)})"
        )


def _extended(key: str, old: Any, new: Any) -> bool:
    """Whether ``key`` went up on resume and is one that extends a run (:data:`EXTEND_ON_RESUME`)."""
    numbers = isinstance(old, (int, float)) and isinstance(new, (int, float))
    return key in EXTEND_ON_RESUME and numbers and new > old


def _secret(key: str) -> bool:
    """A secret may change on resume (a rotated token): checkpoints keep it redacted (see
    :func:`omrl.config.to_dict`), older ones in clear, and the run uses the one it is given now."""
    from omrl.config import is_secret_key

    return any(is_secret_key(part) for part in key.split("."))


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resume_checkpoint(
    output_dir: str | os.PathLike,
    config: dict[str, Any],
    may_change: Iterable[str] = MAY_CHANGE_ON_RESUME,
    defaults: dict[str, Any] | None = None,
    renamed: dict[str, str] | None = None,
) -> Path:
    """The checkpoint to resume from: the newest complete one, whose config must match ``config``
    (``defaults``, ``renamed``: see :func:`check_same_config`)."""
    found = complete_checkpoints(output_dir)
    if not found:
        raise _nothing_to_resume(Path(output_dir))
    for path in reversed(found):  # the newest intact one
        problem = damage(path)
        if problem is None and not has_manifest(path):
            raise _unverified(path)
        if problem is None:
            break
        warnings.warn(f"not resuming from {path}: {problem}; trying the checkpoint before it", stacklevel=2)
    else:
        raise CheckpointError(
            f"every checkpoint in {Path(output_dir) / CHECKPOINTS_DIR} is damaged (the newest: "
            f"{damage(found[-1])}); start a new run in another output_dir"
        )
    saved = json.loads((path / "state.json").read_text())["config"]
    check_same_config(saved, config, may_change, defaults, renamed)
    return path


def _nothing_to_resume(output_dir: Path) -> CheckpointError:
    """No checkpoint: start fresh, unless an earlier run logged steps there (a fresh run is refused over
    it, see :func:`resume_point`), whose steps are lost: then start it again elsewhere, or delete it."""
    metrics = output_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return CheckpointError(
            f"nothing to resume: the earlier run in {output_dir} stopped before its first checkpoint "
            f"(logging.save_steps=N checkpoints every N steps), so its steps are lost; start it again without "
            f"--resume in another output_dir, or delete {output_dir} first"
        )
    return CheckpointError(
        f"nothing to resume: no complete checkpoint in {output_dir / CHECKPOINTS_DIR}; "
        "run without --resume to start fresh"
    )


def _unverified(path: Path) -> CheckpointError:
    return CheckpointError(
        f"cannot resume from {path}: an older omrl wrote it, and it lists no sha256 digests of its files, so "
        "damage since (a flipped byte in its weights would become this run's model) cannot be found. If you "
        f"trust its files, vouch for them with `omrl checkpoint trust {shlex.quote(str(path))}` and resume "
        "again; else start a new run in another output_dir"
    )
