"""What omrl reads of a verifiers environment's rubric: the rubrics inside it, its reward functions watched for
failures, its parser's format reward, and the reward and metrics it gave a scored rollout."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any

from omrl.errors import short_repr


def rubrics_of(rubric: Any) -> list[Any]:
    """A rubric and every rubric inside it (a RubricGroup's, an EnvGroup's environments')."""
    out = [rubric]
    for child in getattr(rubric, "rubrics", None) or []:
        out += rubrics_of(child)
    for env in (getattr(rubric, "env_map", None) or {}).values():
        out += rubrics_of(env.rubric)
    return out


def watched(func: Any, failures: list[str]) -> Any:
    """``func`` (a reward function), noting in ``failures`` what it raised before raising it again, and a value
    that is no finite number: verifiers would turn ``None`` into 0 silently (its ``float()`` is outside any
    watch), so it raises for that too, and verifiers scores it 0 as it scores a function that raised."""
    name = getattr(func, "__name__", repr(func))

    @functools.wraps(func)
    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
            result = await result if inspect.isawaitable(result) else result
        except Exception as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            raise
        if not is_finite_number(result):
            failures.append(f"{name} returned {short_repr(result)}, not a finite number")
            raise TypeError(f"reward function {name} returned {short_repr(result)}, not a finite number")
        return result

    watched.omrl_watched = True  # type: ignore[attr-defined]
    return watched


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a real number (a bool, an int, a float, numpy's) other than NaN and infinity."""
    return isinstance(value, numbers.Real) and math.isfinite(value)


def watch_rewards(rubric: Any, failures: list[str]) -> None:
    """Watch every reward function of ``rubric`` (and the rubrics inside it) once, noting failures in ``failures``."""
    for inner in rubrics_of(rubric):
        inner.funcs = [f if getattr(f, "omrl_watched", False) else watched(f, failures) for f in inner.funcs]


def format_reward(vf: Any, parser: Any) -> Any:
    """The parser's format reward function, or None where its class keeps verifiers' ``Parser``'s own."""
    overrides = type(parser).get_format_reward_func is not vf.Parser.get_format_reward_func
    return parser.get_format_reward_func() if overrides else None


def rubric_scores(state: Any) -> tuple[float, dict[str, float]]:
    """The rubric's reward of a scored rollout's ``state``, and the value of each of its functions and metrics
    (with ``parser_format``, the parser's format reward, where the env scored it)."""
    reward = float(state.get("reward") or 0.0)
    metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
    if "omrl_parser_format" in state:
        metrics["parser_format"] = float(state["omrl_parser_format"])
    return reward, metrics
