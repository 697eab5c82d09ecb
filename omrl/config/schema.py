"""The config schema: plain data checked against a config's dataclasses and built into one
(:func:`from_dict`), a config back to plain data (:func:`to_dict`, :func:`to_yaml`), and the list of
every key with its type, default and help (:func:`describe`).

An unknown key raises ConfigError with its dotted path and the closest valid key; a value of the wrong
type raises one naming the type the key expects.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from omrl.config.fields import help_text
from omrl.config.redaction import redact
from omrl.errors import ConfigError

T = TypeVar("T")


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
            raise ConfigError(_unknown_key(key, dotted, path, fields, hints))
        if dataclasses.is_dataclass(hints[key]):
            kwargs[key] = from_dict(hints[key], value, dotted, getattr(base, key))
        else:
            kwargs[key] = _coerce(value, hints[key], dotted)
            _check_bounds(kwargs[key], fields[key].metadata, dotted)
    return dataclasses.replace(base, **kwargs)


def _check_bounds(value: Any, metadata: Any, dotted: str) -> None:
    """Refuse a number outside the field's ``low``/``high`` (:func:`omrl.config.fields.opt`)."""
    low, high = metadata.get("low"), metadata.get("high")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (low is None and high is None):
        return
    if value != value:  # NaN: within no range
        raise ConfigError(f"config key {dotted!r} must be a number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        valid = f"between {low:g} and {high:g}" if low is not None and high is not None else None
        valid = valid or (f">= {low:g}" if low is not None else f"<= {high:g}")
        raise ConfigError(f"config key {dotted!r} must be {valid}, got {value!r}")


def _unknown_key(key: str, dotted: str, path: str, fields: dict[str, Any], hints: dict[str, Any]) -> str:
    """The error for ``key``, not a field here: a close name, or a section below that has it (``strategy``
    is ``rollout.strategy`` in a train config), and the valid keys."""
    prefix = path + "." if path else ""
    below = [
        f"{name}.{key}"
        for name in fields
        if dataclasses.is_dataclass(hints[name]) and key in {f.name for f in dataclasses.fields(hints[name])}
    ]
    close = below or difflib.get_close_matches(key, list(fields), n=1)
    hint = f"; did you mean {prefix + close[0]!r}? Valid" if close else "; valid"
    return f"unknown config key {dotted!r}{hint} keys here: {', '.join(fields)}"


def is_text_key(cls: type, path: list[str]) -> bool:
    """Whether the dotted ``path`` of config class ``cls`` holds text (``str``, or ``str`` or None)."""
    tp: Any = cls
    for part in path:
        if not dataclasses.is_dataclass(tp) or part not in {f.name for f in dataclasses.fields(tp)}:
            return False  # an unknown key (from_dict names it) or inside a free-form mapping
        tp = typing.get_type_hints(tp)[part]
    return {a for a in get_args(tp) if a is not type(None)} == {str} if get_origin(tp) else tp is str


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:  # a choice of values: the values, as a config writes them
        return " | ".join(map(repr, get_args(tp)))
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
