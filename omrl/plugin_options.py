"""A plugin's options checked against its signature before it runs, one way for every kind (an env, a
template, a reward, a rollout strategy or scorer, a verifiers env's ``load_environment``): the names it
takes (:func:`check_arguments`) and, where a parameter declares a flag or a number, each value's type
(:func:`option_type_problem`). A bad option reads the same whatever would have taken it."""

from __future__ import annotations

import inspect
from typing import Any

from omrl.errors import ConfigError


def check_options(fn: Any, options: dict[str, Any], what: str, fixed: int = 0) -> None:
    """Refuse ``options`` that ``fn`` does not take after its first ``fixed`` positional parameters (a
    reward's episodes), then a text where one of its parameters declares a flag or a number, by its
    annotation or its default (:func:`option_type_problem`): a ConfigError naming ``what``."""
    check_arguments(fn, options, what, "options", fixed)
    signature = _signature(fn)
    problem = option_type_problem(signature, options) if signature is not None else None
    if problem:
        raise ConfigError(f"{what} option {problem}")


def check_arguments(fn: Any, arguments: dict[str, Any], what: str, called: str, fixed: int = 0) -> None:
    """Refuse ``arguments`` that ``fn`` (a class or function) does not take after its first ``fixed``
    positional parameters, or that leave one it needs without a value: a ConfigError that says ``what``
    "does not take <called> [...]" and names the ones it does. One without a signature (a builtin) is
    not judged."""
    signature = _signature(fn)
    if signature is None:
        return
    parameters = list(signature.parameters.values())
    takes = [p.name for p in parameters[fixed:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    listed = f"its {called}: {', '.join(takes) or '(none)'}"
    open_ended = any(p.kind is p.VAR_KEYWORD for p in parameters)
    unknown = [] if open_ended else sorted(set(arguments) - set(takes))
    if unknown:
        raise ConfigError(f"{what} does not take {called} {unknown}; {listed}")
    try:
        signature.bind(*[None] * fixed, **arguments)
    except TypeError as exc:
        needed = [
            p.name
            for p in parameters[fixed:]
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in arguments
        ]
        if needed:  # "does not take options []" once said that it needs one
            raise ConfigError(f"{what} needs a value for {', '.join(needed)} (no default); {listed}") from exc
        raise ConfigError(f"{what} does not take {called} {sorted(arguments)} ({exc}); {listed}") from exc


def option_type_problem(signature: inspect.Signature, options: dict[str, Any], by_default: bool = True) -> str | None:
    """``KEY=VALUE is invalid; valid: ...`` for the first option that is not a flag or a number where its
    parameter is annotated as one (``bool``, ``int``, ``float``) or, with ``by_default``, has such a
    default ("false" in quotes is no false, "abc" no count), or None. A plugin's code would otherwise
    meet the text mid-episode, as its own failure."""
    for key, value in options.items():
        parameter = signature.parameters.get(key)
        kind = _declared_kind(parameter, by_default) if parameter is not None else None
        if kind is bool and not isinstance(value, bool):
            return f"{key}={value!r} is invalid; valid: true or false"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float and not number:
            return f"{key}={value!r} is invalid; valid: a number"
        if kind is int and not (number and isinstance(value, int)):
            return f"{key}={value!r} is invalid; valid: a whole number"
    return None


def _declared_kind(parameter: inspect.Parameter, by_default: bool) -> type | None:
    """``bool``, ``int`` (annotated so: a whole number) or ``float`` (any number) where ``parameter`` declares
    one, else None (any value). An unannotated default of 5 declares only a number: 5.5 may be meant."""
    name = _declared_name(parameter)
    if name == "bool":
        return bool
    if name == "int":
        return int
    if name == "float":
        return float
    if parameter.annotation is not parameter.empty or not by_default:  # an Optional, a union, a text: not ours to judge
        return None
    default = parameter.default
    if isinstance(default, bool):
        return bool
    return float if isinstance(default, (int, float)) else None


def _declared_name(parameter: inspect.Parameter) -> str:
    """The name of the type ``parameter`` is annotated with (``"int"``), its text under postponed annotations,
    empty where it has none or one without a name (a union)."""
    annotation = parameter.annotation
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: its call decides
        return None


def typed_text(name: str, key: str, raw: str, value: Any) -> Any:
    """``value`` (``raw`` read as YAML) of option ``key`` of plugin ``name``, or ``raw`` itself where the plugin
    declares that option as text (annotated ``str``, or a text default): ``instruction=Note: be brief`` is
    text, not a mapping, as a config key of text keeps what was typed (``omrl.config.loading``)."""
    if isinstance(value, str) or value is None:
        return value
    from omrl import registry

    for component in registry.all_components():
        if component.name != name:
            continue
        try:
            signature = _signature(component.obj)
        except Exception:  # noqa: BLE001 - a plugin that does not import says so where it is used
            continue
        parameter = signature.parameters.get(key) if signature is not None else None
        if parameter is None:
            continue
        declared = _declared_name(parameter)
        if declared == "str" or (parameter.annotation is parameter.empty and isinstance(parameter.default, str)):
            return raw.strip()
    return value
