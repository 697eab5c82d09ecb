"""Typed configs: dataclasses with a help text per field, YAML presets, dotted overrides.

    cfg = load_config(TrainRunConfig, "grpo", ["algorithm.gamma=0.99", "model.name=tiny"])

Every command builds its config one way (:func:`command_line_config`): the class's
defaults, then a preset, then ``key=value`` overrides, then the command's flags; a flag
and an override that set one key to different values are refused.

A preset is a name in ``configs/`` (shipped with omrl) or a path to a YAML file.
An unknown key, a duplicate key or a wrong type raises ConfigError with the key's
dotted path and a suggestion. Keys a config class renamed (its ``renamed_keys``, old
dotted key -> new) are still read, with a warning. Plugin options live in the
free-form ``plugins`` block, keyed by plugin name: ``plugins.webshop.items_path=/data/items.json``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from omrl.config.fields import help_text
from omrl.config.redaction import check_no_redacted, redact
from omrl.errors import ConfigError

T = TypeVar("T")
_MISSING = object()
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
    if not path.suffix:
        path = presets_dir() / f"{preset}.yaml"
        if not path.exists():
            raise ConfigError(
                f"unknown preset {str(preset)!r}; valid: {', '.join(preset_names())} (or a path to a .yaml file)"
            )
    elif not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 YAML") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


class DeprecatedKeyWarning(FutureWarning):
    """A config key that was renamed: it still works, under its new name."""


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


def renamed_path(cls: type, path: list[str]) -> list[str]:
    """``path`` under its current name (``cls.renamed_keys`` lists old dotted keys -> new)."""
    old = ".".join(path)
    for before, after in getattr(cls, "renamed_keys", {}).items():
        if old == before or old.startswith(before + "."):
            return (after + old[len(before) :]).split(".")
    return path


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


def split_preset(preset: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """Command lines take ``[PRESET] [key=value ...]``: a first argument with '=' is an override."""
    overrides = list(overrides or [])
    if preset and "=" in preset:
        return None, [preset, *overrides]
    return preset, overrides


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


def parse_overrides(overrides: list[str]) -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=x"]`` -> ``[(["a", "b"], 1), (["c"], "x")]``, values parsed as YAML."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. algo.gamma=0.99)")
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


def overrides_to_dict(overrides: list[str]) -> dict[str, Any]:
    """``["k=v", "a.b=1"]`` -> ``{"k": "v", "a": {"b": 1}}``."""
    data: dict[str, Any] = {}
    for path, value in parse_overrides(overrides):
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
        raise ConfigError(f"preset {str(preset)!r} is for `omrl {data['command']}`, not `omrl {command.default}`")
    data = upgrade_keys(cls, data, f"preset {str(preset)!r}")
    given: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for path, value in parse_overrides(overrides or []):
        new_path = renamed_path(cls, path)
        if new_path != path:
            renamed[".".join(path)] = ".".join(new_path)
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
    data.pop("preset", None)
    check_no_redacted(data.get("plugins"), "plugins")
    return from_dict(cls, data)


def resumed_preset(output_dir: str | None, resume: bool, preset: str) -> str:
    """The preset a command starts from: with ``--resume``, the run's own ``config.yaml`` (so only
    what changes needs typing again), else ``preset``."""
    if resume and output_dir:
        saved = Path(output_dir).expanduser() / "config.yaml"
        if saved.is_file():
            return str(saved)
    return preset


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


def from_dict(cls: type[T], data: dict[str, Any], path: str = "", base: T | None = None) -> T:
    """Validate ``data`` against the dataclass ``cls`` and build it on top of ``base`` (or the defaults).

    A nested section starts from the enclosing class's default for it, so setting
    ``env.name`` keeps an eval config's ``env.split=test`` default.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'} expects a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    base = base if base is not None else cls()
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint} Valid keys here: {', '.join(fields)}")
        if dataclasses.is_dataclass(hints[key]):
            kwargs[key] = from_dict(hints[key], value, dotted, getattr(base, key))
        else:
            kwargs[key] = _coerce(value, hints[key], dotted)
    return dataclasses.replace(base, **kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {path!r} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {path!r} expects a list, got {value!r}")
        inner = args[0] if args else Any
        return (
            type(value)(_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value))
            if origin is list
            else tuple(_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value))
        )
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {path!r} expects a mapping, got {value!r}")
        inner = args[1] if len(args) == 2 else Any
        for k, v in value.items():
            if v is None and isinstance(k, str) and ":" in k:  # YAML read {goal:1} as the key "goal:1"
                name, _, number = k.partition(":")
                raise ConfigError(
                    f"config key {path!r} got {{{k}}}, which YAML reads as the key {k!r} with no value; "
                    f"write a space after the colon: {{{name}: {number}}}"
                )
        return {k: _coerce(v, inner, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int past float's range (about 1.8e308)
                raise ConfigError(
                    f"config key {path!r} expects a number, got an integer too large for one: "
                    f"{str(value)[:20]}... ({len(str(value))} digits)"
                ) from None
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"config key {path!r} expects {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain data for writing (config.yaml, a checkpoint's state.json, reports, loggers),
    secrets redacted: the one place every writer gets its config from, so none can leak a token.
    The run itself reads its secrets from ``cfg``, never from this."""
    return redact(dataclasses.asdict(cfg))


def to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cls: type, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) for every field, nested ones included.

    Defaults are read from ``cls()``, so a section shows the command's own (eval's ``env.split`` is
    test, though EnvConfig's is train)."""
    defaults = cls() if defaults is None else defaults
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + ".", getattr(defaults, f.name)))
            continue
        rows.append((key, _type_name(tp), repr(getattr(defaults, f.name)), help_text(f)))
    return rows
