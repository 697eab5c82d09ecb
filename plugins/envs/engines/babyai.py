"""``babyai``: BabyAI's grid-world levels (PyPI ``minigrid``), played in process as text, as
AgentGym's BabyAI server shows them.

Install with ``pip install 'omrl[babyai]'``. Envs:

- ``babyai``: AgentGym's 40 levels under AgentGym's numbering: task id ``i`` plays level
  ``LEVELS[i % 40]`` (AgentGym's level ``i % 40 + 1``) with seed ``i // 40``. ``test`` 0..399
  (seeds 0..9, AgentGym's ids), ``train`` 40,000..79,999 (seeds 1,000..1,999).
- ``babyai:<Level>`` (``babyai:GoToRedBall``...): one level; the task id is the seed. ``test``
  0..99, ``train`` 1,000..100,999. The family's test tasks are among a level's test tasks, and
  no seed is both a test and a train task across the two. Two seeds can deal the same board (of
  GoToRedBallNoDists' 100 test boards, its first 1,000 train ids held 27): a train task whose first
  board (mission, agent and grid) is a test board is dealt again from seed ``n * 1,000,000`` + its
  seed (n = 1, 2, ...), up to 20 times (``disjoint.py``); the test split is unchanged. OpenRedDoor
  has too few boards for that (``SHARED_BOARDS``, named in its description).

Option (block ``plugins.babyai``): ``level``, one of :data:`LEVELS` (``""``, the default: all
40 as above); the ``babyai:<Level>`` envs fix it.

The observation is AgentGym's: the goal (minigrid's mission, verbatim: AgentGym rewrote "then"
and "after you" to "and", which loses the order the level checks), what the agent sees, what it
carries, and the actions valid now as macro actions (``go to red ball 1``, ``pickup red ball
1``, ``toggle and go through blue closed door 1``...; see AgentGym's ``babyai_text``). A refused action
is ``invalid`` with AgentGym's explanation and costs no minigrid step. Reward and ``score``:
minigrid's, ``1 - 0.9 * steps / max_steps`` on success (0 otherwise), on the step that ends the
level; ``won`` on success. An episode ends when minigrid's does: success, a failed mission
(e.g. doors opened in the wrong order where the level is strict) or the level's ``max_steps``
low-level steps (AgentGym's server kept a level going after a success worth 0.5 or less).

Expert: minigrid's ``BabyAIBot``, kept in step with every low-level step played (it advises from
any position the agent reaches); its next low-level action is given as the text action that plays
it (``move forward``, ``pickup red ball 1``, ``toggle``...). It gives up (None) where it cannot
help: KeyInBox and PutNextS7N4Carrying (minigrid's bot cannot solve them), some strict
OpenDoorsOrderN4Debug missions, layouts where it replans in circles (capped) or trips its own
checks. On the family's 400 test tasks it wins 368 (92%) given up to 500 turns
(``env.max_turns=500``, and in a rollout a ``max_context`` that holds such an episode); under the
default 20-turn cap it wins 229 (57%) played on the env alone, and fewer in a rollout whose
context fills first. It gives up on 24 of them: an expert rollout then ends the episode as
``expert_gave_up``, a loss in the rollout's success rate (the world did not fail, the expert did).

Episodes depend on (task, actions) alone, and ``snapshot``/``restore`` copy a live episode
(the minigrid env and the bot, deep-copied).
"""

from __future__ import annotations

import copy
import difflib
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.envs import DemoTurn, Env, EnvError, Observation, StepResult, env_variant
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.babyai_text import CHECK, DROP, FORWARD, LEFT, PICKUP, RIGHT, TOGGLE, View, look
from omrl_plugins.envs.engines.common import (
    check_running,
    check_task_in_splits,
    clean_action,
    clip01,
    require,
    split_ids,
)
from omrl_plugins.envs.engines.disjoint import MAX_REDRAWS, clear_of, package_version, shared_boards_note, test_keys

