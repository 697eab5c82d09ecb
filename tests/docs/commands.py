"""Every ``omrl ...`` command line in README.md, the contributor's guides and docs/*.md, a check of one
against the real CLI, and a shell that runs the docs' commands as a reader would."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`(omrl [^`\n]+)`(?!`)")
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>")


def doc_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "AGENTS.md", *sorted((REPO / "docs").rglob("*.md"))]


def omrl_args(segment: str) -> list[str] | None:
    """The arguments after ``omrl`` in one shell command (``omrl ...``, ``VAR=x omrl ...``,
    ``accelerate launch ... -m omrl ...``, ``python -m omrl ...``), or None if it runs no omrl."""
    words = shlex.split(segment, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    if words[:1] == ["omrl"]:
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "omrl":
            return words[i + 2 :]
    return None


def command_lines(text: str) -> list[tuple[str, bool]]:
    """(line, inline) for the shell command lines of a markdown text: fenced shell blocks (``\\``
    continuations joined, ``&&`` chains split) and inline code spans that start with ``omrl ``."""
    lines = []
    for lang, body in FENCE.findall(text):
        if lang not in SHELL_LANGS:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            lines += [(part.strip(), False) for part in line.split("&&") if part.strip()]
    lines += [(span, True) for span in INLINE.findall(text)]
    return lines


def examples() -> list[tuple[str, str, bool]]:
    """(where, command line, inline) for every omrl command line in the docs, except those with a
    placeholder (``...``, ``<x>``), which are left out."""
    found = []
    for path in doc_files():
        for line, inline in command_lines(path.read_text(encoding="utf-8")):
            if not PLACEHOLDER.search(line) and omrl_args(line) is not None:
                found.append((path.relative_to(REPO).as_posix(), line, inline))
    return found


def skipped() -> list[tuple[str, str]]:
    """The omrl command lines left out for a placeholder."""
    return [
        (path.relative_to(REPO).as_posix(), line)
        for path in doc_files()
        for line, _ in command_lines(path.read_text(encoding="utf-8"))
        if PLACEHOLDER.search(line) and line.lstrip().startswith("omrl")
    ]


def remaining_args(ctx) -> list[str]:
    """What a group's context left for its subcommand (click keeps the subcommand's name apart)."""
    protected = getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", None) or []
    return [*protected, *ctx.args]


def check_command(args: list[str], mention: bool = False) -> None:
    """Parse ``omrl ARGS`` as the real CLI would and check its key=value overrides against the
    command's config schema. Raises AssertionError saying what is wrong.

    A ``mention`` (an inline span in prose, such as `omrl view`) may name a command without the
    arguments it needs: only the command has to exist then."""
    import typer

    from omrl.cli import build_app

    command, name, path, parent = typer.main.get_command(build_app()), "omrl", [], None
    while True:
        if mention and path and not args:
            return
        try:
            ctx = command.make_context(name, list(args), parent=parent)
        except Exception as exc:  # noqa: BLE001 - click's usage errors and --help's exit
            if getattr(exc, "exit_code", None) == 0:  # --help, --version
                return
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise AssertionError(f"`{' '.join(['omrl', *path])}` refuses it: {message}") from exc
        if not hasattr(command, "commands"):
            break
        rest = remaining_args(ctx)
        if not rest:
            return
        try:
            name, command, args = command.resolve_command(ctx, rest)
        except Exception as exc:  # noqa: BLE001
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise AssertionError(f"`{' '.join(['omrl', *path])}`: {message}") from exc
        path, parent = [*path, name], ctx
    check_overrides(path, ctx.params)


def check_overrides(path: list[str], params: dict) -> None:
    """The preset and key=value overrides of a command that runs a job, or of `omrl config show`."""
    from omrl.config import DeprecatedKeyWarning, load_config, preset_names, read_preset
    from omrl.config.loading import split_preset
    from omrl.config.options import CONFIG_CLASSES
    from omrl.errors import ConfigError

    key = "-".join(path)
    if key == "config-show":
        preset, overrides = params["preset"], list(params["overrides"] or [])
        cls = CONFIG_CLASSES[read_preset(preset).get("command", "train")]
    elif key in CONFIG_CLASSES:
        args = list(params.get("args") or [])
        preset, overrides = split_preset(args[0] if args else None, args[1:])
        cls = CONFIG_CLASSES[key]
    else:
        return
    if preset is not None and preset not in preset_names() and not Path(preset).exists():
        preset = None  # a YAML file of the reader's own: only the overrides can be checked
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedKeyWarning)  # examples use today's keys
        try:
            load_config(cls, preset, overrides)
        except (ConfigError, DeprecatedKeyWarning) as exc:
            raise AssertionError(f"`omrl {' '.join(path)}` config: {exc}") from exc


def shell(command: str, cwd: Path = REPO, timeout: int = 600) -> subprocess.CompletedProcess:
    """``command`` run by a shell in ``cwd``, offline, with this Python's scripts (``omrl``) first on the PATH."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_each(commands: list[str], cwd: Path) -> None:
    """Run ``commands`` in turn in ``cwd``, as a reader pastes them: each must succeed."""
    for command in commands:
        done = shell(command, cwd)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
