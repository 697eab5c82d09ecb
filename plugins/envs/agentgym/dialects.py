"""How the ``agentgym`` client speaks to a server: every request body it builds and every answer it
reads goes through the server's :class:`~.servers.ServerSpec` (the table of known servers and their
shapes: :mod:`.servers`), so a known server gets exactly the fields it declares and an answer missing
one of its keys is a malformed answer (an EnvError naming the key), not a guess. The step's score and
``won`` are derived as the spec gives, and :func:`same_env` tells whether an env id still holds the
env its client left there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from omrl_plugins.envs.agentgym.servers import DIALECTS, GENERIC_SERVER, KNOWN_SERVERS, ServerSpec, as_omrl_server
from omrl_plugins.envs.agentgym.transport import snippet

__all__ = [
    "DIALECTS",
    "GENERIC_SERVER",
    "KNOWN_SERVERS",
    "MalformedAnswer",
    "ResetParts",
    "ServerSpec",
    "StepParts",
    "as_omrl_server",
    "as_text",
    "clip",
    "create_body",
    "flag",
    "number",
    "observed",
    "read_create",
    "read_reset",
    "read_step",
    "same_env",
]

#: keys of a reset answer that are protocol, not information about the task
RESET_PROTOCOL_KEYS = frozenset(
    {
        "id",
        "env_idx",
        "observation",
        "state",
        "instruction",
        "task_description",
        "available_actions",
        "reward",
        "score",
        "done",
        "deleted",
        "info",
    }
)


class MalformedAnswer(ValueError):
    """An answer without the shape its server's spec gives (the client reports it as a ServerFailure)."""


def create_body(spec: ServerSpec, task_id: int) -> dict[str, Any] | None:
    """The ``/create`` body of ``spec``'s server for an episode of ``task_id``."""
    return {"none": None, "empty": {}, "task": {"id": task_id}}[spec.create_body]


def read_create(spec: ServerSpec, answer: Any) -> tuple[int, str | None, bool]:
    """(env id, omrl server instance or None, deterministic) from a ``/create`` answer."""
    instance, deterministic = None, False
    if isinstance(answer, dict):
        if isinstance(answer.get("instance"), str) and answer["instance"]:
            instance = answer["instance"]
        if "deterministic" in answer:
            deterministic = flag(answer, "deterministic")
        keys = ("id", *spec.create_keys) if instance else spec.create_keys  # an omrl server answers "id"
        key = next((k for k in keys if k in answer), None)
        env_id = answer[key] if key is not None else None
    else:
        env_id = answer if spec.bare_id else None
    if isinstance(env_id, bool) or not isinstance(env_id, int):
        shapes = [f"{{{k!r}: <int>}}" for k in spec.create_keys] + (["a bare int"] if spec.bare_id else [])
        raise MalformedAnswer(f"expected an env id ({' or '.join(shapes)}), got {snippet(json.dumps(answer))}")
    return env_id, instance, deterministic


@dataclass
class ResetParts:
    """What a ``/reset`` answer says: observation (None: ask GET /observation), instruction, and more."""

    observation: Any = None
    instruction: str = ""
    actions: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    score: float | None = None  # the running score the episode starts at (babyai, sciworld)


def read_reset(spec: ServerSpec, answer: Any) -> ResetParts:
    """The parts of a ``/reset`` answer, in one of ``spec.reset_shapes`` (MalformedAnswer otherwise)."""
    if not spec.reset_shapes:
        return ResetParts()
    if "object" in spec.reset_shapes and isinstance(answer, dict):
        observation = answer[_present(answer, spec.observation_keys)]
        key = spec.instruction_key
        parts = ResetParts(
            observation,
            str(answer[key]) if key and answer.get(key) else "",
            _action_list(answer.get("available_actions")),
            {k: v for k, v in answer.items() if k not in RESET_PROTOCOL_KEYS},
        )
        if isinstance(answer.get("info"), dict):  # an omrl server's env info
            parts.info.update(answer["info"])
        if spec.score_field and spec.score_field in answer:
            parts.score = clip(number(answer, spec.score_field) / spec.score_scale)
        return parts
    if "pair" in spec.reset_shapes and isinstance(answer, list) and len(answer) == 2:
        return ResetParts(answer[0])
    if "text" in spec.reset_shapes and isinstance(answer, str):
        return ResetParts(answer)
    shapes = {"object": "an object with an observation", "pair": "[observation, null]", "text": "a string"}
    raise MalformedAnswer(
        f"expected {' or '.join(shapes[s] for s in spec.reset_shapes)}, got {snippet(json.dumps(answer))}"
    )


