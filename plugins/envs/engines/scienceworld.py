"""``scienceworld``: ScienceWorld (PyPI ``scienceworld``; runs a Java 17 simulator).

Install with ``pip install 'omrl[scienceworld]'`` (and have ``java`` 17+ on PATH). Options
(config block ``plugins.scienceworld``):

- ``tasks``: which of the 30 tasks to use, by name (``boil``) or ScienceWorld id (``1-1``);
  default all.
- ``simplifications``: ScienceWorld's simplification string, e.g. ``easy`` or
  ``openDoors,selfWateringFlowerPots``; default none.
- ``max_turns`` (default 100, like ScienceWorld's own step limit; gold paths reach ~90).
- ``expert`` (default true): generate the gold action sequence at reset, which makes resets of
  some tasks ~1 s slower; without it ``expert_action`` returns None.

Task ids encode the task and its variation: ScienceWorld id ``T-N`` with variation ``v`` is
``(100 * T + N) * 10_000 + v`` (``boil`` = ``1-1``: 1_010_000 + v). The splits ``train``,
``dev`` and ``test`` are ScienceWorld's own variation splits, ordered round-robin over tasks
so that the first ids of a split cover every task. Listing a split loads each task once in
the simulator (~0.2 s a task, cached per process).

Score: ScienceWorld's 0-100 score / 100 (negative = failed, clipped to 0); the step reward is
its change, so rewards sum to the score; ``won`` when the task completes with score 100.
Actions the parser does not know are ``invalid``.

One simulator (a JVM subprocess) per instance, started on first use and reused across
resets; ``close()`` shuts it down. The env is ``io_bound``: instances step concurrently.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Sequence

from omrl.envs import Env, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import GoldPath, JavaSimulatorMixin, check_running, clean_action, clip01, require

SPLITS = ("train", "dev", "test")
VARIATION_SLOTS = 10_000  # > the most variations of any task (1,386)
UNKNOWN_ACTION = "No known action matches that input."
# Our turn cap ends episodes; the engine's own move limit (some actions take several moves)
# is set out of the way.
ENGINE_MOVE_LIMIT = 1_000_000

_split_cache: dict[tuple[str, str], list[int]] = {}  # (task name, split) -> variations
_split_lock = threading.Lock()


def encode(code: str, variation: int) -> int:
    """``("1-1", 3)`` -> 1_010_003."""
    topic, number = code.split("-")
    return (100 * int(topic) + int(number)) * VARIATION_SLOTS + variation


def decode(task_id: int) -> tuple[str, int]:
    """1_010_003 -> ``("1-1", 3)``."""
    task, variation = divmod(task_id, VARIATION_SLOTS)
    return f"{task // 100}-{task % 100}", variation


class ScienceWorldEnv(JavaSimulatorMixin, Env):
    """ScienceWorld science tasks (a Java simulator; pip install 'omrl[scienceworld]')."""

    package = "scienceworld"
    extra = "scienceworld"
    action_help = (
        "One command per turn, e.g. look around, open door to kitchen, go to kitchen, "
        "pick up thermometer, look at <object>, move <object> to <container>, "
        "activate <device>, focus on <object>, wait1. Answer a numbered question with its number."
    )
    io_bound = True
    splits = SPLITS
    max_turns = 100
    java_needed = "Java 17 or newer"

    def __init__(
        self, tasks: list[str] | None = None, simplifications: str = "", max_turns: int = 100, expert: bool = True
    ):
        self._package = require("scienceworld", "scienceworld", "scienceworld")
        constants = require("scienceworld.constants", "scienceworld", "scienceworld")
        names = dict(constants.ID2TASK)  # "1-1" -> "boil"
        self._tasks = _select_tasks(names, tasks)
        self.simplifications = simplifications
        self.max_turns = int(max_turns)  # type: ignore[misc]  # per instance: an option
        self.expert = bool(expert)
        self._engine: Any = None
        self._gold = GoldPath([])
        self._score = 0.0
        self._turn = 0
        self._running = False

    # -- the simulator ---------------------------------------------------------------------
    def _simulator(self) -> Any:
        if self._engine is None:
            self._engine = self._start_simulator(self._package.ScienceWorldEnv, "", envStepLimit=ENGINE_MOVE_LIMIT)
        return self._engine

    # -- tasks -----------------------------------------------------------------------------
    def variations(self, code: str, split: str) -> list[int]:
        """ScienceWorld's variations of task ``code`` in ``split`` (loaded once per process)."""
        name = self._tasks[code]
        with _split_lock:
            if (name, split) not in _split_cache:
                with self._guard():
                    engine = self._simulator()
                    engine.load(name, 0, "")
                    found = {
                        "train": engine.get_variations_train(),
                        "dev": engine.get_variations_dev(),
                        "test": engine.get_variations_test(),
                    }
                for key, values in found.items():
                    _split_cache[(name, key)] = [int(v) for v in values]
        return _split_cache[(name, split)]

    def task_ids(self, split: str) -> Sequence[int]:
        if split not in SPLITS:
            raise UnknownTaskError(f"scienceworld has no split {split!r}; valid: {', '.join(SPLITS)}")
        per_task = [[encode(code, v) for v in self.variations(code, split)] for code in self._tasks]
        # round-robin: the first ids of a split cover every task
        return [i for group in itertools.zip_longest(*per_task) for i in group if i is not None]

    def _check_task(self, task_id: int) -> tuple[str, int]:
        code, variation = decode(task_id) if isinstance(task_id, int) else ("", -1)
        if code in self._tasks and any(variation in self.variations(code, s) for s in SPLITS):
            return code, variation
        raise UnknownTaskError(
            f"scienceworld: unknown task id {task_id!r}; ids are (100*T + N) * {VARIATION_SLOTS} + variation "
            f"for the tasks {', '.join(self._tasks)} (e.g. {encode(next(iter(self._tasks)), 0)}); "
            f"see task_ids('train'|'dev'|'test')"
        )

    # -- episodes --------------------------------------------------------------------------
    def reset(self, task_id: int) -> Observation:
        code, variation = self._check_task(task_id)
        with self._guard():
            engine = self._simulator()
            try:
                engine.load(self._tasks[code], variation, self.simplifications, generateGoldPath=self.expert)
            except ValueError as exc:  # the engine's message lists the valid simplifications
                raise ConfigError(f"scienceworld option simplifications={self.simplifications!r}: {exc}") from exc
            text, _ = engine.reset()
            self._gold = GoldPath(engine.get_gold_action_sequence() if self.expert else [])
            instruction = engine.get_task_description()
        self._score = 0.0
        self._turn = 0
        self._running = True
        info = {"won": False, "score": 0.0, "task": self._tasks[code], "variation": variation}
        return Observation(text, instruction, info)

    def step(self, action: str) -> StepResult:
        check_running("scienceworld", self._running)
        command = clean_action(action)
        # ScienceWorldEnv.step() also gathers the room, the inventory and every valid action
        # (10-15x the cost of the step itself); ask the simulator for only what we use.
        with self._guard():
            simulator = self._engine.server
            text = simulator.step(command)
            raw_score = int(round(100 * simulator.getScore()))  # 0-100; negative when the task failed
            completed = bool(simulator.getCompleted()) or raw_score < 0
        self._turn += 1
        self._gold.advance(command)
        score = clip01(raw_score / 100)
        reward, self._score = score - self._score, score
        won = bool(completed) and raw_score >= 100
        self._running = not completed and self._turn < self.max_turns
        info = {"won": won, "score": score, "invalid": text.strip() == UNKNOWN_ACTION}
        return StepResult(text, reward, not self._running, info)

    def admissible_actions(self) -> list[str] | None:
        if not self._running:
            return None
        with self._guard():
            return list(self._engine.get_valid_action_object_combinations())

    def expert_action(self) -> str | None:
        """The next gold action while play has followed the gold path; None once it left it."""
        return self._gold.next_action() if self._running else None


def _select_tasks(names: dict[str, str], wanted: list[str] | None) -> dict[str, str]:
    """The ``tasks`` option as {ScienceWorld id: name}, in ScienceWorld's order."""
    if wanted is None:
        return names
    if isinstance(wanted, str):
        wanted = [wanted]
    codes = {name: code for code, name in names.items()}
    chosen = []
    for entry in wanted:
        code = entry if entry in names else codes.get(entry)
        if code is None:
            raise ConfigError(
                f"scienceworld option tasks: unknown task {entry!r}; valid: "
                f"{', '.join(f'{c} ({n})' for c, n in names.items())}"
            )
        chosen.append(code)
    if not chosen:
        raise ConfigError("scienceworld option tasks is empty; name at least one task, or leave it out for all 30")
    return {code: names[code] for code in names if code in chosen}
