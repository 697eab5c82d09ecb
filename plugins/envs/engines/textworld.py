"""``textworld``: Microsoft TextWorld's generated text adventures (PyPI ``textworld``), made offline.

Install with ``pip install 'omrl[textworld]'``. Each task is a game that TextWorld generates from a seed, as
``tw-make custom --world-size W --nb-objects O --quest-length Q --seed S`` does, and compiles with the Inform 7
compiler it ships. Envs:

- ``textworld``: the family; the option ``difficulty`` picks the games.
- ``textworld:<difficulty>`` for the named ones: ``textworld:easy`` (``w2-o3-q4``), ``textworld:medium``
  (``w4-o6-q8``), ``textworld:hard`` (``w8-o12-q4``), and the settings of Wang and Ammanabrolu's study
  (arXiv 2510.01132) by name: ``textworld:w2-o3-q4``, ``textworld:w8-o3-q4``, ``textworld:w2-o12-q4``,
  ``textworld:w8-o12-q4``, ``textworld:w4-o6-q8``.

Options (config block ``plugins.textworld``; ``plugins.textworld:easy`` and so on for a named one):

- ``difficulty`` (the family only): ``easy`` (default), ``medium``, ``hard``, or ``w<rooms>-o<objects>-q<quest
  length>`` (``w4-o6-q8``: 4 rooms, at least 6 objects, a quest of 8 actions); at most ``w20-o40-q20`` (about
  two minutes to generate: the time grows fast, and without a bound never ends).
- ``reward``: ``points`` (default): the game's own score, normalized by its maximum (a generated game has one
  quest worth 1 point, so it is 1 on the win and 0 before); ``progress``: dense, how much of the way to the win
  the agent has come, ``1 - remaining / initial`` steps of the game's winning policy (TextWorld's quest
  tracking), which falls when the agent strays. ``score`` is the same quantity and the step rewards are its
  changes: they sum to the score.
- ``show_commands`` (false): end every observation with the admissible commands.
- ``max_turns`` (0: three times the quest length, the turn caps of arXiv 2510.01132's main tables: 12 for
  ``w2-o3-q4``, 24 for ``w4-o6-q8``).
- ``cache_dir`` (``$OMRL_HOME/textworld`` by default).

Task ids are the seeds: ``train`` 0..99,999, ``test`` 1,000,000..1,000,499. A game is generated on its first
``reset`` (about a second for small worlds) and kept under ``<cache_dir>/<textworld version>/<difficulty>/<seed>/``;
later resets, in any process, load it. Generation writes into a temporary folder beside that one and renames it
into place, so two processes that generate the same game at once each finish and one of the two identical games
stays. A damaged cached game (a story file shorter than its header says, unreadable game data) is made again:
the interpreter would end the whole process on it.

The first observation is the game's introduction (its goal) and the first room, without the banner; the
instruction is the goal. ``info`` carries ``admissible_commands`` (as ``admissible_actions()`` returns them),
``points`` and ``max_points`` (the game's score), ``progress``, the ``difficulty`` and the ``seed``. A command
that is not one of the admissible commands is ``invalid`` (the game still gets it: it may understand ``n`` for
``go north``). Never sent to the game, and ``invalid``: the interpreter's own commands (``quit``, ``restart``,
``save``, ``restore``, ``undo``, ``script``...) as any sentence of the command (Inform plays ``look. restart``
as two commands), a sentence starting with ``\\`` (the interpreter's meta-commands: ``\\boxed{...}`` hangs it)
and control characters (a NUL crashes it). ``won`` when the quest is completed; an episode ends on a win or a
loss, and otherwise when the rollout's turn cap (``max_turns``) is reached.

Expert: the next command of the game's winning policy from where the agent stands (TextWorld's walkthrough at
the start, re-planned after every step), so it wins from any position. Episodes depend on (task, actions) alone:
tree search copies them by replay.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.envs import Env, Observation, StepResult, env_variant
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.common import RangeSplits, check_running, clean_action, clip01, require
from omrl_plugins.envs.engines.textworld_games import DIFFICULTIES, game_folder, generate_game, parse_difficulty

#: the settings of arXiv 2510.01132 (Table 1), each also registered as ``textworld:<setting>``
STUDY_SETTINGS = ("w2-o3-q4", "w8-o3-q4", "w2-o12-q4", "w8-o12-q4", "w4-o6-q8")
SPLITS = {"train": range(0, 100_000), "test": range(1_000_000, 1_000_500)}
REWARDS = ("points", "progress")
#: the interpreter's commands, never sent to the game: they would restart or end it behind TextWorld's
#: back (its quest tracking would go on from the old state) or write save and transcript files
INTERPRETER_COMMANDS = frozenset("quit q restart save restore undo script transcript unscript noscript".split())
_SENTENCES = re.compile(r"[.,;]|\bthen\b")  # Inform plays each sentence of a line as a command
_LETTER_OR_DIGIT = re.compile(r"[A-Za-z0-9]")
_PROMPT = re.compile(r"(?:\A|\n)>[^\n]*\Z")  # the parser's prompt and the status line after the text
_AFTER_THE_END = re.compile(r"\n*Would you like to RESTART[^\n]*\Z")  # the interpreter's, once the game is over
_BLANK_LINES = re.compile(r"\n\s*\n(\s*\n)+")


def clean_feedback(text: str) -> str:
    """The game's text without its banner (leading lines of no letter or digit), the parser's
    prompt and status line at the end, the interpreter's restart question after the end, and runs
    of blank lines."""
    lines = (text or "").split("\n")
    while lines and not _LETTER_OR_DIGIT.search(lines[0]):
        lines.pop(0)
    text = _AFTER_THE_END.sub("", _PROMPT.sub("", "\n".join(lines)))
    return _BLANK_LINES.sub("\n\n", text).strip()


def refusal(command: str) -> str | None:
    """Why ``command`` must never reach the game, or None: a control character (the C interpreter crashes or hangs
    on one), or as any sentence an interpreter's command or a ``\\`` meta-command (it loops on an unknown one)."""
    if not command.isprintable():
        return "A command is plain text: that one holds a control character."
    for first in (sentence.split()[0] for sentence in _SENTENCES.split(command) if sentence.strip()):
        if first in INTERPRETER_COMMANDS or first.startswith("\\"):
            return f"{first!r} is a command of the game's interpreter, not of the game."
    return None


