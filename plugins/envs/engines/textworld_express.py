"""``textworld-express``: TextWorld-Express (PyPI ``textworld-express``; a Java simulator).

Install with ``pip install 'omrl[textworld-express]'`` (and have ``java`` on PATH). Options
(config block ``plugins.textworld-express``):

- ``game``: cookingworld (default), twc, coin, mapreader, arithmetic, sorting, simonsays or
  peckingorder.
- ``game_params``: the engine's generation properties, e.g. ``numLocations=5,includeDoors=1``
  (the engine rejects unknown ones and lists the known ones).
- ``max_turns`` (default 100, the engine's own default step limit; a few cookingworld gold
  paths are longer).

Task ids are the engine's seeds: ``train`` 0-999, ``dev`` 10000-10999, ``test`` 20000-20999
(asked from the engine per game). Observations are the engine's; the instruction is the task
description. ``admissible_actions`` are the engine's valid actions; text it does not parse is
``invalid``. The expert plays the engine's gold path while play has followed it.

Score: the engine's normalized score (clipped to [0, 1]); the step reward is its change, so
rewards sum to the score; ``won`` when the engine reports task success.

One simulator (a JVM subprocess) per instance, started on first use and reused; ``close()``
shuts it down. The env is ``io_bound``: instances step concurrently.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from omrl.envs import Env, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import GoldPath, JavaSimulatorMixin, check_running, clean_action, clip01, require

SPLITS = ("train", "dev", "test")
UNKNOWN_ACTION = "Unknown action"
ENGINE_STEP_LIMIT = 1_000_000  # our max_turns ends episodes, not the engine's limit

_seed_cache: dict[tuple[str, str], dict[str, list[int]]] = {}  # (game, params) -> split -> seeds
_seed_lock = threading.Lock()


class TextWorldExpressEnv(JavaSimulatorMixin, Env):
    """TextWorld-Express games: cooking, coins, maps... (pip install 'omrl[textworld-express]')."""

    package = "textworld-express"
    extra = "textworld-express"
    action_help = (
        "One command per turn, e.g. look around, move north, open door to east, take <item>, "
        "put <item> in <container>, read <item>, inventory."
    )
    io_bound = True
    splits = SPLITS
    max_turns = 100

    def __init__(self, game: str = "cookingworld", game_params: str = "", max_turns: int = 100):
        self._package = require("textworld_express", "textworld-express", "textworld-express")
        games = require("textworld_express.constants", "textworld-express", "textworld-express").GAME_NAMES
        if game not in games:
            raise ConfigError(f"textworld-express option game: unknown game {game!r}; valid: {', '.join(games)}")
        self.game = game
        self.game_params = game_params
        self.max_turns = int(max_turns)  # type: ignore[misc]  # per instance: an option
        self._engine: Any = None
        self._gold = GoldPath([])
        self._valid: list[str] = []
        self._score = 0.0
        self._turn = 0
        self._running = False

    def _simulator(self) -> Any:
        if self._engine is None:
            self._engine = self._start_simulator(self._package.TextWorldExpressEnv, envStepLimit=ENGINE_STEP_LIMIT)
            try:
                self._engine.load(self.game, self.game_params)
            except ValueError as exc:  # the engine's message lists the known properties
                self.close()
                raise ConfigError(f"textworld-express option game_params={self.game_params!r}: {exc}") from exc
        return self._engine

    def _seeds(self) -> dict[str, list[int]]:
        key = (self.game, self.game_params)
        with _seed_lock:
            if key not in _seed_cache:
                with self._guard():
                    engine = self._simulator()
                    _seed_cache[key] = {
                        "train": list(engine.getValidSeedsTrain()),
                        "dev": list(engine.getValidSeedsDev()),
                        "test": list(engine.getValidSeedsTest()),
                    }
        return _seed_cache[key]

    def task_ids(self, split: str) -> Sequence[int]:
        if split not in SPLITS:
            raise UnknownTaskError(f"textworld-express has no split {split!r}; valid: {', '.join(SPLITS)}")
        return self._seeds()[split]

    def reset(self, task_id: int) -> Observation:
        seeds = self._seeds()
        fold = next((split for split in SPLITS if task_id in seeds[split]), None)
        if fold is None:
            valid = ", ".join(f"{s} {seeds[s][0]}..{seeds[s][-1]}" for s in SPLITS if seeds[s])
            raise UnknownTaskError(f"textworld-express {self.game}: unknown task id {task_id!r}; valid: {valid}")
        with self._guard():
            engine = self._simulator()
            text, info = engine.reset(
                seed=task_id, gameFold=fold, gameName=self.game, gameParams=self.game_params, generateGoldPath=True
            )
            self._gold = GoldPath(list(engine.getGoldActionSequence()))
        self._valid = list(info["validActions"])
        self._score = 0.0
        self._turn = 0
        self._running = True
        return Observation(text, info["taskDescription"], {"won": False, "score": 0.0, "game": self.game})

    def step(self, action: str) -> StepResult:
        check_running("textworld-express", self._running)
        command = clean_action(action)
        with self._guard():
            text, _, done, engine_info = self._engine.step(command)
        self._turn += 1
        self._gold.advance(command)
        self._valid = list(engine_info.get("validActions", self._valid))
        score = clip01(engine_info["score"])
        reward, self._score = score - self._score, score
        won = bool(engine_info["tasksuccess"])
        self._running = not done and not won and self._turn < self.max_turns
        info = {"won": won, "score": score, "invalid": text.startswith(UNKNOWN_ACTION)}
        return StepResult(text, reward, not self._running, info)

    def admissible_actions(self) -> list[str] | None:
        return list(self._valid) if self._running else None

    def expert_action(self) -> str | None:
        """The next gold action while play has followed the gold path; None once it left it."""
        return self._gold.next_action() if self._running else None
