"""Typed configs: dataclasses with a help text per field, YAML presets, dotted overrides.

    cfg = load_config(TrainRunConfig, "grpo", ["algorithm.gamma=0.99", "model.name=tiny"])

Every command builds its config one way (:func:`command_line_config`): the class's
defaults, then a preset, then ``key=value`` overrides, then the command's flags; a flag
and an override that set one key to different values are refused.

A preset is a name in ``configs/`` (shipped with omrl) or a path to a YAML file
(:mod:`omrl.config.presets`). An unknown key, a duplicate key or a wrong type raises ConfigError
with the key's dotted path and a suggestion (:mod:`omrl.config.schema`). Keys a config class
renamed (its ``renamed_keys``, old dotted key -> new) are still read, with a warning. Plugin
options live in the free-form ``plugins`` block, keyed by plugin name:
``plugins.webshop.items_path=/data/items.json``.
"""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path
from typing import Any, TypeVar

import yaml

from omrl.config.presets import read_preset, split_preset
from omrl.config.redaction import check_no_redacted
from omrl.config.schema import from_dict, is_text_key
from omrl.errors import ConfigError

T = TypeVar("T")
_MISSING = object()


class DeprecatedKeyWarning(FutureWarning):
    """A config key that was renamed: it still works, under its new name."""


def renamed_path(cls: type, path: list[str]) -> list[str]:
    """``path`` under its current name (``cls.renamed_keys`` lists old dotted keys -> new, each a value, so a
    path below one, ``algo.gamma``, is no renamed key but an unknown one)."""
    renamed = getattr(cls, "renamed_keys", {}).get(".".join(path))
    return renamed.split(".") if renamed else path


def warn_renamed(renamed: dict[str, str], source: str) -> None:
    """One warning naming every renamed key ``source`` used (old -> new)."""
    if renamed:
        pairs = ", ".join(f"{old} -> {new}" for old, new in renamed.items())
        warnings.warn(
            f"{source} uses config keys that were renamed ({pairs}); the old names still work for now",
            DeprecatedKeyWarning,
            stacklevel=3,
        )


def upgrade_keys(cls: type, data: dict[str, Any], source: str, warn: bool = True) -> dict[str, Any]:
    """``data`` (a preset's or a checkpoint's mapping) with renamed keys moved to their new names;
    an old and a new key that disagree raise ConfigError."""
    out = copy_mappings(data)
    moved: dict[str, str] = {}
    for before, after in getattr(cls, "renamed_keys", {}).items():
        value = get_path(out, before.split("."))
        if value is _MISSING:
            continue
        current = get_path(out, after.split("."))
        if current is not _MISSING and current != value:
            raise ConfigError(f"{source}: {before}={value!r} and {after}={current!r} disagree; give {after} only")
        _pop_path(out, before.split("."))
        set_path(out, after.split("."), value)
        moved[before] = after
    if warn:
        warn_renamed(moved, source)
    return out


def copy_mappings(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of nested mappings (values themselves are shared)."""
    return {k: copy_mappings(v) if isinstance(v, dict) else v for k, v in data.items()}


def get_path(data: dict[str, Any], path: list[str]) -> Any:
    """The value at a dotted ``path`` of nested mappings, or ``_MISSING``."""
    node: Any = data
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop_path(data: dict[str, Any], path: list[str]) -> None:
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


def parse_overrides(overrides: list[str], example: str = "optim.learning_rate=1e-5") -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=x"]`` -> ``[(["a", "b"], 1), (["c"], "x")]``, values parsed as YAML; ``example`` shows a
    valid one in the error for an item that is not key=value."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. {example})")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out.append((key.strip().split("."), value))
    return out


def set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set one dotted key: only that leaf changes (a mapping value replaces the whole mapping)."""
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)!r} sets inside {part!r}, which is a value")
        node = child
    node[path[-1]] = value


