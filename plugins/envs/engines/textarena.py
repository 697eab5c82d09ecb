"""``textarena``: TextArena's single-player puzzles (PyPI ``textarena``), played offline.

Install with ``pip install 'omrl[textarena]'``. Options (config block ``plugins.textarena``):

- ``game``: a TextArena env id of a single-player game that runs offline (default
  ``TowerOfHanoi-v0``; variants such as ``Sokoban-v0-medium`` work too). Games: 2048, Bandit,
  Blackjack, Crosswords, FifteenPuzzle, FrozenLake, GuessTheNumber, LightsOut, Mastermind,
  Minesweeper, PegJump, RushHour, Sokoban, Sudoku, ThreeCardMonte, TowerOfHanoi. (Word games
  that download NLTK data, and games that call LLM APIs, do not run offline.)
- ``max_turns`` (default 100; most games end sooner by their own turn limit).

Task ids are the games' seeds: ``train`` 0..99,999, ``test`` 1,000,000..1,000,499. Games
without randomness (TowerOfHanoi, PegJump) play the same puzzle under every id. The seeds are
disjoint, the boards not: where a game has few starting boards the splits share them (of the 500
test boards, the first 1,000 train ids hold 462 in FrozenLake-v0, 265 in FrozenLake-v0-random,
456 in 2048-v0 and 487 in 2048-v0-3x3), so a test score there does not measure play on unseen
boards; Crosswords, FifteenPuzzle, LightsOut and FrozenLake-v0-hardcore share next to none.

Moves use each game's own syntax, usually in square brackets (``[A C]``, ``[up]``); the rules
are in the instruction. A move the game refuses is ``invalid``; as in TextArena, a second
invalid move in a row ends the game. Reward: the game's final reward, clipped to [0, 1], on
the last step (it is also ``score``); ``won`` when that reward is 1.

Experts: TowerOfHanoi (optimal from any position) and FrozenLake (shortest path around the
holes); other games have none. Games run on their own ``random`` state, so an episode
depends on its seed alone and the caller's ``random`` module is untouched.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from omrl.envs import Env, Observation, StepResult
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import PrivateRandom, RangeSplits, check_running, clip01, require

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
        self._arena, self._random = new_arena(self._package, self.game, 1, task_id)
        mend_invalid_move_arguments(self._arena.state)
        messages = self._new_messages()
        kinds = self._package.ObservationType
        rules = "\n".join(text for text, kind in messages if kind == kinds.PROMPT)
        board = "\n".join(text for text, kind in messages if kind != kinds.PROMPT)
        self._turn = 0
        self._running = True
        return Observation(
            board or "The game has started: make your first move.",
            rules,
            {"won": False, "score": 0.0, "game": self.game},
        )

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
        _, messages = self._arena.get_observation()
        action_kind = self._package.ObservationType.PLAYER_ACTION
        return [(text, kind) for _, text, kind in messages if kind != action_kind]
