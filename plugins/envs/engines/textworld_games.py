"""Making TextWorld's games and keeping them: a difficulty, a game generated and compiled from its seed
into a cache folder, and a cached game checked before the interpreter loads it
(:mod:`omrl_plugins.envs.engines.textworld` plays them)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.envs import EnvError
from omrl.errors import ConfigError

#: the named difficulties; easy, medium and hard are settings of arXiv 2510.01132
DIFFICULTIES = {"easy": "w2-o3-q4", "medium": "w4-o6-q8", "hard": "w8-o12-q4"}
MAX_ROOMS, MAX_OBJECTS, MAX_QUEST = 20, 40, 20  # w20-o40-q20 takes TextWorld about two minutes to make
GAME_FILE, GAME_DATA = "game.z8", "game.json"  # the story file, and TextWorld's data about the game beside it
HEADER_BYTES = 64  # a Z-machine story file's header
_SETTING = re.compile(r"w(\d+)-o(\d+)-q(\d+)")
#: one game is generated at a time in a process (TextWorld's generator keeps module state)
_generation_lock = threading.Lock()


@dataclass(frozen=True)
class Difficulty:
    """What TextWorld generates: ``rooms`` rooms, at least ``objects`` objects and a quest of
    ``quest_length`` actions (tw-make's ``--world-size``, ``--nb-objects``, ``--quest-length``)."""

    rooms: int
    objects: int
    quest_length: int

    @property
    def name(self) -> str:
        return f"w{self.rooms}-o{self.objects}-q{self.quest_length}"


def parse_difficulty(difficulty: Any) -> Difficulty:
    """``easy``/``medium``/``hard`` or ``w<rooms>-o<objects>-q<quest length>`` as a Difficulty,
    or ConfigError naming the valid values."""
    match = _SETTING.fullmatch(DIFFICULTIES.get(difficulty, difficulty) if isinstance(difficulty, str) else "")
    if match:
        level = Difficulty(*map(int, match.groups()))
        if 1 <= level.rooms <= MAX_ROOMS and level.objects <= MAX_OBJECTS and 1 <= level.quest_length <= MAX_QUEST:
            return level
    raise ConfigError(
        f"textworld option difficulty: {difficulty!r} is not a difficulty; valid: {', '.join(DIFFICULTIES)}, or "
        f"w<rooms>-o<objects>-q<quest length> with 1 to {MAX_ROOMS} rooms, at most {MAX_OBJECTS} objects and a "
        f"quest of 1 to {MAX_QUEST} actions, e.g. w4-o6-q8"
    )


def game_folder(cache_dir: Path, difficulty: Difficulty, seed: int, version: str) -> Path:
    """Where the game of ``seed`` is cached: ``<cache_dir>/<textworld version>/<difficulty>/<seed>``."""
    return cache_dir / version / difficulty.name / str(seed)


def generate_game(textworld: Any, difficulty: Difficulty, seed: int, folder: Path) -> Path:
    """The game file of ``seed`` in ``folder``, generated and compiled there unless it already is.

    The game is made in a temporary folder beside ``folder`` and renamed into place: another
    process never sees half a game, and when two make the same game at once, one rename wins
    (both games are the same: TextWorld's generation depends on the seed alone).
    """
    game_file = folder / GAME_FILE
    if not cache_damage(folder):
        return game_file
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _generation_lock:
        if not cache_damage(folder):  # another thread of this process made it meanwhile
            return game_file
        discard_damaged(folder)
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            options = textworld.GameOptions()
            options.seeds, options.nb_rooms, options.nb_objects = seed, difficulty.rooms, difficulty.objects
            chaining = options.chaining
            chaining.min_length = chaining.max_length = chaining.max_depth = difficulty.quest_length
            options.path, options.file_ext = str(work / GAME_FILE), ".z8"
            try:
                game = textworld.generator.make_game(options)
            except textworld.generator.QuestGenerationError as exc:
                raise ConfigError(
                    f"textworld difficulty {difficulty.name}: TextWorld found no quest of {difficulty.quest_length} "
                    f"actions in a world of {difficulty.rooms} rooms and {difficulty.objects} objects (seed {seed}); "
                    "add rooms or objects, or shorten the quest"
                ) from exc
            try:
                textworld.generator.compile_game(game, options)
            except Exception as exc:  # Inform 7's compilers failed (CouldNotCompileGameError, OSError)
                raise EnvError(
                    f"textworld: compiling the game of seed {seed} ({difficulty.name}) failed: {exc}"
                ) from exc
            (work / "game.ni").unlink(missing_ok=True)  # the Inform 7 source: not needed to play
            if cache_damage(work):
                raise EnvError(f"textworld: the game compiled for seed {seed} is damaged: {cache_damage(work)}")
            try:
                os.rename(work, folder)
            except OSError:
                if not game_file.is_file():  # not another process's finished game in the way
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return game_file


def cache_damage(folder: Path) -> str | None:
    """What is wrong with the game cached in ``folder``, or None: frotz ends the process on a story file shorter
    than its Z-machine header says (byte 0: the version, 1-8; bytes 26-27: the length in units of 2, 4 or 8)."""
    try:
        json.loads((folder / GAME_DATA).read_text(encoding="utf-8"))
        story = (folder / GAME_FILE).read_bytes()
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"
    version = story[0] if len(story) >= HEADER_BYTES else 0
    if not 1 <= version <= 8:
        return f"{GAME_FILE} is no Z-machine story ({len(story)} bytes)"
    length = int.from_bytes(story[26:28], "big") * (2 if version <= 3 else 4 if version <= 5 else 8)
    return None if HEADER_BYTES <= length <= len(story) else f"{GAME_FILE} holds {len(story)} of its {length} bytes"


def discard_damaged(folder: Path) -> None:
    """Move a damaged cached game aside, atomically (another process may be looking at it), and delete it."""
    if folder.exists():
        warnings.warn(f"textworld: making the damaged game in {folder} again: {cache_damage(folder)}", stacklevel=2)
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-damaged-", dir=folder.parent))
        with contextlib.suppress(FileNotFoundError):  # another process moved it first
            os.rename(folder, aside / folder.name)
        shutil.rmtree(aside, ignore_errors=True)
