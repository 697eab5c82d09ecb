"""What an env's answers look like once the server checked them: a reset's :class:`Opening` (with the
goal inside its first observation, :func:`with_goal`) and a step's :class:`Step`. An answer that breaks
the env protocol (:func:`omrl.envs.step_problem`, :func:`omrl.envs.reset_problem`) raises ValueError,
which the server answers as the env's crash (a 500)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omrl.envs import Env, clean_text, reset_problem, step_problem


def with_goal(text: str, instruction: str) -> str:
    """The first observation as an agent that reads only observations must see it: the
    instruction, a blank line, then ``text`` (just ``text`` when it holds the instruction already).

    omrl's rollout opens an episode with the same message, so an agent sees one prompt whether it
    plays an env through omrl or through AgentGym's clients, which read the observation alone.
    """
    return text if instruction in text else f"{instruction}\n\n{text}"


@dataclass
class Opening:
    """What a reset showed: the env's own observation and instruction, and ``shown``, the
    observation with the goal inside it (see :func:`with_goal`)."""

    task_id: int
    text: str
    instruction: str
    shown: str
    info: dict[str, Any]
    actions: list[str]


@dataclass
class Step:
    """What a step returned, checked: finite numbers, text, JSON-safe info."""

    observation: str
    reward: float
    score: float
    done: bool
    won: bool
    info: dict[str, Any]
    actions: list[str]  # admissible now; [] when unknown or the episode is over


def opening_of(env: Env, task_id: int) -> Opening:
    """Reset ``env`` to ``task_id`` and check what it returned (a bad return raises ValueError)."""
    first = env.reset(task_id)
    problem = reset_problem(first)
    if problem:
        raise ValueError(f"env {type(env).__name__} {problem}")
    text, instruction = clean_text(first.text), clean_text(first.instruction)
    return Opening(task_id, text, instruction, with_goal(text, instruction), jsonable(first.info), actions_of(env))


def checked_step(env: Env, action: str) -> Step:
    """Play ``action`` on ``env`` and check what it returned (an answer that breaks the protocol raises
    ValueError, as a crash of the env)."""
    result = env.step(action)
    problem = step_problem(result)
    if problem:
        raise ValueError(f"env {type(env).__name__} {problem}")
    done = bool(result.done)
    return Step(
        clean_text(result.observation),
        float(result.reward),
        result.score,
        done,
        result.won,
        jsonable(result.info),
        [] if done else actions_of(env),
    )


def actions_of(env: Env) -> list[str]:
    return [str(a) for a in env.admissible_actions() or ()]


def jsonable(value: Any) -> Any:
    """Env info as JSON (anything JSON cannot hold becomes its string, NaN and infinities too)."""
    return json.loads(json.dumps(value, default=str), parse_constant=str)
