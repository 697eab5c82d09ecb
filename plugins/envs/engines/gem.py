"""``gem:<gem env id>``: GEM's environments (PyPI ``gem-llm``), played in-process and offline.

Install with ``pip install 'omrl[gem]'``. Every GEM env that runs offline has its own name, GEM's
id behind ``gem:`` (no options); the names are listed below so that registering them imports
nothing, and tests/envs/test_gem.py checks them against GEM's registry:

- 26 games, multi-turn: ``gem:game:GuessTheNumber-v0-easy``, Mastermind, Minesweeper, FifteenPuzzle,
  Sudoku, TowerofHanoi, Game2048, Sokoban and Crosswords in GEM's easy/hard/random variants
  (Crosswords reads its words with pandas, which gem-llm does not install).
- 103 reasoning_gym tasks, one turn: ``gem:rg:chain_sum``... (GEM's wrapper: the answer goes in
  ``\\boxed{}`` and the dataset scores it; the ``reasoning-gym:<dataset>`` envs play the same
  datasets unwrapped, with an item index per task).

Left out (``LEFT_OUT``): GEM's math, QA, logic, code and eval envs (they load their problems from
the Hugging Face hub with ``datasets``, and code envs run the answers in a sandbox), the word
games (Wordle, Hangman, WordSearch download NLTK's ``words`` corpus), two random variants that
fail in gem-llm 0.1.0, and ``rg:composite`` (it needs other datasets' configs).

Tasks: a task id is the seed GEM's ``reset`` takes: ``train`` 0..99,999, ``test``
1,000,000..1,000,499. A game's board is a function of its seed, and two seeds can deal the same
one: of the 500 test boards, the first 1,000 train ids held 452 in Game2048-v0-easy and 175 in
Sokoban-v0-easy. In the games of ``REDRAWN_GAMES`` (Game2048, Sokoban-v0-easy) a train task whose
first board is a test board is dealt again, from seed 2,000,000 + n * 100,000 + its id (n = 0, 1,
...), up to 100 times: no train board is a test board, and the test split is unchanged (the test
boards are dealt at the first train reset, once per machine: ``disjoint.py``). Games with too few
boards for splits of their own say so in their description (``SHARED_BOARDS``):
FifteenPuzzle-v0-easy has 24 boards, TowerofHanoi one (three in -random), all in both splits.
GuessTheNumber, Mastermind and Minesweeper hide their board at the start (the same first board
under every seed) and are not dealt again: their secrets repeat across the splits
(GuessTheNumber-v0-easy has 10). FifteenPuzzle-v0-hard and Sudoku shared none of the 500 test
boards with the first 1,000 train ids. GEM draws a reasoning
task's question from a pool of 500 items; ``test`` draws from one (dataset seed 1,000,042), ``train``
from GEM's own (seed 42) but for its items whose question is also in the test pool (different seeds
can give the same question: lcm's two pools shared 22): such an item is drawn again, as the same item of the
pool seeded 2,000,042 + n * 500 (n = 0, 1, ...), up to 20 times (``disjoint.py``), so the splits
share no question unless a dataset has barely more questions than the test pool. Task ids repeat
questions (100,000 train ids, 500 questions). GEM's wrapper draws a new pool after 500 resets; the
adapter then makes it anew, so that an episode stays a function of its task id.

Actions: GEM reads the content of the last ``\\boxed{...}`` in the reply (``\\boxed{25}``,
``\\boxed{A C}``, ``\\boxed{reveal 2 3}``); an action without one is boxed whole, so ``25`` works
too. Reward: GEM's own per step (dense in Mastermind, Minesweeper, Sudoku and 2048, final in the
rest; an unreadable action is -0.1 and ends the game, GEM's rule). ``score``: the sum of the
episode's rewards so far, clipped to [0, 1] (GEM's own measure of progress); ``won`` when it
reaches 1. ``invalid``: an unreadable action, or a move the game refused (a message of GEM's).
An answer a reasoning task's scorer cannot read scores 0 and is invalid; a game that raises is an
EnvError. The reasoning tasks' expert answers with the dataset's ``answer``; games have none.

GEM's games draw from the global ``random`` and numpy generators (and reseed them at every
reset): each instance plays on states of its own, so the caller's stay untouched. Sokoban builds
a room per reset by search: hard rooms took 0.3-7 s here, the random variant's big rooms up to
about a minute (and GEM's constructor builds a first, unseeded room: seconds for hard).
"""

