"""``textarena``: TextArena's single-player puzzles (PyPI ``textarena``), played offline.

Install with ``pip install 'omrl[textarena]'``. Options (config block ``plugins.textarena``):

- ``game``: a TextArena env id of a single-player game that runs offline (default
  ``TowerOfHanoi-v0``; variants such as ``Sokoban-v0-medium`` work too). Games: 2048, Bandit,
  Blackjack, Crosswords, FifteenPuzzle, FrozenLake, GuessTheNumber, LightsOut, Mastermind,
  Minesweeper, PegJump, RushHour, Sokoban, Sudoku, ThreeCardMonte, TowerOfHanoi. (Word games
  that download NLTK data, and games that call LLM APIs, do not run offline.)
- ``max_turns`` (default 100; most games end sooner by their own turn limit).

Task ids are the games' seeds: ``train`` 0..99,999, ``test`` 1,000,000..1,000,499. Two seeds can
deal the same board: of the 500 test boards, the first 1,000 train ids held 462 in FrozenLake-v0 and
456 in 2048-v0. In the games of ``REDRAWN`` (2048 and its variants but 3x3, FrozenLake, Sokoban-v0,
RushHour, LightsOut, Blackjack) a train task whose first board is a test board is dealt again, from seed
2,000,000 + n * 100,000 + its id (n = 0, 1, ...), up to 100 times (``disjoint.py``): no train board is
a test board, and the test split is unchanged. The first train reset deals the 500 test boards to
know them (under a second; Sokoban-v0 about a minute, RushHour about three), once per machine
(``$OMRL_HOME/split-keys``).
Games with too few boards for splits of their own say so in their description (``SHARED_BOARDS``):
TowerOfHanoi and PegJump (one puzzle under every id) and 2048-v0-3x3 (the 500 test tasks hold 102
boards, almost all there are). Games that hide their board at the start (GuessTheNumber, Mastermind,
Minesweeper, Bandit: the first observation is the same under every seed) are not dealt again:
their secrets repeat across the splits (GuessTheNumber has 20), unseen by the model. The rest
(Crosswords, FifteenPuzzle, Sudoku, ThreeCardMonte) shared none of the 500 test boards with the
first 1,000 train ids (Sokoban-v0-medium and Sudoku-v0-hard, seconds a reset: none in samples).

Moves use each game's own syntax, usually in square brackets (``[A C]``, ``[up]``); the rules
are in the instruction. A move the game refuses is ``invalid``; as in TextArena, a second
invalid move in a row ends the game. Reward: the game's final reward, clipped to [0, 1], on
the last step (it is also ``score``); ``won`` when that reward is 1.

Experts: TowerOfHanoi (optimal from any position) and FrozenLake (shortest path around the
holes); other games have none. Games run on their own ``random`` state, so an episode
depends on its seed alone and the caller's ``random`` module is untouched.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Callable, NamedTuple

from omrl.envs import Env, Observation, StepResult
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import PrivateRandom, RangeSplits, check_running, clip01, require
from omrl_plugins.envs.engines.disjoint import clear_of, package_version, test_keys

# Each offline game's TextArena variants ("" is ``<Game>-v0`` itself), listed here so that registering
# ``textarena:<id>`` names imports nothing; tests/envs/test_engines.py checks them against TextArena.
GAME_VARIANTS: dict[str, tuple[str, ...]] = {
    "2048": (
        "",
        "10x10",
        "3x3",
        "5x5",
        "6x6",
        "8x8",
        "easy",
        "extreme",
        "hard",
        "mega-easy",
        "super-easy",
        "ultra-easy",
        "very-easy",
        "very-hard",
    ),
    "Bandit": ("", "hard"),
    "Blackjack": ("", "long"),
    "Crosswords": ("", "hardcore"),
    "FifteenPuzzle": ("",),
    "FrozenLake": ("", "hardcore", "random"),
    "GuessTheNumber": ("", "hardcore"),
    "LightsOut": ("",),
    "Mastermind": ("", "extreme", "hard"),
    "Minesweeper": ("", "hard", "medium", "small"),
    "PegJump": ("",),
    "RushHour": ("",),
    "Sokoban": ("", "medium"),
    "Sudoku": ("", "easy", "hard", "medium", "very-easy"),
    "ThreeCardMonte": ("",),
    "TowerOfHanoi": ("", "extreme", "hard", "hardcore", "medium"),
}
OFFLINE_GAMES = (
    "2048",
    "Bandit",
    "Blackjack",
    "Crosswords",
    "FifteenPuzzle",
    "FrozenLake",
    "GuessTheNumber",
    "LightsOut",
    "Mastermind",
    "Minesweeper",
    "PegJump",
    "RushHour",
    "Sokoban",
    "Sudoku",
    "ThreeCardMonte",
    "TowerOfHanoi",
)
WRAPPER_SUFFIXES = ("-raw", "-train")  # TextArena's ids for the same game with other wrappers
SPLITS = {"train": range(0, 100_000), "test": range(1_000_000, 1_000_500)}
REDRAW_SEED = 2_000_000  # a train board's n-th redraw: seed this + n * 100,000 + its task id
BOARD_REDRAWS = 100  # resets of the games below take under a millisecond (Sokoban-v0 0.1 s, RushHour 0.4 s)
# The games whose first boards repeat across seeds, with how many of the 500 test boards the first
# 1,000 train ids held (TextArena 0.7.4): a train task whose board is a test board is drawn again.
REDRAWN = {
    # 2048-v0's variants but the sizes deal its boards (the target tile differs)
    **{f"2048-v0{v}": 456 for v in ("", "-easy", "-extreme", "-hard", "-mega-easy", "-super-easy")},
    **{f"2048-v0{v}": 456 for v in ("-ultra-easy", "-very-easy", "-very-hard")},
    "2048-v0-5x5": 403,
    "2048-v0-6x6": 303,
    "2048-v0-8x8": 130,
    "2048-v0-10x10": 65,
    "Blackjack-v0": 3,
    "Blackjack-v0-long": 3,
    "FrozenLake-v0": 462,
    "FrozenLake-v0-hardcore": 8,
    "FrozenLake-v0-random": 265,
    "LightsOut-v0": 2,
    "Sokoban-v0": 248,  # in the first 514 train ids (0.1 s a reset)
    "RushHour-v0": 3,  # of the first 167 test boards, in the first 241 train ids (0.4 s a reset)
}
# The games with too few boards for splits of their own: what train and test share.
SHARED_BOARDS = {
    **{f"TowerOfHanoi-v0{v}": "its one board" for v in ("", "-extreme", "-hard", "-hardcore", "-medium")},
    "PegJump-v0": "its one board",
    "2048-v0-3x3": "most of its boards (the first 1,000 train ids hold 487 of the 500 test boards; 102 distinct)",
}


def game_ids() -> list[str]:
    """Every TextArena env id omrl plays offline: ``2048-v0``, ``2048-v0-3x3``, ..."""
    return [
        f"{game}-v0" + (f"-{variant}" if variant else "") for game in OFFLINE_GAMES for variant in GAME_VARIANTS[game]
    ]


def base_game(env_id: str) -> str:
    """``Sokoban-v0-medium`` -> ``Sokoban``."""
    return env_id.split("-v", 1)[0]


def hanoi_move(towers: dict[str, list[int]]) -> str | None:
    """The first move of the optimal way to stack every disk on C, from any legal position."""

    def first_move(disk: int, target: str) -> tuple[str, str] | None:
        if disk == 0:
            return None
        source = next(peg for peg, disks in towers.items() if disk in disks)
        if source == target:
            return first_move(disk - 1, target)
        spare = ({"A", "B", "C"} - {source, target}).pop()
        # the smaller disks go to the spare peg first; once there, `disk` moves
        return first_move(disk - 1, spare) or (source, target)

    move = first_move(sum(len(disks) for disks in towers.values()), "C")
    return f"[{move[0]} {move[1]}]" if move else None


def frozen_lake_move(game_state: dict[str, Any]) -> str | None:
    """The first move of a shortest path to the goal that avoids the holes (BFS)."""
    grid, start, goal = game_state["grid"], tuple(game_state["player_pos"]), tuple(game_state["goal_pos"])
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        if (row, col) == goal:
            return f"[{first[(row, col)]}]"
        for name, (dr, dc) in moves.items():
            cell = (row + dr, col + dc)
            if (
                0 <= cell[0] < len(grid)
                and 0 <= cell[1] < len(grid[0])
                and cell not in first
                and grid[cell[0]][cell[1]] != "H"
            ):
                first[cell] = first[(row, col)] or name
                queue.append(cell)
    return None


def new_arena(package: Any, game: str, players: int, seed: int) -> tuple[Any, PrivateRandom]:
    """TextArena's ``game`` reset for ``players`` with ``seed``, and the random state its calls run under.

    Raw: no wrapper re-sends the history. The game reseeds and shuffles the ``random`` module, so it has
    a state of its own.
    """
    arena, private = package.make(f"{game}-raw"), PrivateRandom()
    with private.active():
        arena.reset(num_players=players, seed=seed)
    return arena, private


def mend_invalid_move_arguments(state: Any) -> None:
    """Have ``state.set_invalid_move`` take its arguments in either order.

    TextArena 0.7.4's ThreeCardMonte calls ``set_invalid_move(0.0, "Bad action...")``: reward and
    reason swapped. The first invalid move then showed "Reason: 0.0", and the second, which ends the
    game, left the reason as the reward (a ValueError, recorded as the world's failure, env_error):
    it is the model's invalid move, and ends as in every other game, lost with score 0.
    """
    original = state.set_invalid_move

    def set_invalid_move(reason: Any = None, reward: Any = -1.0) -> None:
        if isinstance(reason, (int, float)) and isinstance(reward, str):
            reason, reward = reward, reason
        original(reason, reward)

    state.set_invalid_move = set_invalid_move


def new_messages(package: Any, arena: Any) -> list[tuple[str, Any]]:
    """``arena``'s messages since the last call, without the echo of a player's own move."""
    _, messages = arena.get_observation()
    action_kind = package.ObservationType.PLAYER_ACTION
    return [(text, kind) for _, text, kind in messages if kind != action_kind]


class Start(NamedTuple):
    """A game just reset: the arena, the random state its calls run under, its rules and first board."""

    arena: Any
    random: PrivateRandom
    rules: str
    board: str  # what a train board is compared by with the test boards


def redraw_seed(task_id: int, redraw: int) -> int:
    """The seed of train task ``task_id``'s ``redraw``-th board drawn again: past both splits' seeds."""
    return REDRAW_SEED + redraw * len(SPLITS["train"]) + task_id


EXPERTS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "TowerOfHanoi": lambda state: hanoi_move(state["towers"]),
    "FrozenLake": frozen_lake_move,
}


class TextArenaEnv(RangeSplits, Env):
    """TextArena single-player puzzles: Sokoban, FrozenLake... (pip install 'omrl[textarena]')."""

    split_ranges = SPLITS
    splits_name = "textarena"
    action_help = (
        "One move per turn, in the format the game's rules give (usually in square brackets, e.g. [A C] or [up])."
    )
    max_turns = 100
    package = "textarena"
    extra = "textarena"

    def __init__(self, game: str = "TowerOfHanoi-v0", max_turns: int = 100):
        self._package = require("textarena", "textarena", "textarena")
        registry = require("textarena.envs.registration", "textarena", "textarena").ENV_REGISTRY
        playable = sorted(
            env_id
            for env_id in registry
            if base_game(env_id) in OFFLINE_GAMES and not env_id.endswith(WRAPPER_SUFFIXES)
        )
        if game not in playable:
            raise ConfigError(
                f"textarena option game: {game!r} is not a single-player game that runs "
                f"offline; valid: {', '.join(playable)}"
            )
        self.game = game
        self.max_turns = int(max_turns)  # type: ignore[misc]  # per instance: an option
        self._expert = EXPERTS.get(base_game(game))
        self._arena: Any = None
        self._random = PrivateRandom()
        self._turn = 0
        self._running = False

    def reset(self, task_id: int) -> Observation:
        self.check_task_id(task_id)
        start = self._start(task_id)
        if task_id in SPLITS["train"] and self.game in REDRAWN:  # a test board is drawn again (the docstring)
            avoid = test_keys(
                ("textarena", self.game),
                lambda: (self._start(seed).board for seed in SPLITS["test"]),
                disk=("textarena", package_version("textarena"), self.game),
            )
            redraws = (self._start(redraw_seed(task_id, n)) for n in range(BOARD_REDRAWS))
            start = clear_of(avoid, itertools.chain([start], redraws), lambda drawn: drawn.board, BOARD_REDRAWS)
        self._arena, self._random = start.arena, start.random
        self._turn = 0
        self._running = True
        return Observation(
            start.board or "The game has started: make your first move.",
            start.rules,
            {"won": False, "score": 0.0, "game": self.game},
        )

    def _start(self, seed: int) -> Start:
        """The game reset with ``seed``, and its first messages: the rules and the board."""
        arena, private = new_arena(self._package, self.game, 1, seed)
        mend_invalid_move_arguments(arena.state)
        messages = new_messages(self._package, arena)
        kinds = self._package.ObservationType
        rules = "\n".join(text for text, kind in messages if kind == kinds.PROMPT)
        board = "\n".join(text for text, kind in messages if kind != kinds.PROMPT)
        return Start(arena, private, rules, board)

    def step(self, action: str) -> StepResult:
        check_running("textarena", self._running)
        state = self._arena.state
        with self._random.active():
            done, _ = self._arena.step(action.strip())
        self._turn += 1
        player = state.game_info[0]
        invalid = bool(getattr(state, "error_count", 0)) or bool(player.get("invalid_move"))
        text = "\n".join(text for text, _ in self._new_messages())
        self._running = not done and self._turn < self.max_turns
        score = clip01((state.rewards or {}).get(0, 0.0)) if done else 0.0
        if done and player.get("reason"):
            text = f"{text}\n{player['reason']}".strip()
        info = {"won": done and score >= 1.0, "score": score, "invalid": invalid}
        return StepResult(text or "(no reply from the game)", score, not self._running, info)

    def expert_action(self) -> str | None:
        if not self._running or self._expert is None:
            return None
        return self._expert(self._arena.state.game_state)

    def _new_messages(self) -> list[tuple[str, Any]]:
        """The game's messages since the last call, without the echo of our own move."""
        return new_messages(self._package, self._arena)
