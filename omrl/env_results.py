"""What an env answers, reset's :class:`Observation` and step's :class:`StepResult`, and the checks that an
answer keeps the env protocol (:mod:`omrl.envs`), a seated env's seat contract included.

The rollout checks every answer before it uses one: a check returns what is wrong ("returned reward nan;
it must be a finite number"), or None, so the caller can fail the episode naming the env. Import these
names from :mod:`omrl.envs`, the plugin contract, which offers them all.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from omrl.errors import ConfigError, short_repr

if TYPE_CHECKING:
    from omrl.envs import Env

#: what an episode shows (to the model, and to a person playing) where the env returned no text
EMPTY_OBSERVATION = "(the environment returned no text)"


@dataclass
class Observation:
    """What ``reset`` returns: the first observation and the task's instruction.

    A seated env (:attr:`Env.seats`) also says which seat moves first (``seat``) and each seat's
    opening text, its own view of the game (``views``: seat -> text; its role, its cards); ``text`` is
    then the first mover's view and ``instruction`` what every seat is told alike ("" when nothing is).
    """

    text: str
    instruction: str
    info: dict[str, Any] = field(default_factory=dict)
    seat: str = ""
    views: dict[str, str] = field(default_factory=dict)


@dataclass
class StepResult:
    """What ``step`` returns. ``info`` carries ``won`` and ``score``: the last step (``done``) must, or the
    episode ends as env_error (:func:`step_problem`); a step before it that leaves them out reads as not won,
    score 0.

    A seated env (:attr:`Env.seats`) also says which seat moves next (``seat``; "" once done), what each
    seat sees of this step in its own view (``views``: seat -> text; a seat left out saw nothing) and, on
    the last step, every seat's reward in [-1, 1] (``seat_rewards``: +1 win, -1 loss, 0 draw). ``reward``
    is then the mover's step reward (usually 0) and ``observation`` the next mover's view.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    seat: str = ""
    views: dict[str, str] = field(default_factory=dict)
    seat_rewards: dict[str, float] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))

    @property
    def score(self) -> float:
        return float(self.info.get("score", 0.0))


def step_problem(result: Any, *, seated: bool = False) -> str | None:
    """What is wrong with a value ``step`` returned ("returned reward nan; ..."), or None when nothing is.

    The protocol promises text for the observation, finite numbers for the
    reward and ``info["score"]`` (in [0, 1]) and bools for ``done`` and
    ``info["won"]``: a NaN reward would poison every advantage of its batch,
    a score of 37 would be trained as a reward of 37, and a ``won`` of "yes"
    would count as a win. The last step of a one-agent episode (``done``) must carry both ``won`` and
    ``score``: without them a finished episode would count as a silent loss. A ``seated`` env's game
    ends with its ``seat_rewards`` instead (:func:`seat_step_problem`).
    """
    if not isinstance(result, StepResult):
        return f"returned a {type(result).__name__}, not a StepResult"
    if not isinstance(result.observation, (str, type(None))):
        return f"returned observation {short_repr(result.observation)}; it must be text"
    if not isinstance(result.info, dict):
        return f"returned info {short_repr(result.info)}; it must be a dict"
    for name, value in (("reward", result.reward), ("score", result.info.get("score", 0.0))):
        if not finite_number(value):
            return f"returned {name} {short_repr(value)}; it must be a finite number"
    score = result.info.get("score", 0.0)
    if not 0.0 <= score <= 1.0:
        return f"returned score {short_repr(score)}; it must be in [0, 1] (a reward of any size goes in reward)"
    for name, flag in (("won", result.info.get("won", False)), ("done", result.done)):
        if not isinstance(flag, (bool, np.bool_)):
            return f"returned {name} {short_repr(flag)}; it must be True or False"
    missing = [key for key in ("won", "score") if key not in result.info]
    if result.done and missing and not seated:
        return (
            f"ended the episode (done) without {' or '.join(missing)} in its info; the last step's info must "
            "carry won (True or False) and score (a number in [0, 1])"
        )
    return None


