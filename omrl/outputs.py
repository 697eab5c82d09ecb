"""Where a command may write: never over one of its own inputs, nor over the files a run keeps.

Every command that writes a file calls :func:`check_outputs` before it loads a model or plays an
episode, so a path that would destroy something fails at once, naming the path and what it
would replace, instead of after an hour of work (or, worse, silently: ``omrl rollout -o x.jsonl``
once wrote the parquet, then its readable JSONL over it).

What counts as a run's own file (refused as an output wherever the run lives):

- ``metrics.jsonl``, ``config.yaml`` of a run directory, and a checkpoint's ``state.json`` and
  ``COMPLETE``;
- anything under a run directory's ``checkpoints/``, ``rollouts/``, ``tensorboard/`` or ``wandb/``;
- model weights (``*.safetensors``, ``*.bin``, ``*.pt``, ...) and the files a saved model keeps
  beside them (``config.json``, ``tokenizer.json``, ...).

A run directory is one holding ``metrics.jsonl`` or ``checkpoints/``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Mapping

from omrl.errors import OmrlError

RUN_FILES = ("metrics.jsonl", "config.yaml")  # in a run directory
CHECKPOINT_FILES = ("state.json", "COMPLETE")  # in a checkpoint directory
RUN_DIRS = ("checkpoints", "rollouts", "tensorboard", "wandb")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
# what save_pretrained writes beside the weights
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "adapter_config.json",
    "chat_template.jinja",
)


class OutputError(OmrlError):
    """An output path that would write over an input of the command or over a run's own files."""


def check_outputs(
    outputs: Mapping[str, str | os.PathLike | None], inputs: Mapping[str, str | os.PathLike | None] | None = None
) -> None:
    """Refuse, before any work, outputs that would replace something that must stay.

    ``outputs`` and ``inputs`` map what each path is to the user (``"--report"``, ``"the
    readable JSONL"``; ``"the --model"``, ``"the source"``) to the path; None and "" are skipped.
    An output fails when it is an existing directory, another output, one of the inputs (a file
    given, or a file read out of an input directory: list those as inputs too), or a run's own
    file (see the module's docstring).
    """
    given = {what: Path(path).expanduser() for what, path in outputs.items() if path}
    sources = {what: Path(path).expanduser() for what, path in (inputs or {}).items() if path}
    seen: dict[Path, str] = {}
    for what, path in given.items():
        where = _resolved(path)
        if where in seen:
            raise OutputError(
                f"{what} and {seen[where]} would both be written to {path}, the second over the first; "
                "give paths that differ"
            )
        seen[where] = what
        if path.is_dir():
            raise OutputError(f"{what} {path} is a directory; give a file path (e.g. {path / _example(what)})")
        _check_folders(what, path)
        for source_what, source in sources.items():
            if source.exists() and where == _resolved(source):
                raise OutputError(
                    f"{what} {path} is {source_what} itself: writing it would replace what this "
                    "command reads; write to another file"
                )
        owned = own_file(path)
        if owned:
            raise OutputError(
                f"{what} {path} is {owned}: writing it would destroy it; write to a path outside "
                "the run's own files (e.g. beside the run directory)"
            )


@contextlib.contextmanager
def no_folder_left_empty(folder: str | os.PathLike) -> Iterator[None]:
    """Around a command's work: where it fails or is stopped before writing anything in ``folder``, which it
    made, the folder goes (an empty ``evals/x`` would look like a result)."""
    folder = Path(folder)
    made = not folder.exists()
    try:
        yield
    except BaseException:
        if made and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


def fresh_dir(parent: str, stem: str) -> str:
    """``<parent>/<stem>-<time>``, with ``-2``, ``-3``... when runs started in the same second: a default
    output directory that no earlier run holds."""
    import time

    base = Path(parent) / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)