from __future__ import annotations

import itertools
import logging
import re
from fnmatch import fnmatchcase
from typing import Any, Iterator

from omrl.envs import Env, EnvError, Observation, StepResult, env_variant
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.common import (
    MissingExtraError,
    RangeSplits,
    check_running,
    check_task_in_splits,
    require,
)
from omrl_plugins.envs.engines.disjoint import MAX_REDRAWS, clear_of, package_version, shared_boards_note, test_keys
from omrl_plugins.envs.engines.reasoning_gym import DATASETS, EngineRandom, as_number, unit_score, unknown_name

GAMES = (
    "game:GuessTheNumber-v0-easy",
    "game:GuessTheNumber-v0-hard",
    "game:GuessTheNumber-v0-random",
    "game:Mastermind-v0-easy",
    "game:Mastermind-v0-hard",
    "game:Mastermind-v0-random",
    "game:Minesweeper-v0-easy",
    "game:Minesweeper-v0-hard",
    "game:Minesweeper-v0-random",
    "game:FifteenPuzzle-v0-easy",
    "game:FifteenPuzzle-v0-hard",
    "game:Sudoku-v0-easy",
    "game:Sudoku-v0-hard",
    "game:Sudoku-v0-random",
    "game:TowerofHanoi-v0-easy",
    "game:TowerofHanoi-v0-hard",
    "game:TowerofHanoi-v0-random",
    "game:Game2048-v0-easy",
    "game:Game2048-v0-hard",
    "game:Game2048-v0-extreme-hard",
    "game:Game2048-v0-random",
    "game:Sokoban-v0-easy",
    "game:Sokoban-v0-hard",
    "game:Sokoban-v0-random",
    "game:Crosswords-v0-easy",
    "game:Crosswords-v0-hard",
)
TASKS = tuple(f"rg:{name}" for name in DATASETS)  # one turn each
ENV_IDS = GAMES + TASKS
# GEM's other ids, as patterns, with the reason each is left out.
LEFT_OUT = {
    "math:*": "loads its problems from the Hugging Face hub (the `datasets` package, network)",
    "qa:*": "loads its questions from the Hugging Face hub (the `datasets` package, network)",
    "logic:*": "loads its questions from the Hugging Face hub (the `datasets` package, network)",
    "eval:*": "loads its problems from the Hugging Face hub (the `datasets` package, network)",
    "code:*": "loads its problems from the Hugging Face hub and runs the answers in a code sandbox",
    "game:Wordle-*": "downloads NLTK's `words` corpus",
    "game:Hangman-*": "downloads NLTK's `words` corpus",
    "game:WordSearch-*": "downloads NLTK's `words` corpus",
    "game:FifteenPuzzle-v0-random": "fails when built in gem-llm 0.1.0 (TypeError: num_rows is None)",
    "game:Crosswords-v0-random": "fails when built in gem-llm 0.1.0 (no words match hardcore=None)",
    "rg:composite": "it only mixes other datasets and needs their configs; play those by name",
}
SPLITS = {"train": range(0, 100_000), "test": range(1_000_000, 1_000_500)}
BOARD_REDRAW_SEED = 2_000_000  # a train board's n-th redraw: seed this + n * 100,000 + its task id
BOARD_REDRAWS = 100  # resets of the games below take under a millisecond (Sokoban-v0-easy: about 15 ms)
# The games whose first boards repeat across seeds, with how many of the 500 test boards the first
# 1,000 train ids held (gem-llm 0.1.0): a train task whose board is a test board is drawn again.
REDRAWN_GAMES = {
    "game:Game2048-v0-easy": 452,
    "game:Game2048-v0-hard": 452,
    "game:Game2048-v0-extreme-hard": 452,
    "game:Game2048-v0-random": 444,
    "game:Sokoban-v0-easy": 175,
}
# The games with too few boards for splits of their own: every test board is a train board too.
SHARED_BOARDS = {
    "game:FifteenPuzzle-v0-easy": "all its 24 boards",
    "game:TowerofHanoi-v0-easy": "its one board",
    "game:TowerofHanoi-v0-hard": "its one board",
    "game:TowerofHanoi-v0-random": "all its 3 boards",
}
# The reasoning tasks' pools: GEM's own (seed 42, 500 items) for train, a disjoint one for test.
POOL_SIZE = 500
POOL_SEEDS = {"train": 42, "test": 1_000_042}
REDRAW_SEED = 2_000_042  # a train question's n-th redraw: the same item of the pool seeded this + n * 500
# Games are built under a fixed global random state: GEM's constructors play a first, unseeded
# reset, and under this one Sokoban-v0-random draws its small room there (a big one can take a
# minute). Sokoban-v0-hard's first room seeds from the OS and still takes seconds.
BUILD_SEED = 8
# The messages with which GEM's games refuse a readable move (gem-llm 0.1.0): such a move scores
# 0 like an ordinary one, so the message is what tells them apart.
REFUSALS = re.compile(
    r"outside the (?:range|bounds)|out of bounds|already (?:been )?(?:guessed|revealed|filled|tried)|"
    r"which is empty|is larger than the top disk|entries but the code has length|letters but the secret|"
    r"doesn't change the board|violates Sudoku rules|chose an invalid action|cannot move|invalid move|"
    r"black dot and cannot be filled|not valid because words must be"
)


