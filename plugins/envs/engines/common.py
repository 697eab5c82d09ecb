"""What the engine envs share: the optional-extra import, action clean-up, episode bookkeeping."""

from __future__ import annotations

import contextlib
import importlib
import math
import random
from types import ModuleType
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from omrl.envs import EnvError, EpisodeFinishedError, UnknownTaskError
from omrl.errors import OmrlError


class MissingExtraError(OmrlError):
    """An engine env was used without its optional dependency installed."""


def require(module: str, env_name: str, extra: str) -> ModuleType:
    """Import ``module`` or raise MissingExtraError telling how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"the {env_name} env needs the {extra} engine, which is not installed "
            f"({type(exc).__name__}: {exc}); install it with: pip install 'omrl[{extra}]'"
        ) from exc


def clean_action(action: str) -> str:
    """Lower-case with single spaces: engines' parsers are stricter than models' replies."""
    return " ".join(action.split()).lower()


def clip01(value: float) -> float:
    """``value`` clipped to [0, 1]; NaN stays NaN, so the rollout ends the episode as env_error
    (a NaN clipped to 0 would read as an ordinary failure)."""
    value = float(value)
    return value if math.isnan(value) else min(1.0, max(0.0, value))


def check_running(env_name: str, running: bool) -> None:
    """Raise EpisodeFinishedError unless an episode is in progress."""
    if not running:
        raise EpisodeFinishedError(f"{env_name}: no episode in progress; call reset(task_id) to start one")


@contextlib.contextmanager
def simulator_guard(env_name: str, extra: str, on_failure: Callable[[], None]) -> Iterator[None]:
    """Turn a failure of a Java simulator (py4j errors: it died, it broke) into EnvError.

    ``on_failure`` drops the broken simulator so that the next reset starts a new one.
    """
    py4j_error = require("py4j.protocol", env_name, extra).Py4JError
    try:
        yield
    except py4j_error as exc:
        on_failure()
        raise EnvError(
            f"{env_name}: the Java simulator failed ({type(exc).__name__}: {exc}); the next reset starts a new one"
        ) from exc


def close_simulator(engine: Any, quietly: bool) -> None:
    """Shut a Java simulator down; ``quietly`` when it already broke (free what is left of it)."""
    if engine is None:
        return
    if quietly:
        with contextlib.suppress(Exception):
            engine.close()
    else:
        engine.close()


class JavaSimulatorMixin:
    """Start, ``close`` and the failure guard of an env that runs one Java simulator in ``self._engine``.

    Messages name the env by its ``package``; a failed or closed simulator also ends the episode.
    """

    package: str
    extra: str
    #: the Java the simulator needs on PATH, as its start-up error names it
    java_needed = "Java"
    _engine: Any
    _running: bool

    def _start_simulator(self, start: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``start(*args, **kwargs)``, the simulator; EnvError when Java is missing or fails to start."""
        try:
            return start(*args, **kwargs)
        except OSError as exc:  # no java on PATH, or it failed to start
            raise EnvError(
                f"{self.package} could not start its Java simulator ({exc}); it needs {self.java_needed} on PATH"
            ) from exc

    def close(self) -> None:
        self._discard_simulator(quietly=False)

    def _discard_simulator(self, quietly: bool = True) -> None:
        engine, self._engine = self._engine, None
        self._running = False
        close_simulator(engine, quietly)

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return simulator_guard(self.package, self.extra, self._discard_simulator)


def split_ids(env_name: str, split: str, splits: Mapping[str, Sequence[int]]) -> Sequence[int]:
    """``splits[split]``, or UnknownTaskError naming the valid splits."""
    if split not in splits:
        raise UnknownTaskError(f"{env_name} has no split {split!r}; valid: {', '.join(splits)}")
    return splits[split]


def check_task_in_splits(env_name: str, task_id: int, splits: dict[str, range]) -> None:
    """Raise UnknownTaskError, naming every split's range, unless some split holds ``task_id``."""
    if not any(task_id in ids for ids in splits.values()):
        valid = ", ".join(f"{name} {ids.start}..{ids.stop - 1}" for name, ids in splits.items())
        raise UnknownTaskError(f"{env_name}: unknown task id {task_id!r}; valid: {valid}")


class RangeSplits:
    """``task_ids`` of an env whose splits are a fixed table of task-id ranges, and the check of a task id.

    A class sets the table, ``split_ranges``, and the env's name in these errors, ``splits_name``.
    """

    split_ranges: ClassVar[dict[str, range]]
    splits_name: ClassVar[str]

    def task_ids(self, split: str) -> Sequence[int]:
        return split_ids(self.splits_name, split, self.split_ranges)

    def check_task_id(self, task_id: int) -> None:
        """Raise UnknownTaskError, naming every split's range, unless some split holds ``task_id``."""
        check_task_in_splits(self.splits_name, task_id, self.split_ranges)


class PrivateRandom:
    """A ``random``-module state of its own for engines that use (and reseed) the global one.

    Inside ``active()`` the global state is this object's; afterwards the caller's is back.
    """

    def __init__(self) -> None:
        self._state: object | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        outer = random.getstate()
        if self._state is not None:
            random.setstate(self._state)
        try:
            yield
        finally:
            self._state = random.getstate()
            random.setstate(outer)


class GoldPath:
    """An engine's gold action sequence, offered as the expert while play follows it.

    Once an action leaves the path, the rest of it no longer applies: ``next_action`` is None.
    """

    def __init__(self, actions: list[str]):
        self.actions = [clean_action(a) for a in actions]
        self._next = 0

    def advance(self, command: str) -> None:
        """Record the (cleaned) command just played."""
        on_path = 0 <= self._next < len(self.actions) and command == self.actions[self._next]
        self._next = self._next + 1 if on_path else -1

    def next_action(self) -> str | None:
        return self.actions[self._next] if 0 <= self._next < len(self.actions) else None