#: AgentGym's BabyAI levels in its order (AgentGym's level n is LEVELS[n - 1]); minigrid ids BabyAI-<Level>-v0
LEVELS = (
    "GoToRedBallGrey",
    "GoToRedBall",
    "GoToRedBallNoDists",
    "GoToObjS6",
    "GoToLocalS8N7",
    "GoToObjMazeS7",
    "GoToImpUnlock",
    "GoToSeqS5R2",
    "GoToRedBlueBall",
    "GoToDoor",
    "GoToObjDoor",
    "Open",
    "OpenRedDoor",
    "OpenDoorLoc",
    "OpenRedBlueDoorsDebug",
    "OpenDoorsOrderN4Debug",
    "Pickup",
    "UnblockPickup",
    "PickupLoc",
    "PickupDistDebug",
    "PickupAbove",
    "PutNextLocalS6N4",
    "PutNextS7N4Carrying",
    "Unlock",
    "UnlockLocalDist",
    "KeyInBox",
    "UnlockPickupDist",
    "BlockedUnlockPickup",
    "UnlockToUnlock",
    "ActionObjDoor",
    "FindObjS7",
    "KeyCorridorS6R3",
    "OneRoomS20",
    "MoveTwoAcrossS8N9",
    "SynthS5R2",
    "SynthLoc",
    "SynthSeq",
    "MiniBossLevel",
    "BossLevel",
    "BossLevelNoUnlock",
)
#: minigrid 3 registers GoToObjS6 as v1 only (v0 had wrong registry parameters)
GYM_IDS = {"GoToObjS6": "BabyAI-GoToObjS6-v1"}
FAMILY_SPLITS = {"test": range(0, 400), "train": range(40_000, 80_000)}
LEVEL_SPLITS = {"test": range(0, 100), "train": range(1_000, 101_000)}
REDRAW_SEED = 1_000_000  # a train board's n-th redraw (n = 0, 1...): seed (n + 1) * this + its seed
SHARED_BOARDS = {"OpenRedDoor": "its few boards (about 64)"}  # too few boards for splits of their own
BOT_ACTIONS = {LEFT: "turn left", RIGHT: "turn right", FORWARD: "move forward", DROP: "drop", TOGGLE: "toggle"}


_minigrid_log = logging.getLogger("minigrid")


def _log_minigrid(*args: Any, **_: Any) -> None:
    _minigrid_log.debug(" ".join(map(str, args)))


def gym_id(level: str) -> str:
    """The minigrid (gymnasium) id of a level: ``GoToRedBall`` -> ``BabyAI-GoToRedBall-v0``."""
    return GYM_IDS.get(level, f"BabyAI-{level}-v0")


def check_level(level: str) -> str:
    """``level`` as a name of :data:`LEVELS` (a minigrid id such as ``BabyAI-GoToRedBall-v0`` is
    taken too), or ConfigError naming close matches."""
    name = level.removeprefix("BabyAI-").rsplit("-v", 1)[0] if isinstance(level, str) else level
    if name in LEVELS:
        return name
    close = difflib.get_close_matches(str(name), LEVELS, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"babyai option level: unknown level {level!r}{hint} (valid: {', '.join(LEVELS)})")


def board(game: Any) -> str:
    """What identifies a level's first board: the mission, the agent's cell and direction, the grid."""
    return repr((game.mission, tuple(map(int, game.agent_pos)), int(game.agent_dir), game.grid.encode().tobytes()))


def effect_state(game: Any) -> tuple[Any, ...]:
    """What a low-level action can change: the agent's cell, direction and load, and the state of
    the cell in front (a door opened, a box opened)."""
    front = game.grid.get(*game.front_pos)
    return (
        int(game.agent_pos[0]),
        int(game.agent_pos[1]),
        game.agent_dir,
        id(game.carrying),
        id(front),
        getattr(front, "is_open", None),
        getattr(front, "is_locked", None),
    )


class PlanStack(list):
    """BabyAIBot's stack of subgoals, with a cap on the pushes of one replan: on some layouts
    (UnlockToUnlock, seed 4) the bot replans in a circle forever."""

    limit = 100
    pushes = 0

    def append(self, subgoal: Any) -> None:
        self.pushes += 1
        if self.pushes > self.limit:
            raise RecursionError(f"BabyAIBot pushed {self.limit} subgoals in one replan; it is going in circles")
        super().append(subgoal)


@dataclass
class Episode:
    """One live episode, copied whole by ``snapshot``: the minigrid env, the bot that advises on it
    (None once it gave up) with its suggested low-level action, the current view, the running reward."""

    level: str
    seed: int
    game: Any
    bot: Any
    suggestion: int | None
    view: View
    reward: float = 0.0
    running: bool = True


