"""``gridworld``: a small text maze with a shortest-path expert (no extra dependencies).

The agent starts somewhere on a ``size`` x ``size`` grid with walls and must reach the goal.
Each observation says where the goal is relative to the agent and which moves are blocked
(by a wall or the grid's edge), e.g.::

    goal: 2 down, 3 right. blocked: up, left.

so one observation is enough to choose a sensible move; ``show_grid=True`` adds a rendering
of the whole grid (cells separated by spaces) for agents that can plan detours.

Options (config block ``plugins.gridworld``): ``size`` (5: a 5x5 grid), ``wall_density``
(0.3: each cell is a wall with this probability), ``min_distance`` and ``max_distance`` (2
and 6: the shortest path from start to goal), ``max_turns`` (12) and ``show_grid`` (false).

Tasks are generated from the task id alone (plus the options): ``train`` ids are
0..99,999 and ``test`` ids 1,000,000..1,000,499. Every task's goal is reachable.

Actions are ``up``, ``down``, ``left``, ``right`` (case, surrounding whitespace, quotes,
brackets and a final period are ignored). A blocked move leaves the agent in place; any other
text is invalid (``info["invalid"] = True``, state unchanged). Both cost a turn.

Reward: 1.0 on reaching the goal (``won``), else 0. ``info["score"]`` gives partial credit:
``1 - remaining distance / initial distance`` (shortest-path distances, clipped to [0, 1]).

Forking: ``snapshot()`` returns a frozen :class:`GridState` (the maze, the agent's cell, the turn),
which ``restore`` puts on any instance; tree search copies episodes with it.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from omrl.envs import Env, EpisodeFinishedError, Observation, StepResult
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.common import RangeSplits

Cell = tuple[int, int]

TRAIN_IDS = range(0, 100_000)
TEST_IDS = range(1_000_000, 1_000_500)
SPLITS = {"train": TRAIN_IDS, "test": TEST_IDS}
MAX_ATTEMPTS = 10_000  # maze draws per task before the options are declared unsatisfiable
# Listed vertical-first: the expert breaks ties between equally short moves in this order.
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ACTION = re.compile(r"""[\s"'`\[(]*(up|down|left|right)[\s"'`\])]*\.?\s*""", re.IGNORECASE)


@dataclass(frozen=True)
class Maze:
    """One task: the grid's walls, the start and the goal."""

    size: int
    walls: frozenset[Cell]
    start: Cell
    goal: Cell

    def is_open(self, cell: Cell) -> bool:
        row, col = cell
        return 0 <= row < self.size and 0 <= col < self.size and cell not in self.walls

    def open_moves(self, cell: Cell) -> list[str]:
        """The moves that leave ``cell`` (in MOVES order)."""
        return [name for name, (dr, dc) in MOVES.items() if self.is_open((cell[0] + dr, cell[1] + dc))]

    def distances_to_goal(self) -> dict[Cell, int]:
        """Shortest-path distance to the goal of every cell that can reach it (BFS)."""
        distance = {self.goal: 0}
        queue = deque([self.goal])
        while queue:
            row, col = queue.popleft()
            for dr, dc in MOVES.values():
                cell = (row + dr, col + dc)
                if cell not in distance and self.is_open(cell):
                    distance[cell] = distance[(row, col)] + 1
                    queue.append(cell)
        return distance

    def render(self, agent: Cell) -> str:
        """Rows of ``A`` (agent), ``G`` (goal), ``#`` (wall) and ``.``, cells separated by spaces."""
        symbols = {agent: "A", self.goal: "G"}
        return "\n".join(
            " ".join(symbols.get((r, c), "#" if (r, c) in self.walls else ".") for c in range(self.size))
            for r in range(self.size)
        )


@dataclass(frozen=True)
class GridState:
    """A live episode, as ``GridWorld.snapshot`` returns it: immutable, so copies share nothing mutable."""

    maze: Maze
    distances: tuple[tuple[Cell, int], ...]  # distances_to_goal, kept so restoring needs no BFS
    agent: Cell
    turn: int
    done: bool


def generate_maze(task_id: int, size: int, wall_density: float, min_distance: int, max_distance: int) -> Maze:
    """The maze of ``task_id``: walls drawn with ``wall_density``, start and goal at a shortest-path
    distance in [min_distance, max_distance]. Deterministic: one RNG seeded by the task id."""
    rng = random.Random(task_id)
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(MAX_ATTEMPTS):
        walls = frozenset(cell for cell in cells if rng.random() < wall_density)
        free = [cell for cell in cells if cell not in walls]
        if len(free) < 2:
            continue
        start, goal = rng.sample(free, 2)
        maze = Maze(size, walls, start, goal)
        if min_distance <= maze.distances_to_goal().get(start, -1) <= max_distance:
            return maze
    raise ConfigError(
        f"gridworld: no maze of size {size} with wall_density {wall_density} has start and goal "
        f"{min_distance}..{max_distance} apart (task {task_id}); lower wall_density or widen the distances"
    )


def parse_move(action: str) -> str | None:
    """``" Up."`` -> ``"up"``; None for anything that is not one of the four moves."""
    match = _ACTION.fullmatch(action)
    return match.group(1).lower() if match else None


def describe(maze: Maze, agent: Cell, show_grid: bool) -> str:
    """The goal's offset and the blocked moves (and the grid, if asked) as one short text."""
    d_row, d_col = maze.goal[0] - agent[0], maze.goal[1] - agent[1]
    offset = []
    if d_row:
        offset.append(f"{abs(d_row)} {'down' if d_row > 0 else 'up'}")
    if d_col:
        offset.append(f"{abs(d_col)} {'right' if d_col > 0 else 'left'}")
    open_moves = maze.open_moves(agent)
    blocked = [name for name in MOVES if name not in open_moves]
    text = f"goal: {', '.join(offset) or 'here'}. blocked: {', '.join(blocked) or 'none'}."
    return f"{text}\n{maze.render(agent)}" if show_grid else text


class GridWorld(RangeSplits, Env):
    """A small text maze: reach the goal with up/down/left/right; BFS shortest-path expert."""

    split_ranges = SPLITS
    splits_name = "gridworld"
    action_help = "Reply with one move: up, down, left or right."
    tools = [
        {
            "name": "move",
            "description": "Move one cell on the grid.",
            "parameters": {
                "type": "object",
                "properties": {
                    "direction": {"type": "string", "enum": list(MOVES), "description": "Which way to move."}
                },
                "required": ["direction"],
            },
        }
    ]
    max_turns = 12
    deterministic = True

    def __init__(
        self,
        size: int = 5,
        wall_density: float = 0.3,
        min_distance: int = 2,
        max_distance: int = 6,
        max_turns: int = 12,
        show_grid: bool = False,
    ):
        _check_option("size", size, 3, 12, integer=True)
        _check_option("wall_density", wall_density, 0.0, 0.5)
        # the farthest two cells of an empty grid are 2 * (size - 1) apart
        _check_option("max_distance", max_distance, 1, 2 * (size - 1), integer=True)
        _check_option("min_distance", min_distance, 1, max_distance, integer=True)
        _check_option("max_turns", max_turns, 1, 1000, integer=True)
        self.size = size
        self.wall_density = float(wall_density)
        self.min_distance = min_distance
        self.max_distance = max_distance
        self.max_turns = max_turns  # type: ignore[misc]  # per instance: an option
        self.show_grid = bool(show_grid)
        self._maze: Maze | None = None
        self._distance: dict[Cell, int] = {}
        self._agent: Cell = (0, 0)
        self._turn = 0
        self._done = True

    def maze(self, task_id: int) -> Maze:
        """The maze of ``task_id`` under this instance's options."""
        self.check_task_id(task_id)
        return generate_maze(task_id, self.size, self.wall_density, self.min_distance, self.max_distance)

    def reset(self, task_id: int) -> Observation:
        self._maze = self.maze(task_id)
        self._distance = self._maze.distances_to_goal()
        self._agent = self._maze.start
        self._turn = 0
        self._done = False
        instruction = (
            f"Walk to the goal on a {self.size}x{self.size} grid with walls in at most {self.max_turns} moves."
        )
        return Observation(
            describe(self._maze, self._agent, self.show_grid),
            instruction,
            {"won": False, "score": 0.0, "distance": self._distance[self._agent]},
        )

    def step(self, action: str) -> StepResult:
        if self._done or self._maze is None:
            raise EpisodeFinishedError("gridworld: the episode is over; call reset(task_id) to start another")
        self._turn += 1
        move = parse_move(action)
        if move is None:
            prefix = f"invalid action {action.strip()[:40]!r}: reply with up, down, left or right."
        elif move in self._maze.open_moves(self._agent):
            dr, dc = MOVES[move]
            self._agent = (self._agent[0] + dr, self._agent[1] + dc)
            prefix = f"moved {move}."
        else:
            prefix = f"cannot move {move}: blocked."
        won = self._agent == self._maze.goal
        self._done = won or self._turn >= self.max_turns
        if won:
            text = f"{prefix} You reached the goal!"
        else:
            text = f"{prefix} {describe(self._maze, self._agent, self.show_grid)}"
        remaining = self._distance[self._agent]
        score = 1.0 if won else max(0.0, 1.0 - remaining / self._distance[self._maze.start])
        info: dict[str, Any] = {"won": won, "score": score, "invalid": move is None, "distance": remaining}
        return StepResult(text, 1.0 if won else 0.0, self._done, info)

    def snapshot(self) -> GridState:
        if self._maze is None:
            raise EpisodeFinishedError("gridworld: no episode to snapshot; call reset(task_id) first")
        return GridState(self._maze, tuple(self._distance.items()), self._agent, self._turn, self._done)

    def restore(self, state: GridState) -> None:
        self._maze, self._agent, self._turn, self._done = state.maze, state.agent, state.turn, state.done
        self._distance = dict(state.distances)  # this instance's own dict

    def admissible_actions(self) -> list[str] | None:
        if self._maze is None or self._done:
            return None
        return self._maze.open_moves(self._agent)

    def expert_action(self) -> str | None:
        """A move along a shortest path; among equally short ones, one along the axis with
        the larger gap to the goal (then vertical first), so the choice is predictable."""
        if self._maze is None or self._done:
            return None
        here = self._distance[self._agent]
        d_row, d_col = self._maze.goal[0] - self._agent[0], self._maze.goal[1] - self._agent[1]

        def preference(move: str) -> tuple[int, int]:
            dr, dc = MOVES[move]
            progress = dr * d_row + dc * d_col  # > 0 when the move closes the gap on its axis
            gap = abs(d_row) if dr else abs(d_col)
            return (-(progress > 0) * gap, list(MOVES).index(move))

        def lands_closer(move: str) -> bool:
            dr, dc = MOVES[move]
            return self._distance.get((self._agent[0] + dr, self._agent[1] + dc)) == here - 1

        shortest = [move for move in self._maze.open_moves(self._agent) if lands_closer(move)]
        return min(shortest, key=preference)

    def expert_thought(self) -> str:
        """Where the goal is and why the expert's move goes there (a detour when walls are in the way)."""
        move = self.expert_action()
        if move is None or self._maze is None:
            return ""
        goal = describe(self._maze, self._agent, False).split(".")[0].removeprefix("goal: ")
        toward = move in goal  # the move's own direction is part of the goal's offset
        return f"The goal is {goal}; {move} {'gets closer' if toward else 'goes around the walls'}."

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        """``move(direction="up")`` -> ``up``; any other tool stays as its name (an invalid action)."""
        if name == "move":
            return str(arguments.get("direction", ""))
        return name


def _check_option(name: str, value: Any, low: float, high: float, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"gridworld option {name}={value!r} is invalid; valid: {kind} in {low}..{high}")


@hookimpl
def register_envs(register):
    register("gridworld", GridWorld)
