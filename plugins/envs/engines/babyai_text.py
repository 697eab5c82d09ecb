"""BabyAI's grid as text, as AgentGym's BabyAI server writes it: what the agent sees and what it may do.

AgentGym (``agentenv-babyai``) describes the cells the agent sees, nearest first, numbering
objects of the same name ("There is a red ball 1 right in front of you 2 steps away."), and
offers macro actions that play a shortest path of minigrid's low-level actions: ``go to red
ball 1``, ``pickup red ball 1``, ``go through blue open door 1``, ``toggle and go through
blue closed door 1``, besides ``turn left``, ``turn right``, ``move forward``, ``drop``,
``toggle`` and ``check available actions``. Refused actions get AgentGym's explanations
("You cannot drop the object, as you are not carrying anything.").

Where AgentGym's code has slips, this module does what it evidently meant: numbers in action
names match the numbers in the description, paths avoid closed doors and cells the agent cannot
see, ``move forward`` and ``drop`` are offered where minigrid would carry them out, and a view
with nothing but walls in it says "You cannot see any objects within sight." ``toggle`` acts on
whatever is in front as minigrid's toggle does: AgentGym offered it for a closed door only, which
left KeyInBox (the key is in a box) unsolvable, and "open a door" missions too once that door
stood open (it must be closed and opened again). The module reads a live minigrid env but
imports nothing from minigrid.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

# minigrid's low-level actions (MiniGridEnv.Actions), as numbers so this module imports nothing
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = range(6)
DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid's DIR_TO_VEC, by agent_dir
PICKABLE = ("key", "ball", "box")
CHECK = "check available actions"


@dataclass(frozen=True)
class Seen:
    """An object the agent sees: ``name`` ("red ball", "blue closed door"), the ``number``-th of
    that name counting from the nearest, its kind and cell, and where it is from the agent."""

    name: str
    number: int
    kind: str
    pos: tuple[int, int]
    front: int
    right: int

    @property
    def label(self) -> str:
        return f"{self.name} {self.number}"

    @property
    def door_state(self) -> str:
        """ "open", "closed" or "locked" for a door ("" for anything else)."""
        return self.name.split()[1] if self.kind == "door" else ""

    def where(self) -> str:
        if self.right == 0:
            return f"right in front of you {self.front} steps away."
        side = "right" if self.right > 0 else "left"
        return f"{self.front} steps in front of you and {abs(self.right)} steps to your {side}."


@dataclass(frozen=True)
class Macro:
    """A text action: the low-level actions it plays (in order) and the cell it is about."""

    steps: tuple[int, ...]
    target: tuple[int, int] | None = None


@dataclass(frozen=True)
class View:
    """What the agent sees now: the description, the valid actions (in AgentGym's order) and
    explanations for actions that are refused now."""

    description: str
    actions: dict[str, Macro]
    refusals: dict[str, str]

    def action_list(self) -> str:
        return "Available actions: [" + ", ".join(f'"{name}"' for name in self.actions) + "]"

    def refusal(self, action: str) -> str:
        return self.refusals.get(action, "The action is not recognized. Please check valid actions.")


def object_name(cell: Any) -> str:
    """ "red ball", "blue locked door"."""
    if cell.type == "door":
        state = "open" if cell.is_open else "locked" if cell.is_locked else "closed"
        return f"{cell.color} {state} door"
    return f"{cell.color} {cell.type}"


def look(env: Any) -> View:
    """The text view of ``env`` (a minigrid env, unwrapped) as it is now."""
    pos, direction = (int(env.agent_pos[0]), int(env.agent_pos[1])), int(env.agent_dir)
    cells = visible_cells(env)
    seen = visible_objects(cells, pos, direction)
    free = {cell for cell, obj in cells.items() if passable(obj)} | {pos}
    front = (pos[0] + DIRECTIONS[direction][0], pos[1] + DIRECTIONS[direction][1])
    here = _Here(pos, direction, free, front, env.grid.get(*front), env.carrying)

    actions: dict[str, Macro] = {"turn left": Macro((LEFT,)), "turn right": Macro((RIGHT,))}
    refusals: dict[str, str] = {}
    if here.front_cell is None or here.front_cell.can_overlap():
        actions["move forward"] = Macro((FORWARD,), front)
    else:
        refusals["move forward"] = "There is a barrier in front of you, you can't move forward."
    _pickups(here, seen, actions, refusals)
    if here.carrying and here.front_cell is None:
        actions["drop"] = Macro((DROP,), front)
    else:
        refusals["drop"] = "You cannot drop the object, as " + (
            "there is already an object in front of you." if here.carrying else "you are not carrying anything."
        )
    _doors(here, seen, actions, refusals)
    _toggle(here, actions, refusals)
    _go_tos(here, seen, actions, refusals)
    actions[CHECK] = Macro(())
    return View(describe(cells, seen, pos, direction, here.carrying), actions, refusals)


def describe(
    cells: dict[tuple[int, int], Any], seen: list[Seen], pos: tuple[int, int], direction: int, carrying: Any
) -> str:
    """AgentGym's description: the objects in sight, the nearest wall or box straight ahead, the load."""
    parts = [
        "In front of you in this room, you can see several objects: "
        + " ".join(f"There is a {s.label} {s.where()}" for s in seen)
        if seen
        else "You cannot see any objects within sight.",
        "The room has walls around you.",
    ]
    (dx, dy), k = DIRECTIONS[direction], 1
    while (pos[0] + k * dx, pos[1] + k * dy) in cells:  # along the line of sight
        obj = cells[(pos[0] + k * dx, pos[1] + k * dy)]
        if obj is not None and obj.type in ("wall", "box"):
            parts.append(f"You are facing a {obj.type} {k} steps away.")
            break
        k += 1
    parts.append(
        f"You are carrying a {carrying.color} {carrying.type}." if carrying else "You are not carrying anything."
    )
    return " ".join(parts)


@dataclass(frozen=True)
class _Here:
    """Where the agent stands, what it can walk on, what is in front of it, what it carries."""

    pos: tuple[int, int]
    direction: int
    free: set[tuple[int, int]]
    front: tuple[int, int]
    front_cell: Any
    carrying: Any

    def path(self, target: tuple[int, int], arrive: bool) -> tuple[int, ...] | None:
        return shortest_path(self.pos, self.direction, target, self.free, arrive)


def _pickups(here: _Here, seen: list[Seen], actions: dict[str, Macro], refusals: dict[str, str]) -> None:
    """``pickup <object> <n>``: walk to face it, pick it up."""
    for s in seen:
        if s.kind not in PICKABLE:
            continue
        name, steps = f"pickup {s.label}", here.path(s.pos, arrive=False)
        if here.carrying:
            refusals[name] = (
                f"You cannot pickup {s.label}, as you are already carrying a "
                f"{here.carrying.color} {here.carrying.type}."
            )
        elif steps is None:
            refusals[name] = f"You cannot pickup {s.label}, as there is no path leading to it."
        else:
            actions[name] = Macro(steps + (PICKUP,), s.pos)


def _doors(here: _Here, seen: list[Seen], actions: dict[str, Macro], refusals: dict[str, str]) -> None:
    """``go through <open door> <n>`` (walk into the doorway) and ``toggle and go through <closed or
    locked door> <n>`` (face it, toggle it, step in; a locked one needs the key of its colour)."""
    for s in seen:
        if s.kind != "door":
            continue
        through, toggle_through = f"go through {s.label}", f"toggle and go through {s.label}"
        no_path = "as there is no path leading to it."
        if s.door_state == "open":
            steps = here.path(s.pos, arrive=True)
            if steps is None:
                refusals[through] = f"You cannot go through {s.label}, {no_path}"
            else:
                actions[through] = Macro(steps, s.pos)
            continue
        refusals[through] = f"You cannot go through {s.label}, as it is {s.door_state}. You should toggle it first."
        key = here.carrying if here.carrying is not None and here.carrying.type == "key" else None
        steps = here.path(s.pos, arrive=False)
        if s.door_state == "locked" and key is None:
            refusals[toggle_through] = f"You cannot toggle and go through {s.label}, as you are not carrying a key."
        elif s.door_state == "locked" and key.color != s.name.split()[0]:
            refusals[toggle_through] = (
                f"You cannot toggle and go through {s.label}, as the color of the key "
                "you are carrying does not match the color of door."
            )
        elif steps is None:
            refusals[toggle_through] = f"You cannot toggle and go through {s.label}, {no_path}"
        else:
            actions[toggle_through] = Macro(steps + (TOGGLE, FORWARD), s.pos)


def _toggle(here: _Here, actions: dict[str, Macro], refusals: dict[str, str]) -> None:
    """``toggle`` what is in front: open or close a door (BabyAIBot closes a door that it must open
    when it is open already), unlock one with the key of its colour, open a box."""
    cell, carrying = here.front_cell, here.carrying
    kind = cell.type if cell is not None else ""
    has_key = carrying is not None and carrying.type == "key" and kind == "door" and carrying.color == cell.color
    if kind == "door" and cell.is_locked and not has_key:
        refusals["toggle"] = f"You cannot toggle the {object_name(cell)}, as you are not carrying its key."
    elif kind in ("door", "box"):
        actions["toggle"] = Macro((TOGGLE,), here.front)
    else:
        refusals["toggle"] = "There is nothing in front of you that you can toggle."


def _go_tos(here: _Here, seen: list[Seen], actions: dict[str, Macro], refusals: dict[str, str]) -> None:
    """``go to goal`` (stand on it) and ``go to <object> <n>`` (walk to face it)."""
    for s in seen:
        if s.kind == "goal":
            steps = here.path(s.pos, arrive=True)
            if steps is None:
                refusals["go to goal"] = "You cannot go to the goal, as there is no path leading to it."
            else:
                actions["go to goal"] = Macro(steps, s.pos)
    for s in seen:
        if s.kind == "goal":
            continue
        steps = here.path(s.pos, arrive=False)
        if steps is None:
            refusals[f"go to {s.label}"] = f"You cannot go to {s.label}, as there is no path leading to it."
        else:
            actions[f"go to {s.label}"] = Macro(steps, s.pos)


def visible_cells(env: Any) -> dict[tuple[int, int], Any]:
    """The cells the agent sees (absolute position -> object or None), far rows first, left to
    right within a row; the agent's own cell is left out."""
    _, vis_mask = env.gen_obs_grid()
    size = env.agent_view_size
    pos, forward, right = env.agent_pos, env.dir_vec, env.right_vec
    top_left = pos + forward * (size - 1) - right * (size // 2)
    cells = {}
    for j in range(size):
        for i in range(size):
            x, y = (int(v) for v in top_left - forward * j + right * i)
            if (
                not vis_mask[i, j]
                or not (0 <= x < env.width and 0 <= y < env.height)
                or (x, y) == (int(pos[0]), int(pos[1]))
            ):
                continue
            cells[(x, y)] = env.grid.get(x, y)
    return cells


def visible_objects(cells: dict[tuple[int, int], Any], pos: tuple[int, int], direction: int) -> list[Seen]:
    """The objects in ``cells`` but walls, nearest first, numbered per name."""
    forward, right = DIRECTIONS[direction], DIRECTIONS[(direction + 1) % 4]
    found = [(cell, obj) for cell, obj in cells.items() if obj is not None and obj.type != "wall"]
    found.sort(key=lambda item: abs(item[0][0] - pos[0]) + abs(item[0][1] - pos[1]))  # stable: view order
    counts: dict[str, int] = {}
    seen = []
    for cell, obj in found:
        name = object_name(obj)
        counts[name] = counts.get(name, 0) + 1
        dx, dy = cell[0] - pos[0], cell[1] - pos[1]
        seen.append(
            Seen(name, counts[name], obj.type, cell, dx * forward[0] + dy * forward[1], dx * right[0] + dy * right[1])
        )
    return seen


def passable(obj: Any) -> bool:
    """Whether a path may cross the cell: empty, an open door, a goal or floor (not lava)."""
    return obj is None or (obj.can_overlap() and obj.type != "lava")


def shortest_path(
    pos: tuple[int, int], direction: int, target: tuple[int, int], free: set[tuple[int, int]], arrive: bool
) -> tuple[int, ...] | None:
    """The fewest low-level actions (forward, left, right) through ``free`` cells that stand on
    ``target`` (``arrive``) or face it; None when there is no such path."""

    def reached(state: tuple[tuple[int, int], int]) -> bool:
        (x, y), d = state
        if arrive:
            return (x, y) == target
        return (x + DIRECTIONS[d][0], y + DIRECTIONS[d][1]) == target

    start = (pos, direction)
    parents: dict[tuple[tuple[int, int], int], tuple[Any, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if reached(state):
            steps = []
            while parents[state] is not None:
                state, action = parents[state]  # type: ignore[misc]
                steps.append(action)
            return tuple(reversed(steps))
        (x, y), d = state
        ahead = (x + DIRECTIONS[d][0], y + DIRECTIONS[d][1])
        moves = ((FORWARD, (ahead, d)), (LEFT, ((x, y), (d - 1) % 4)), (RIGHT, ((x, y), (d + 1) % 4)))
        for action, nxt in moves:
            if action == FORWARD and ahead not in free:
                continue
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
    return None