class BabyAIEnv(Env):
    """BabyAI grid-world levels as text, like AgentGym's BabyAI (pip install 'omrl[babyai]')."""

    action_help = (
        "One action per turn, exactly as written in the list of available actions: turn left, "
        "turn right, move forward, go to <object> <n>, pickup <object> <n>, drop, toggle, "
        "go through <door> <n>, toggle and go through <door> <n>, check available actions."
    )
    action_example = "go to red ball 1"
    max_turns = 20
    deterministic = True
    package = "minigrid"
    extra = "babyai"
    #: GoToLocalS8N7, seed 1002 (a train task): the target is out of sight until the agent turns
    demonstration = (
        DemoTurn(
            "Your goal: go to the blue box\nIn front of you in this room, you can see several objects: "
            "There is a green key 1 1 steps in front of you and 2 steps to your right. There is a blue "
            "ball 1 1 steps in front of you and 3 steps to your left. The room has walls around you. You "
            "are facing a wall 3 steps away. You are not carrying anything.\n"
            'Available actions: ["turn left", "turn right", "move forward", "pickup green key 1", '
            '"pickup blue ball 1", "go to green key 1", "go to blue ball 1", "check available actions"]',
            "I cannot see a blue box. I will turn to look around.",
            "turn left",
        ),
        DemoTurn(
            "In front of you in this room, you can see several objects: There is a blue box 1 2 steps in "
            "front of you and 1 steps to your left. There is a blue ball 1 3 steps in front of you and 1 "
            "steps to your right. There is a yellow ball 1 2 steps in front of you and 2 steps to your "
            "left. There is a grey box 1 3 steps in front of you and 3 steps to your left. The room has "
            "walls around you. You are facing a wall 4 steps away. You are not carrying anything.\n"
            'Available actions: ["turn left", "turn right", "move forward", "pickup blue box 1", '
            '"pickup blue ball 1", "pickup yellow ball 1", "pickup grey box 1", "go to blue box 1", '
            '"go to blue ball 1", "go to yellow ball 1", "go to grey box 1", "check available actions"]',
            "The blue box is in sight now: go to it.",
            "go to blue box 1",
        ),
    )

    def __init__(self, level: str = ""):
        self.level = check_level(level) if level else ""
        self.name = f"babyai:{self.level}" if self.level else "babyai"
        self._splits = LEVEL_SPLITS if self.level else FAMILY_SPLITS
        self._gym = require("gymnasium", self.name, self.extra)
        require("minigrid", self.name, self.extra)  # registers the BabyAI levels with gymnasium
        # minigrid print()s every level layout it rejects while sampling one ("Sampling rejected: ..."),
        # which would land in our output; send those lines to a debug log instead (thread-safe, unlike
        # swapping sys.stdout around reset while `omrl env serve` resets envs from several threads)
        sampler = require("minigrid.envs.babyai.core.roomgrid_level", self.name, self.extra)
        sampler.print = _log_minigrid
        self._bot_class = require("minigrid.utils.baby_ai_bot", self.name, self.extra).BabyAIBot
        self._episode: Episode | None = None

    def task_ids(self, split: str) -> Sequence[int]:
        return split_ids(self.name, split, self._splits)

    def level_and_seed(self, task_id: int) -> tuple[str, int]:
        """The level and seed a task id plays (AgentGym's numbering for the family)."""
        check_task_in_splits(self.name, task_id, self._splits)
        return (self.level, task_id) if self.level else (LEVELS[task_id % 40], task_id // 40)

    def reset(self, task_id: int) -> Observation:
        level, seed = self.level_and_seed(task_id)
        game = self._deal(level, seed)
        if task_id in self._splits["train"] and level not in SHARED_BOARDS:  # a test board dealt again
            avoid = test_keys(
                ("babyai", level),
                lambda: (board(self._deal(level, test)) for test in LEVEL_SPLITS["test"]),
                disk=("babyai", package_version("minigrid"), level),
            )
            seeds = itertools.chain([seed], ((n + 1) * REDRAW_SEED + seed for n in range(MAX_REDRAWS)))
            seed, game = clear_of(avoid, ((s, self._deal(level, s)) for s in seeds), lambda dealt: board(dealt[1]))
        bot = self._bot_class(game)
        bot.stack = PlanStack(bot.stack)
        episode = Episode(level, seed, game, bot, None, look(game))
        self._advise(episode, None)
        self._episode = episode
        goal = f"Your goal: {game.mission}"
        text = f"{goal}\n{episode.view.description}\n{episode.view.action_list()}"
        return Observation(text, goal, self._info(episode, invalid=False))

    def step(self, action: str) -> StepResult:
        episode = self._episode
        check_running(self.name, episode is not None and episode.running)
        assert episode is not None
        command = clean_action(action).rstrip(".").replace("pick up ", "pickup ")
        macro = episode.view.actions.get(command)
        if macro is None:
            text = f"{episode.view.refusal(command)}\n{episode.view.action_list()}"
            return StepResult(text, 0.0, False, self._info(episode, invalid=True))
        if command == CHECK:
            return StepResult(self._text(episode, ""), 0.0, False, self._info(episode, invalid=False))
        if not macro.steps:
            return StepResult(
                f"No change in state.\n{episode.view.action_list()}", 0.0, False, self._info(episode, invalid=False)
            )
        reward, ending = self._play(episode, macro.steps)
        episode.reward += reward
        episode.view = look(episode.game)
        episode.running = not ending
        return StepResult(self._text(episode, ending), reward, bool(ending), self._info(episode, invalid=False))

    def admissible_actions(self) -> list[str] | None:
        episode = self._episode
        return list(episode.view.actions) if episode is not None and episode.running else None

    def expert_action(self) -> str | None:
        episode = self._episode
        if episode is None or not episode.running or episode.suggestion is None:
            return None
        if episode.suggestion == PICKUP:
            name = next(
                (
                    name
                    for name, macro in episode.view.actions.items()
                    if name.startswith("pickup ") and macro.steps == (PICKUP,)
                ),
                None,
            )
        else:
            name = BOT_ACTIONS.get(episode.suggestion)  # `done` (the bot thinks the goal is met): none
        return name if name in episode.view.actions else None

    def snapshot(self) -> Episode:
        if self._episode is None:
            raise EnvError(f"{self.name}: no episode to snapshot; call reset(task_id) first")
        return copy.deepcopy(self._episode)

    def restore(self, state: Episode) -> None:
        if not isinstance(state, Episode):
            raise EnvError(f"{self.name}: restore takes what snapshot returned, not a {type(state).__name__}")
        if self.level and state.level != self.level:
            raise EnvError(f"{self.name}: the snapshot is of level {state.level}, not {self.level}")
        self._episode = copy.deepcopy(state)

    def _deal(self, level: str, seed: int) -> Any:
        game = self._gym.make(gym_id(level), disable_env_checker=True).unwrapped
        game.reset(seed=seed)
        return game

    def _play(self, episode: Episode, steps: tuple[int, ...]) -> tuple[float, str]:
        """Play low-level ``steps`` until one has no effect or the level ends (as AgentGym does);
        the reward and why the level ended ("" while it goes on)."""
        game, reward = episode.game, 0.0
        for step in steps:
            before = effect_state(game)
            _, step_reward, terminated, truncated, _ = game.step(step)
            reward += float(step_reward)
            if terminated or truncated:
                return reward, ("won" if step_reward > 0 else "failed") if terminated else "out of steps"
            self._advise(episode, step)
            if effect_state(game) == before:
                break
        return reward, ""

    @staticmethod
    def _advise(episode: Episode, step: int | None) -> None:
        """Tell the bot which low-level action was played (None: none yet) and keep its next one."""
        if episode.bot is None:
            return
        episode.bot.stack.pushes = 0
        try:
            episode.suggestion = episode.bot.replan(step)
        except Exception:  # the bot's own asserts and DisappearedBoxError: it cannot help from here
            episode.bot, episode.suggestion = None, None

    def _text(self, episode: Episode, ending: str) -> str:
        view = episode.view
        if ending == "won":
            return f"{view.description}\nThe task is completed."
        if ending == "failed":
            return f"{view.description}\nThe task failed: that went against your goal ({episode.game.mission})."
        if ending:
            steps = episode.game.max_steps
            return f"{view.description}\nYou ran out of steps ({steps}): the task is not completed."
        return f"{view.description}\n{view.action_list()}"

    def _info(self, episode: Episode, invalid: bool) -> dict[str, Any]:
        won = not episode.running and episode.reward > 0
        return {
            "won": won,
            "score": clip01(episode.reward),
            "invalid": invalid,
            "level": episode.level,
            "seed": episode.seed,
        }


#: one env per level, built once so that every registry lookup returns the same class
LEVEL_ENVS = {
    level: env_variant(
        BabyAIEnv,
        f"BabyAI{level}Env",
        f"BabyAI level {level} (AgentGym's level {number}) as text (pip install 'omrl[babyai]')."
        + (" " + shared_boards_note(SHARED_BOARDS[level]) if level in SHARED_BOARDS else ""),
        level=level,
    )
    for number, level in enumerate(LEVELS, start=1)
}


@hookimpl
def register_envs(register):
    register("babyai", BabyAIEnv)
    for level, env_class in LEVEL_ENVS.items():
        register(f"babyai:{level}", env_class)
