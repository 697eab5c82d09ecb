"""Presets: the YAML files a command's config starts from (``configs/`` shipped with omrl, or a path to
the user's own), and how a command line ``[PRESET] [key=value ...]`` names one.

A preset is read strictly: a key given twice in one mapping, text that is not UTF-8 or YAML that does
not parse raises ConfigError naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from omrl.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs"


def presets_dir() -> Path:
    """Where shipped presets live (the source tree or the installed omrl_configs package)."""
    if PRESETS_DIR.is_dir():
        return PRESETS_DIR
    import omrl_configs  # installed non-editable: package-dir maps configs/ to omrl_configs

    return Path(omrl_configs.__file__).parent


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


def read_preset(preset: str | Path) -> dict[str, Any]:
    """The raw dict of a preset name or YAML path."""
    path = Path(preset)
    shipped = not path.suffix and (presets_dir() / f"{preset}.yaml").exists()
    if not shipped and path.expanduser().is_dir():  # `omrl eval runs/x`: a run's folder where a preset goes
        raise ConfigError(
            f"{preset} is a folder, not a preset (one of {', '.join(preset_names())}, or a .yaml file): to play "
            f"the model saved in it, give --model {preset}; to continue the run in it, --resume --output-dir {preset}"
        )
    if not path.suffix:
        path = presets_dir() / f"{preset}.yaml"
        if not path.exists():
            import difflib

            close = difflib.get_close_matches(str(preset), preset_names(), n=1)
            hint = f"; did you mean {close[0]!r}? Valid" if close else "; valid"
            raise ConfigError(
                f"unknown preset {str(preset)!r}{hint}: {', '.join(preset_names())} (or a path to a .yaml file)"
            )
    elif not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 YAML") from exc
    except yaml.YAMLError as exc:  # one line: pyyaml's own text draws the line with a marker under it
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def split_preset(preset: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """Command lines take ``[PRESET] [key=value ...]``: a first argument with '=' is an override."""
    overrides = list(overrides or [])
    if preset and "=" in preset:
        return None, [preset, *overrides]
    return preset, overrides


def preset_inputs(args: list[str] | None, resume: bool = False) -> dict[str, str]:
    """The user's own YAML file among the command line ``[PRESET] [key=value ...]``, as an input a run
    must not write over (``{"the preset": path}``); none for a shipped preset or a resumed run (which
    plays its own config.yaml)."""
    preset, _ = split_preset(args[0] if args else None, [])
    if resume or preset is None or not Path(preset).suffix:
        return {}
    return {"the preset": preset}


def user_sets(args: list[str] | None, key: str) -> bool:
    """Whether the command line ``[PRESET] [key=value ...]`` sets the dotted ``key``: by an override
    of it (or of a section holding it), or in a YAML file of the user's own. A shipped preset's
    values are defaults, not the user's choice."""
    preset, overrides = split_preset(args[0] if args else None, list(args or [])[1:])
    parts = key.split(".")
    enclosing = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    if any(item.split("=", 1)[0].strip() in enclosing for item in overrides):
        return True
    if preset is None or preset in preset_names():
        return False
    data: Any = read_preset(preset)
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def resumed_preset(output_dir: str | None, resume: bool, preset: str | None) -> str | None:
    """The preset a command starts from: with ``--resume``, the run's own ``config.yaml`` (so only
    what changes needs typing again), else ``preset``. ``--resume`` needs ``--output-dir``: a default
    folder is a fresh one, with nothing to resume."""
    if resume and not output_dir:
        raise ConfigError("--resume needs --output-dir: the run directory to continue")
    if resume:
        folder = Path(output_dir).expanduser()
        if not folder.is_dir():  # said first: what else is missing (a dataset) would be the run's to give
            raise ConfigError(f"nothing to resume: no folder {folder}; run without --resume to start a run there")
        if (folder / "config.yaml").is_file():
            return str(folder / "config.yaml")
        if not (folder / "checkpoints").is_dir():  # said before the settings a run would play
            raise ConfigError(
                f"nothing to resume: {folder} holds no run (no config.yaml, no checkpoints); run without --resume "
                "to start one there"
            )
    return preset