def left_out_reason(env_id: str) -> str | None:
    """Why GEM's ``env_id`` is not played here, or None when it is (or GEM has no such id)."""
    return next((why for pattern, why in LEFT_OUT.items() if fnmatchcase(env_id, pattern)), None)


def import_gem() -> Any:
    """``import gem``, leaving the root logger as it was (GEM's import calls ``logging.basicConfig``
    at INFO level, which would make every library's INFO messages print)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    gem = require("gem", "gem", "gem")
    root.handlers[:] = handlers
    root.setLevel(level)
    return gem


class GemEnv(RangeSplits, Env):
    """GEM's games and reasoning tasks, played in-process (pip install 'omrl[gem]')."""

    split_ranges = SPLITS
    splits_name = "gem"
    package = "gem-llm"
    extra = "gem"
    action_help = (
        "One move per turn, in the format the game's rules give; the \\boxed{} around it may be "
        "left out (25 is read as \\boxed{25})."
    )
    max_turns = 100  # every game ends sooner by its own turn limit
    deterministic = True

    def __init__(self, env_id: str):
        if env_id not in ENV_IDS:
            reason = left_out_reason(env_id)
            raise unknown_name("gem env", env_id, ENV_IDS, {env_id: reason} if reason else {})
        self._gem = import_gem()
        if env_id not in require("gem.envs.registration", f"gem:{env_id}", "gem").ENV_REGISTRY:
            raise ConfigError(
                f"the installed gem-llm has no env {env_id!r}; omrl plays gem-llm 0.1.0's envs: pip install 'omrl[gem]'"
            )
        self.env_id = env_id
        self.one_turn = env_id in TASKS
        constants = require("gem.utils.constants", f"gem:{env_id}", "gem")
        self._format_error = constants.LanguageGameReward.format_error_reward  # GEM's reward for an unreadable move
        self._terminal = constants.TERMINAL_STATE  # what GEM's one-turn envs answer
        self._engines: dict[str, list[Any]] = {}  # pool key -> [GEM env, seeded resets so far], built lazily
        self._engine: Any = None  # the GEM env of the episode in progress
        self._random = EngineRandom()
        self._total = 0.0
        self._running = False

    def reset(self, task_id: int) -> Observation:
        check_task_in_splits(f"gem:{self.env_id}", task_id, SPLITS)
        split = next(name for name, ids in SPLITS.items() if task_id in ids)
        with self._random.active():
            self._engine = self._engine_for(split)
            seed = self._clear_seed(task_id) if split == "train" and self.env_id in REDRAWN_GAMES else task_id
            rules, info = self._engine.reset(seed=seed)
        self._total, self._running = 0.0, True
        board = info.get("suffix") if isinstance(info, dict) else None
        # rules and board passed on as they are: the rollout checks that they are text
        return Observation(board or rules, rules, {"won": False, "score": 0.0, "env_id": self.env_id})

    def step(self, action: str) -> StepResult:
        check_running(f"gem:{self.env_id}", self._running)
        move = action if "\\boxed{" in action else f"\\boxed{{{action.strip()}}}"
        try:
            with self._random.active():
                text, reward, terminated, truncated, info = self._engine.step(move)
        except Exception as exc:  # noqa: BLE001 - GEM failed on this action
            self._running = False
            if self.one_turn:  # the dataset's scorer could not read the answer
                return StepResult(
                    f"The answer could not be scored ({type(exc).__name__}: {exc}); it scores 0.",
                    0.0,
                    True,
                    {"won": False, "score": 0.0, "invalid": True},
                )
            raise EnvError(f"gem:{self.env_id} failed on the move {move!r}: {type(exc).__name__}: {exc}") from exc
        reward = as_number(reward)
        if isinstance(reward, float):
            self._total += reward
        done = bool(terminated or truncated)
        self._running = not done
        won = done and self._total >= 1.0 - 1e-9  # dense rewards add up to 1 in floating point
        invalid = reward == self._format_error or (isinstance(text, str) and bool(REFUSALS.search(text)))
        if isinstance(text, str) and text == self._terminal:  # a marker alone, after a one-turn answer
            text = f"Your answer scored {reward} (1 is correct)."
        board = info.get("suffix") if isinstance(info, dict) else None
        if not done and isinstance(text, str) and isinstance(board, str):
            text = f"{text}\n{board}"  # as GEM's own observation wrapper shows it
        score = 1.0 if won else unit_score(self._total)
        return StepResult(text, reward, done, {"won": won, "score": score, "invalid": invalid})

    def expert_action(self) -> str | None:
        """The dataset's answer for a reasoning task; GEM's games have no expert."""
        if not (self.one_turn and self._running):
            return None
        answer = self._engine.get_state()["data"].get("answer")
        return f"\\boxed{{{answer}}}" if isinstance(answer, str) else None

    def close(self) -> None:
        for engine, _ in self._engines.values():
            close = getattr(engine, "close", None)
            if callable(close):
                close()
        self._engines.clear()

    def _clear_seed(self, task_id: int) -> int:
        """The seed of train task ``task_id``'s board: its own, or when that board is a test board, the
        first of its redraws' that is not (``disjoint.clear_of``)."""
        avoid = test_keys(
            ("gem", self.env_id),
            lambda: (self._first_board(seed) for seed in SPLITS["test"]),
            disk=("gem", package_version("gem-llm"), self.env_id),
        )
        redraws = (BOARD_REDRAW_SEED + n * len(SPLITS["train"]) + task_id for n in range(BOARD_REDRAWS))
        return clear_of(avoid, itertools.chain([task_id], redraws), self._first_board, BOARD_REDRAWS)

    def _first_board(self, seed: int) -> Any:
        """The board the game first shows when reset with ``seed`` (not its rules: GEM's give an example
        move drawn at random)."""
        rules, info = self._engine.reset(seed=seed)
        return (info.get("suffix") if isinstance(info, dict) else None) or rules

    def _engine_for(self, split: str) -> Any:
        """The GEM env that plays ``split``'s tasks (inside ``self._random``): one for every split of
        a game; one per split for a reasoning task, made anew every POOL_SIZE resets, since GEM's
        wrapper draws a new pool then and an episode must stay a function of its task id."""
        key = split if self.one_turn else "games"
        entry = self._engines.get(key)
        if entry is None or (self.one_turn and entry[1] >= POOL_SIZE):
            import random

            import numpy as np

            random.seed(BUILD_SEED)
            np.random.seed(BUILD_SEED)
            options = {"seed": POOL_SEEDS[split], "size": POOL_SIZE} if self.one_turn else {}
            try:
                entry = self._engines[key] = [self._gem.make(self.env_id, **options), 0]
            except ImportError as exc:  # GEM names the module it could not import
                raise MissingExtraError(
                    f"gem:{self.env_id} needs a package gem-llm does not install ({exc}); "
                    "install it, or pip install 'omrl[gem]'"
                ) from exc
            if self.one_turn and split == "train":
                engine = _unwrapped(entry[0])
                engine.ds = ClearPool(engine.ds, engine.name)
        entry[1] += 1
        return entry[0]


