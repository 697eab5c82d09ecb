"""What the page shows of episodes an agent program played through omrl's gateway (:mod:`omrl.gateway`).

Such an episode's turns carry in their info: ``rollout.row`` (the row the turn is in: an agent may
send a prompt that does not continue the last one, and that starts a new row), ``tool_calls`` (each
``<tool_call>`` attempt of the reply with its status), and on the last turn ``agent_result`` (what the
agent returned) and ``agent_reward`` (the reward function's components). Files are read as they are:
a field of another shape is left out, never an error.
"""

from __future__ import annotations

import math
from typing import Any, Callable

OK = "ok"


def played_by_agent(infos: list[dict[str, Any]]) -> bool:
    """Whether the turns' infos are a gateway episode's: the gateway alone records each turn's row, and
    ``agent_result`` on the last.

    >>> played_by_agent([{"rollout": {"row": 0}}]), played_by_agent([{"rollout": {"new_tokens": 3}}])
    (True, False)
    """
    return any(isinstance(i.get("rollout"), dict) and "row" in i["rollout"] or "agent_result" in i for i in infos)


def tool_attempts(info: dict[str, Any], cut: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The turn's tool-call attempts as ``{status, name, error}`` (name and error None when absent),
    error texts cut by ``cut``; [] when the reply made none.

    >>> tool_attempts({"tool_calls": [{"status": "unclosed", "name": None, "error": "no </tool_call>"}]}, str)
    [{'status': 'unclosed', 'name': None, 'error': 'no </tool_call>'}]
    """
    calls = info.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [
        {
            "status": str(call.get("status") or "unknown"),
            "name": _text(call.get("name")),
            "error": cut(_text(call.get("error"))),
        }
        for call in calls
        if isinstance(call, dict)
    ]


def status_counts(turns: list[dict[str, Any]]) -> dict[str, int]:
    """How many tool-call attempts of the episode had each status, ``ok`` first."""
    counts: dict[str, int] = {}
    for turn in turns:
        for call in turn["tool_calls"]:
            counts[call["status"]] = counts.get(call["status"], 0) + 1
    return dict(sorted(counts.items(), key=lambda item: item[0] != OK))


def agent_result(info: dict[str, Any], cut: Callable[[Any], Any]) -> str | None:
    """The short repr of what the agent returned (on the last turn), or None."""
    return cut(_text(info.get("agent_result")))


def agent_reward(info: dict[str, Any]) -> dict[str, float] | None:
    """The reward function's named components (on the last turn), or None when it did not score it."""
    components = info.get("agent_reward")
    if not isinstance(components, dict):
        return None
    return {str(name): float(value) for name, value in components.items() if _finite(value)}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