def overrides_to_dict(overrides: list[str], example: str = "optim.learning_rate=1e-5") -> dict[str, Any]:
    """``["k=v", "a.b=1"]`` -> ``{"k": "v", "a": {"b": 1}}``."""
    data: dict[str, Any] = {}
    for path, value in parse_overrides(overrides, example):
        set_path(data, path, value)
    return data


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(
    cls: type[T],
    preset: str | Path | None = None,
    overrides: list[str] | None = None,
    values: dict[str, Any] | None = None,
) -> T:
    """Build ``cls`` from its defaults, then the preset, then ``key=value`` overrides, then ``values``.

    ``values`` maps dotted keys to already typed values (command-line flags); one that an
    override sets to something else is refused (which of the two was meant is not clear).
    """
    data = read_preset(preset) if preset else {}
    command = getattr(cls, "__dataclass_fields__", {}).get("command")
    if command is not None and data.get("command", command.default) != command.default:
        wanted, this = (
            name.replace("-", " ") for name in (str(data["command"]), command.default)
        )  # rm-eval: `omrl rm eval`
        raise ConfigError(f"preset {str(preset)!r} is for `omrl {wanted}`, not `omrl {this}`")
    data = upgrade_keys(cls, data, f"preset {str(preset)!r}")
    if preset and Path(str(preset)).suffix:  # a YAML file of the user's: a mistake in it names the file
        try:
            from_dict(cls, {k: v for k, v in data.items() if k != "preset"})
        except ConfigError as exc:
            raise ConfigError(f"{preset}: {exc}") from None
    given: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for item, (path, value) in zip(overrides or [], parse_overrides(overrides or [])):
        new_path = renamed_path(cls, path)
        if new_path != path:
            renamed[".".join(path)] = ".".join(new_path)
        if isinstance(value, (int, float, datetime.date)) and is_text_key(cls, new_path):
            value = item.split("=", 1)[1].strip()  # YAML read 0755 as 493, 12:30 as 750: keep the text typed
        elif len(new_path) == 3 and new_path[0] == "plugins":  # a plugin's option: its signature says if text
            from omrl.plugin_options import typed_text

            value = typed_text(new_path[1], new_path[2], item.split("=", 1)[1], value)
        set_path(data, new_path, value)
        given[".".join(new_path)] = value
    warn_renamed(renamed, "the command line")
    flags = {".".join(renamed_path(cls, key.split("."))): value for key, value in (values or {}).items()}
    both = [key for key in flags if key in given]
    if both:  # compare as the config reads them (an override is YAML text: 1e-3 is a string there)
        typed = from_dict(cls, {k: v for k, v in data.items() if k != "preset"})
        for key in both:
            value = typed
            for part in key.split("."):
                value = value[part] if isinstance(value, dict) else getattr(value, part)
            if value != flags[key]:
                raise ConfigError(
                    f"the override {key}={given[key]!r} and the flag for {key} ({flags[key]!r}) "
                    "disagree; give one of them"
                )
    for key, value in flags.items():
        set_path(data, key.split("."), value)
    named = {*given, *flags}
    if "env.name" in named and "env.mix" not in named and isinstance(data.get("env"), dict) and data["env"].get("mix"):
        data["env"]["mix"] = []  # --env on the command line replaces the preset's mixture, as any later value does
    data.pop("preset", None)
    check_no_redacted(data.get("plugins"), "plugins")
    return from_dict(cls, data)


def command_line_config(
    cls: type[T], args: list[str] | None, flags: dict[str, Any] | None = None, default_preset: str | None = None
) -> T:
    """The config of a command invoked as ``omrl CMD [PRESET] [key=value ...] --flags``.

    ``flags`` maps dotted keys to typed values; None means the flag was not given.
    """
    args = list(args or [])
    preset, overrides = split_preset(args[0] if args else None, args[1:])
    return load_config(
        cls, preset or default_preset, overrides, {k: v for k, v in (flags or {}).items() if v is not None}
    )