def check_run_dir(
    output_dir: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None], resume: bool = False
) -> None:
    """A training run's ``output_dir`` must not be an input, lie inside one, or hold one among its own
    files: the run writes its model, config.yaml, metrics.jsonl and checkpoints there, over a base
    model or a dataset kept in it. (An input merely kept in ``output_dir``, beside those, is safe.) It
    must be a folder, or a path where one can be made; unless ``resume``, one that is not a run must
    hold none of the files a run writes (a model, a config.yaml of the user's)."""
    if not str(output_dir).strip():
        raise OutputError("output_dir is empty; give a folder for the run (e.g. --output-dir runs/my-run)")
    given = Path(output_dir).expanduser()
    out = _resolved(given)
    for what, path in inputs.items():
        if not path or not Path(path).expanduser().exists():
            continue  # a hub id or a built-in name: nothing on disk to replace
        source = _resolved(Path(path).expanduser())
        inside = out in source.parents and source.relative_to(out).parts[0] in (*RUN_DIRS, *RUN_FILES)
        if out == source or source in out.parents or inside or (out in source.parents and own_file(source)):
            raise OutputError(
                f"output_dir {output_dir} overlaps the input {what} {path}: the run would write its "
                "model, config.yaml and checkpoints over it; choose another output_dir"
            )
    check_output_folder("output_dir", output_dir, f"{given}-run")
    for name in RUN_DIRS:  # found at the first save, the steps before it would be lost
        if (given / name).exists() and not (given / name).is_dir():
            raise OutputError(
                f"output_dir {output_dir} holds a file named {name}, where the run writes its {name} folder; "
                "move the file away, or choose another output_dir"
            )
    kept = None if resume or is_run_dir(given) else _file_a_run_writes(given)
    if kept:  # an earlier run's own files are resume_point's to judge
        raise OutputError(
            f"output_dir {output_dir} is not a run but holds {kept}: the run would write its own over it; "
            "choose another output_dir (e.g. a new folder)"
        )


def check_output_folder(what: str, path: str | os.PathLike, example: str) -> None:
    """A folder a command writes its files into must be one, or a path where one can be made."""
    given = Path(path).expanduser()
    if given.exists() and not given.is_dir():
        raise OutputError(f"{what} {path} is a file; give a folder (e.g. {example})")
    _check_folders(what, given)


def own_file(path: Path) -> str | None:
    """What run or model file ``path`` is ("a run's metrics.jsonl", ...), or None."""
    path = _resolved(path)
    parent = path.parent
    if path.name in RUN_FILES and (path.exists() or is_run_dir(parent)):
        return f"a run's {path.name}"
    if path.name in CHECKPOINT_FILES and parent.parent.name in RUN_DIRS:
        return f"a checkpoint's {path.name}"
    if path.suffix.lower() in WEIGHT_SUFFIXES and (path.exists() or _holds_weights(parent)):
        return "model weights"
    if path.name in MODEL_FILES and _holds_weights(parent):
        return f"the {path.name} of the model saved in {parent}"
    for folder in path.parents:
        if folder.name in RUN_DIRS and is_run_dir(folder.parent):
            return f"inside the run's {folder.name}/ (in {folder.parent})"
    return None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run's output directory (what ``omrl train``, ``sft`` and ``rm train`` make)."""
    # not config.yaml alone: a project folder may keep its own preset under that name
    return (path / "metrics.jsonl").is_file() or (path / "checkpoints").is_dir()


def _file_a_run_writes(folder: Path) -> str | None:
    """The first file in ``folder`` that a run would write over: model weights, a saved model's files,
    a config.yaml."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.name in (*MODEL_FILES, "config.yaml") or path.suffix.lower() in WEIGHT_SUFFIXES):
            return path.name
    return None


def _holds_weights(folder: Path) -> bool:
    return folder.is_dir() and any(p.suffix.lower() in WEIGHT_SUFFIXES for p in folder.iterdir() if p.is_file())


def _resolved(path: Path) -> Path:
    """``path`` made absolute with links followed (a link to an input is that input)."""
    return Path(os.path.realpath(path))


def _check_folders(what: str, path: Path) -> None:
    """Refuse ``path`` when a folder it would go in is a file, or cannot be written in (a read-only file
    system, no permission): found before any work, not after every episode was played."""
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise OutputError(f"{what} {path} cannot be written: {folder} is a file, not a folder")
            if not os.access(folder, os.W_OK | os.X_OK):  # a read-only mount refuses root too
                raise OutputError(
                    f"{what} {path} cannot be written: the folder {folder} is not writable (a read-only file "
                    "system, or no permission); write elsewhere"
                )
            return


def _example(what: str) -> str:
    """A file name to suggest inside the directory that ``what`` names."""
    if "report" in what:
        return "report.json"
    return {"--out": "page.html", "the target": "conversations.jsonl"}.get(what, "episodes.parquet")
