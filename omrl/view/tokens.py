"""Per-token text for the token view, from the run's ``tokenizer.json``.

Trajectory files store token ids only (the ids the model sampled), so the page needs a
tokenizer to show them as text. It is found, in order: ``--tokenizer`` (a tokenizer.json,
a model directory, or a built-in model name), the run's own ``tokenizer.json`` (a run
directory saves the model beside its metrics), the model named in ``config.yaml``, the
tokenizer a trajectory file records in its metadata (``omrl.tokenizer``), and the model of the eval
report beside it. Where a file records its tokenizer's vocabulary, one with another is never used.
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

    def made(self, recorded: dict[str, Any] | None) -> bool:
        """Whether this tokenizer has the vocabulary of ``recorded`` (a file's fingerprint; None: any)."""
        from omrl.data.trajectory import tokenizer_fingerprint

        return recorded is None or tokenizer_fingerprint(self._tokenizer)["vocab"] == recorded.get("vocab")

    def pieces(self, ids: list[int]) -> list[str]:
        """The text of each token alone. A character split over several byte tokens shows as U+FFFD."""
        return self._tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


def find_tokenizer(source: RunSource, name: str | None = None) -> tuple[TokenText | None, str]:
    """The tokenizer for ``source`` and a line saying where it came from (or why there is none).

    Where the trajectory files record the tokenizer of their ids (``omrl.tokenizer``), only a tokenizer
    of that vocabulary is used: another would show every token as some other token's text."""
    recorded = source.recorded_tokenizer
    if name:
        path = _resolve(name)
        if path is None:
            raise OmrlError(
                f"--tokenizer {name!r}: no tokenizer.json found; valid: a tokenizer.json file, a model "
                f"directory holding one, or a built-in model name ({', '.join(BUILTIN_MODELS)})"
            )
        tokens = TokenText(path)
        if not tokens.made(recorded):
            raise OmrlError(
                f"--tokenizer {name!r}: its vocabulary is not the one the episodes' token ids were made with "
                f"({_recorded_name(recorded)}); give that tokenizer, or leave --tokenizer out"
            )
        return tokens, f"tokenizer: {path}"
    candidates = (
        (source.tokenizer, "the run's tokenizer.json"),
        (_resolve_name(_config_model(source.config)), "model.name in config.yaml"),
        (_resolve_name((recorded or {}).get("name")), "the tokenizer the trajectory file records"),
        (_resolve_name(_report_model(source)), "the model the eval report beside it names"),
    )
    other = []
    for path, where in candidates:
        if path is None:
            continue
        tokens = TokenText(path)
        if tokens.made(recorded):
            return tokens, f"tokenizer: {path}" if path == source.tokenizer else f"tokenizer: {path} ({where})"
        other.append(where)
    if other:
        return None, (
            f"no tokenizer of the episodes' vocabulary found ({_recorded_name(recorded)}; {' and '.join(other)} "
            "gives another); token ids shown: pass --tokenizer MODEL with that model's"
        )
    return None, "no tokenizer found (token ids shown; pass --tokenizer MODEL to see their text)"


def _recorded_name(recorded: dict[str, Any] | None) -> str:
    recorded = recorded or {}
    return f"{recorded.get('name') or 'a tokenizer'}, {recorded.get('size')} tokens"


def _resolve_name(name: Any) -> Path | None:
    return _resolve(name) if isinstance(name, str) and name else None


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