@dataclass
class LiveGame:
    """The live game: its identity, the admissible commands and the winning policy now, the score."""

    seed: int
    commands: list[str]
    policy: list[str]
    initial_policy: int
    points: int = 0
    max_points: int = 1
    score: float = 0.0
    running: bool = True


class TextWorldEnv(RangeSplits, Env):
    """TextWorld's generated text adventures by difficulty, e.g. w4-o6-q8 (pip install 'omrl[textworld]')."""

    split_ranges = SPLITS
    splits_name = "textworld"
    action_help = (
        "One command per turn, e.g. go north, open door, take key, take key from box, "
        "unlock chest with key, put apple on table, insert apple into box, examine box, look, inventory."
    )
    action_example = "go north"
    max_turns = 12  # easy's; an instance's own is three times its quest length
    deterministic = True
    splits = tuple(SPLITS)
    package = "textworld"
    extra = "textworld"

    def __init__(
        self,
        difficulty: str = "easy",
        reward: str = "points",
        show_commands: bool = False,
        max_turns: int = 0,
        cache_dir: str = "",
    ):
        self.difficulty = parse_difficulty(difficulty)
        if reward not in REWARDS:
            raise ConfigError(f"textworld option reward: unknown reward {reward!r}; valid: {', '.join(REWARDS)}")
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 0:
            raise ConfigError(
                f"textworld option max_turns: {max_turns!r} is not a turn count; valid: 0 (three times the "
                "quest length) or a positive whole number"
            )
        if not isinstance(show_commands, bool):
            raise ConfigError(f"textworld option show_commands: {show_commands!r}; valid: true or false")
        self.reward, self.show_commands = reward, show_commands
        self.max_turns = max_turns or 3 * self.difficulty.quest_length  # type: ignore[misc]  # per instance
        self._cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self._textworld = require("textworld", "textworld", self.extra)
        require("textworld.generator", "textworld", self.extra)
        self._infos = self._textworld.EnvInfos(
            admissible_commands=True, policy_commands=True, objective=True, max_score=True, won=True, lost=True
        )
        self._game: Any = None  # TextWorld's environment, reused from game to game
        self._episode: LiveGame | None = None

    @property
    def cache_dir(self) -> Path:
        """The folder of generated games (``$OMRL_HOME/textworld`` unless the option says otherwise)."""
        if self._cache_dir is None:
            from omrl.home import omrl_home

            self._cache_dir = omrl_home() / "textworld"
        return self._cache_dir

    def game_file(self, task_id: int) -> Path:
        """The game of ``task_id`` (its seed), generated into the cache unless it is there."""
        self.check_task_id(task_id)
        folder = game_folder(self.cache_dir, self.difficulty, task_id, self._textworld.__version__)
        return generate_game(self._textworld, self.difficulty, task_id, folder)

    def reset(self, task_id: int) -> Observation:
        path = str(self.game_file(task_id))
        self._episode = None
        with warnings.catch_warnings():
            # jericho knows TextWorld's games as "not fully supported" (it cannot read their score);
            # TextWorld's own wrappers read it from the game's text
            warnings.filterwarnings("ignore", message=".*is not fully supported", module="jericho")
            if self._game is None:
                self._game = self._textworld.start(path, request_infos=self._infos)
            else:
                self._game.load(path)
            state = self._game.reset()
        policy = list(state["policy_commands"] or [])
        episode = LiveGame(task_id, list(state["admissible_commands"]), policy, len(policy))
        episode.max_points = int(state["max_score"] or 1)
        self._episode = episode
        objective = str(state["objective"] or "").strip()
        return Observation(self._text(state["feedback"], episode), objective, self._info(episode, invalid=False))

    def step(self, action: str) -> StepResult:
        episode = self._episode
        check_running("textworld", episode is not None and episode.running)
        assert episode is not None
        command = clean_action(action)
        if refused := refusal(command):
            return StepResult(self._text(refused, episode), 0.0, False, self._info(episode, invalid=True))
        invalid = command not in {c.lower() for c in episode.commands}
        state, points, done = self._game.step(command)
        episode.commands = list(state["admissible_commands"] or [])
        episode.policy = list(state["policy_commands"] or [])
        episode.points = int(points or 0)
        won, lost = bool(state["won"]), bool(state["lost"])
        before, episode.score = episode.score, self._score(episode, won)
        episode.running = not (done or won or lost)
        info = self._info(episode, invalid=invalid, won=won, lost=lost)
        return StepResult(self._text(state["feedback"], episode), episode.score - before, not episode.running, info)

    def admissible_actions(self) -> list[str] | None:
        episode = self._episode
        return list(episode.commands) if episode is not None and episode.running else None

    def expert_action(self) -> str | None:
        """The next command of the game's winning policy from here; None when there is none."""
        episode = self._episode
        return episode.policy[0] if episode is not None and episode.running and episode.policy else None

    def close(self) -> None:
        game, self._game = self._game, None
        self._episode = None
        if game is not None:
            game.close()

    def progress(self, episode: LiveGame, won: bool) -> float:
        """How much of the winning policy is behind the agent: 1 on a win, 0 where no way to win is left."""
        if won or not episode.policy or not episode.initial_policy:
            return 1.0 if won else 0.0
        return clip01(1.0 - len(episode.policy) / episode.initial_policy)

    def _score(self, episode: LiveGame, won: bool) -> float:
        return self.progress(episode, won) if self.reward == "progress" else clip01(episode.points / episode.max_points)

    def _text(self, feedback: str, episode: LiveGame) -> str:
        text = clean_feedback(feedback)
        if self.show_commands and episode.running and episode.commands:
            text = f"{text}\nAdmissible commands: {', '.join(episode.commands)}"
        return text

    def _info(self, episode: LiveGame, invalid: bool, won: bool = False, lost: bool = False) -> dict[str, Any]:
        return {
            "won": won,
            "score": episode.score,
            "invalid": invalid,
            "lost": lost,
            "points": episode.points,
            "max_points": episode.max_points,
            "progress": self.progress(episode, won),
            "admissible_commands": list(episode.commands) if episode.running else [],
            "difficulty": self.difficulty.name,
            "seed": episode.seed,
        }


def _difficulty_env(name: str) -> type[Env]:
    level = parse_difficulty(name)
    variant = env_variant(
        TextWorldEnv,
        f"TextWorld_{name.replace('-', '_')}",
        f"TextWorld {name}: generated games of {level.rooms} rooms, at least {level.objects} objects and a "
        f"quest of {level.quest_length} actions (pip install 'omrl[textworld]').",
        difficulty=name,
    )
    variant.max_turns = 3 * level.quest_length  # what `omrl env list` shows
    return variant


#: one env per named difficulty and study setting, built once so every registry lookup returns the same class
DIFFICULTY_ENVS = {name: _difficulty_env(name) for name in (*DIFFICULTIES, *STUDY_SETTINGS)}


@hookimpl
def register_envs(register):
    register("textworld", TextWorldEnv)
    for name, env_class in DIFFICULTY_ENVS.items():
        register(f"textworld:{name}", env_class)
