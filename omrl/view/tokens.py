"""Per-token text for the token view, from the run's ``tokenizer.json``.

Trajectory files store token ids only (the ids the model sampled), so the page needs a
tokenizer to show them as text. It is found, in order: ``--tokenizer`` (a tokenizer.json,
a model directory, or a built-in model name), the run's own ``tokenizer.json`` (a run
directory saves the model beside its metrics), the model named in ``config.yaml``, and
the model a trajectory file names in its metadata (``omrl.model``).
Without one the page shows the ids.

Only the ``tokenizers`` library is used: loading transformers (and torch) would take seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omrl.errors import OmrlError
from omrl.models.builtin import BUILTIN_MODELS
from omrl.view.sources import TOKENIZER_FILE, RunSource, readable_inside

# Where omrl.models keeps the tiny model's tokenizer. Not imported from there because omrl.models
# imports torch.
_TINY_TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "tiny_tokenizer" / TOKENIZER_FILE


class TokenText:
    """Token ids to one string per token (special tokens kept: they are part of what was trained)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.path = path
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exceptions for bad files
            raise OmrlError(f"{path}: not a readable tokenizer.json ({str(exc).splitlines()[0][:200]})") from exc

    def pieces(self, ids: list[int]) -> list[str]:
        """The text of each token alone. A character split over several byte tokens shows as U+FFFD."""
        return self._tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


def find_tokenizer(source: RunSource, name: str | None = None) -> tuple[TokenText | None, str]:
    """The tokenizer for ``source`` and a line saying where it came from (or why there is none)."""
    if name:
        path = _resolve(name)
        if path is None:
            raise OmrlError(
                f"--tokenizer {name!r}: no tokenizer.json found; valid: a tokenizer.json file, a model "
                f"directory holding one, or a built-in model name ({', '.join(BUILTIN_MODELS)})"
            )
        return TokenText(path), f"tokenizer: {path}"
    if source.tokenizer is not None:
        return TokenText(source.tokenizer), f"tokenizer: {source.tokenizer}"
    for model, where in (
        (_config_model(source.config), "model.name in config.yaml"),
        (source.model, "the model the trajectory file names"),
        (_report_model(source), "the model the eval report beside it names"),
    ):
        path = _resolve(model) if model else None
        if path is not None:
            return TokenText(path), f"tokenizer: {path} ({where})"
    return None, "no tokenizer found (token ids shown; pass --tokenizer MODEL to see their text)"


def _resolve(name: str) -> Path | None:
    """A tokenizer.json for a file, a model directory or a built-in model name; None when not found."""
    if name == "tiny":
        return _TINY_TOKENIZER
    if name in BUILTIN_MODELS:
        home = Path(os.environ.get("OMRL_HOME", Path.home() / ".cache" / "omrl"))
        candidate = home / "models" / name / TOKENIZER_FILE
        return candidate if candidate.is_file() else None
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if (path / TOKENIZER_FILE).is_file():
        return path / TOKENIZER_FILE
    return None


def _report_model(source: RunSource) -> str | None:
    """``config.model.name`` of the eval report that came with the episodes (the source's, or the
    ``report.json`` beside a trajectory file, when it is a regular file there: a FIFO would hang), or None."""
    import json

    path = source.path
    beside = path.parent / "report.json"
    reports = list(source.reports) or ([beside] if path.is_file() and readable_inside(beside, path.parent) else [])
    for report in reports:
        try:
            model = json.loads(report.read_text(encoding="utf-8"))["config"]["model"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(model, str) and model:
            return model
    return None


def _config_model(config: Path | None) -> str | None:
    """``model.name`` of a run's config.yaml, or None."""
    if config is None:
        return None
    import yaml

    try:
        data: Any = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else None