def _unwrapped(engine: Any) -> Any:
    """GEM's ReasoningGymEnv inside its wrappers."""
    while not hasattr(engine, "ds") and hasattr(engine, "env"):
        engine = engine.env
    return engine


class ClearPool:
    """GEM's train pool of a reasoning task with no test question: item ``i`` is the pool's own, or
    when that is a test question, item ``i`` of a pool seeded further (``disjoint.clear_of``)."""

    def __init__(self, pool: Any, name: str):
        self._pool, self._name = pool, name
        self._rg = require("reasoning_gym", f"gem:rg:{name}", "gem")
        seed = POOL_SEEDS["test"]
        self._avoid = test_keys(
            ("gem", name),
            lambda: (item["question"] for item in self._rg.create_dataset(name, seed=seed, size=POOL_SIZE)),
            disk=("gem:rg", package_version("reasoning-gym"), name, str(seed), str(POOL_SIZE)),
        )
        self._redraws: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._pool)

    def __getitem__(self, index: int) -> Any:
        return clear_of(self._avoid, (pool[index] for pool in self._pools()), lambda item: item["question"])

    def _pools(self) -> Iterator[Any]:
        yield self._pool
        for redraw in range(MAX_REDRAWS):
            if redraw not in self._redraws:
                seed = REDRAW_SEED + redraw * POOL_SIZE
                self._redraws[redraw] = self._rg.create_dataset(self._name, seed=seed, size=POOL_SIZE)
            yield self._redraws[redraw]


def _variant(env_id: str) -> type[Env]:
    one_turn = env_id in TASKS
    kind = "one question, scored by the dataset" if one_turn else "a game"
    doc = f"GEM's {env_id}: {kind} (pip install 'omrl[gem]')."
    if env_id in SHARED_BOARDS:
        doc += " " + shared_boards_note(SHARED_BOARDS[env_id])
    variant = env_variant(GemEnv, "Gem_" + re.sub(r"\W", "_", env_id), doc, env_id=env_id)
    if one_turn:
        variant.max_turns = 1
        variant.action_help = (
            "One action: your final answer alone, written as the question asks for it "
            "(GEM reads it from \\boxed{}, which is added when you leave it out)."
        )
    return variant


# Built once: the registry asks the hook at every lookup and must get the same classes back.
VARIANTS = {f"gem:{env_id}": _variant(env_id) for env_id in ENV_IDS}


@hookimpl
def register_envs(register):
    for name, env_class in VARIANTS.items():
        register(name, env_class)
