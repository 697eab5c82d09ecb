"""An env's worked example for a prompt: a concrete action, its own or a call of its first tool.

A template shows it in the system prompt; ``omrl env serve`` sends it in ``GET /tasks`` so that a client of
the served env prompts with the same example as the env played in-process.
"""

from __future__ import annotations

from typing import Any

from omrl.errors import OmrlError

_EXAMPLE_VALUES = {"string": None, "integer": 1, "number": 1, "boolean": True}


def example_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Plausible arguments for a tool: enum values, or the parameter's own name for strings."""
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    names = params.get("required") or list(props)
    args = {}
    for key in names:
        spec = props.get(key, {})
        if spec.get("enum"):
            args[key] = spec["enum"][0]
        else:
            value = _EXAMPLE_VALUES.get(spec.get("type", "string"))
            args[key] = key if value is None else value
    return args


def example_action(env: Any) -> str:
    """A concrete action for the system prompt's example, or "" when none can be made.

    The env's ``action_example`` if it sets one, else a call of its first tool.
    """
    example = env.action_example
    if isinstance(example, str) and example.strip():
        return example.strip()
    tools = getattr(env, "tools", None) or []
    if not tools:
        return ""
    try:
        return env.action_from_tool_call(tools[0]["name"], example_arguments(tools[0]))
    except Exception as exc:
        raise OmrlError(
            f"{type(env).__name__}.action_from_tool_call failed on its own first tool "
            f"{tools[0].get('name')!r}: {type(exc).__name__}: {exc}"
        ) from exc