@dataclass
class StepParts:
    """What a ``/step`` answer says, with the score and won derived as ``spec`` gives."""

    observation: str
    reward: float
    done: bool
    score: float
    won: bool
    info: dict[str, Any]
    actions: list[str] | None


def read_step(spec: ServerSpec, answer: Any, score_before: float) -> StepParts:
    """The parts of a ``/step`` answer; ``score_before`` is the episode's score so far.

    KeyError, TypeError or ValueError for a malformed answer (a key missing, a reward that is not a
    finite number, a ``done`` that is not a boolean).
    """
    if not isinstance(answer, dict):
        raise TypeError(f"expected an object, got {type(answer).__name__}")
    observation = answer[_present(answer, spec.observation_keys)]
    done = [flag(answer, key) for key in spec.done_keys]  # each is checked, not only the first true one
    if "won" in answer and "score" in answer:  # omrl servers say it themselves
        reward, score, won = number(answer, "reward"), number(answer, "score"), flag(answer, "won")
    else:
        if spec.score_field:
            score = clip(number(answer, spec.score_field) / spec.score_scale)
            reward = score - score_before
        else:
            reward = number(answer, "reward")
            score = clip(score_before + reward)
        won = any(done) and score >= spec.win_score
    info = dict(answer["info"]) if isinstance(answer.get("info"), dict) else {}
    text = as_text(observation)
    if spec.refused and "invalid" not in info:  # an omrl server says it itself, in info
        info["invalid"] = text.lstrip().startswith(spec.refused)
    return StepParts(text, reward, any(done), score, won, info, _action_list(answer.get("available_actions")))


def observed(answer: Any) -> str:
    """The observation in an answer of a server's ``observation_route`` (BabyAI's is an object)."""
    if isinstance(answer, dict) and "observation" in answer:
        answer = answer["observation"]
    return as_text(answer)


def same_env(spec: ServerSpec, observed: str, last: str, first: str) -> bool:
    """Whether ``observed`` (what ``spec``'s observation route answered about an env id) is what the
    client left there: ``last``, the last observation the server answered it about the env, or for
    BabyAI the episode's goal line (the first of ``first``, the reset's observation) before ``last``.
    Anything else means a create, reset or step of another client reached the env since."""
    if observed == last:
        return True
    goal_line = first.split("\n", 1)[0]
    return spec.observation_goal_line and observed == f"{goal_line}\n{last}"


def number(answer: dict[str, Any], key: str) -> float:
    """``answer[key]`` as a float; NaN, infinities, strings and booleans are malformed."""
    value = answer[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a finite number, got {_short(value)}")
    return float(value)


def flag(answer: dict[str, Any], key: str) -> bool:
    """``answer[key]``, which must be a JSON boolean (``bool("no")`` would be True)."""
    value = answer[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key!r} must be true or false, got {_short(value)}")
    return value


def clip(value: float) -> float:
    return min(1.0, max(0.0, value))


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _present(answer: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` in ``answer`` (KeyError naming the first when none is)."""
    return next((k for k in keys if k in answer), keys[0])


def _action_list(value: Any) -> list[str] | None:
    """The admissible actions of an answer; None where it lists none (unknown: an omrl server answers
    [] for an env that does not know them, and no actions at all would help no policy)."""
    return [str(a) for a in value] if isinstance(value, list) and value else None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