_SEAT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def check_seats(env_class: type[Env], name: str = "") -> tuple[str, ...]:
    """The seats ``env_class`` declares (``()``: one agent), or ConfigError saying what a declaration must be."""
    seats = getattr(env_class, "seats", ())
    what = f"env {name or env_class.__name__!r}"
    if seats == ():
        return ()
    valid = (
        "a tuple of two or more distinct names (a letter, then letters, digits, _ or -), e.g. ('player_0', 'player_1')"
    )
    if not isinstance(seats, tuple) or len(seats) < 2:
        raise ConfigError(f"{what} declares seats {short_repr(seats)}; seats must be {valid}")
    bad = [seat for seat in seats if not isinstance(seat, str) or not _SEAT_NAME.fullmatch(seat)]
    if bad or len(set(seats)) != len(seats):
        why = f"bad names {short_repr(bad)}" if bad else "a name twice"
        raise ConfigError(f"{what} declares seats {short_repr(seats)} ({why}); seats must be {valid}")
    return seats


def seat_reset_problem(first: Any, seats: Sequence[str]) -> str | None:
    """What is wrong with a seated env's reset answer (on top of :func:`reset_problem`), or None."""
    problem = reset_problem(first)
    if problem:
        return problem
    return _seat_problem(first.seat, first.views, seats, "seat")


def seat_step_problem(result: Any, seats: Sequence[str]) -> str | None:
    """What is wrong with a seated env's step answer (on top of :func:`step_problem`), or None: the next
    seat must be one of ``seats`` until the game is done, and the last step gives every seat a reward."""
    problem = step_problem(result, seated=True)
    if problem:
        return problem
    if result.done:
        missing = [seat for seat in seats if seat not in result.seat_rewards]
        unknown = sorted(set(result.seat_rewards) - set(seats))
        if missing or unknown:
            return (
                f"ended the game with seat_rewards {short_repr(result.seat_rewards)}; it must give every seat a "
                f"reward, and only those: {', '.join(seats)}"
            )
        for seat, value in result.seat_rewards.items():
            if not finite_number(value) or not -1.0 <= value <= 1.0:
                return f"returned seat_rewards[{seat!r}] {short_repr(value)}; it must be a number in [-1, 1]"
        return _seat_problem(None, result.views, seats, "seat")
    return _seat_problem(result.seat, result.views, seats, "seat")


def _seat_problem(seat: str | None, views: Any, seats: Sequence[str], name: str) -> str | None:
    """A wrong next seat (when ``seat`` is not None) or wrong views, named with the valid seats."""
    if seat is not None and seat not in seats:
        return f"returned {name} {short_repr(seat)}; the seat to move must be one of {', '.join(seats)}"
    if not isinstance(views, dict):
        return f"returned views {short_repr(views)}; it must be a dict of seat -> text"
    unknown = sorted(str(key) for key in views if key not in seats)
    if unknown:
        return f"returned views for {', '.join(unknown)}; valid seats: {', '.join(seats)}"
    bad = [key for key, text in views.items() if not isinstance(text, (str, type(None)))]
    if bad:
        return f"returned views[{bad[0]!r}] {short_repr(views[bad[0]])}; it must be text"
    return None


def reset_problem(first: Any) -> str | None:
    """What is wrong with a value ``reset`` returned, or None: an Observation with text."""
    if not isinstance(first, Observation):
        return f"returned a {type(first).__name__}, not an Observation"
    for name in ("text", "instruction"):
        if not isinstance(getattr(first, name), (str, type(None))):
            return f"returned {name} {short_repr(getattr(first, name))}; it must be text"
    if not isinstance(first.info, dict):
        return f"returned info {short_repr(first.info)}; it must be a dict"
    return None


def finite_number(value: Any) -> bool:
    """A real number (Python's or numpy's) that is neither NaN nor infinite."""
    try:
        return isinstance(value, numbers.Real) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False
