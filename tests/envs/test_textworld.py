"""The ``textworld`` envs on the real textworld package: small games generated into a temporary cache,
the walkthrough expert winning with the game's rewards, the cache reused (and safe to race), seeds,
splits, clear option errors, and an expert rollout through the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import textworld
import textworld.generator

from omrl import registry
from omrl.data import read_episodes
from omrl.envs import (
    EnvError,
    EpisodeFinishedError,
    UnknownTaskError,
    create_env,
    fork_support,
    reset_problem,
    step_problem,
)
from omrl.errors import ConfigError
from omrl_plugins.envs.engines import textworld as textworld_plugin
from omrl_plugins.envs.engines.common import MissingExtraError
from omrl_plugins.envs.engines.textworld import DIFFICULTY_ENVS, SPLITS, TextWorldEnv, clean_feedback
from omrl_plugins.envs.engines.textworld_games import GAME_FILE, Difficulty, cache_damage, generate_game
from tests.helpers import cli_exit, fresh_python_json, play_expert

TINY = "w1-o2-q3"  # one room, a quest of three actions: generated in about a second


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One game cache for the module: each tiny game is generated once."""
    return tmp_path_factory.mktemp("textworld-games")


def tiny(cache, **options):
    return TextWorldEnv(difficulty=TINY, cache_dir=str(cache), **options)


@pytest.fixture
def textworld_registered(register_plugin):
    """The module's envs in the registry (the entry point registers them once the package lists it)."""
    from omrl.plugins import load_plugins

    if not load_plugins().is_registered(textworld_plugin):
        register_plugin(textworld_plugin, name="omrl.envs.textworld")


def test_the_expert_wins_with_the_games_progress_as_intermediate_rewards(cache):
    env = tiny(cache, reward="progress")
    first = env.reset(SPLITS["test"][0])
    assert reset_problem(first) is None
    assert first.info["admissible_commands"] == env.admissible_actions() and "look" in env.admissible_actions()
    results = play_expert(env, SPLITS["test"][0], admissible=True)
    assert all(step_problem(r) is None for r in results)
    assert len(results) == 3  # the quest's length: the walkthrough
    assert [r.reward for r in results] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert [r.score for r in results] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [r.won for r in results] == [False, False, True] and [r.done for r in results] == [False, False, True]
    final = results[-1]
    assert final.info["points"] == final.info["max_points"] == 1 and final.info["admissible_commands"] == []
    assert "*** The End ***" in final.observation and "RESTART" not in final.observation
    assert env.expert_action() is None and env.admissible_actions() is None
    with pytest.raises(EpisodeFinishedError):
        env.step("look")


def test_points_reward_the_game_score_on_the_win(cache):
    env = tiny(cache)  # reward=points
    results = play_expert(env, SPLITS["test"][0])
    assert [r.reward for r in results] == [0.0, 0.0, 1.0] and [r.score for r in results] == [0.0, 0.0, 1.0]
    assert [r.info["progress"] for r in results] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert results[-1].won


def test_observations_are_the_games_text_without_banner_or_prompt(cache):
    env = tiny(cache)
    first = env.reset(SPLITS["test"][0])
    assert first.instruction and first.text.startswith(first.instruction)  # the game's introduction: its goal
    assert "$$" not in first.text and "-= " in first.text  # no banner; the first room's title
    assert not first.text.rstrip().endswith(">") and "/1" not in first.text.splitlines()[-1]
    assert first.info["difficulty"] == TINY and first.info["seed"] == SPLITS["test"][0]
    looked = env.step("look")
    assert not looked.info["invalid"] and looked.reward == 0 and not looked.done
    refused = env.step("Fly  AWAY")
    assert refused.info["invalid"] and refused.observation == "That's not a verb I recognise."
    assert not refused.done and refused.info["admissible_commands"] == env.admissible_actions()
    for command in ["quit", "Restart", "save game", "restore", "undo", "script on"]:  # the interpreter's
        refused = env.step(command)
        assert refused.info["invalid"] and "a command of the game's interpreter, not of the game" in refused.observation
    assert not list(Path.cwd().glob("*.qzl")) and env.step("look").observation == looked.observation
    shown = tiny(cache, show_commands=True).reset(SPLITS["test"][0])
    assert shown.text.endswith("\nAdmissible commands: " + ", ".join(first.info["admissible_commands"]))


def test_the_interpreters_commands_are_refused_in_any_sentence_of_a_command(cache, tmp_path, monkeypatch):
    """Inform plays ``look. restart`` as two commands: the restart would go on behind TextWorld's back."""
    monkeypatch.chdir(tmp_path)  # where save and script would write their files
    env = tiny(cache)
    env.reset(SPLITS["test"][0])
    looked = env.step("look").observation
    for command in ["look. restart", "look, save", "look; script", "look then quit", "look.undo", "Look. Then RESTORE"]:
        refused = env.step(command)
        assert refused.info["invalid"] and not refused.done, command
        assert refused.observation.endswith("is a command of the game's interpreter, not of the game."), command
    assert env.step("yes").info["invalid"]  # no restart question was asked
    assert list(tmp_path.iterdir()) == [] and env.step("look").observation == looked
    results = [env.step(env.expert_action()) for _ in range(3)]
    assert results[-1].won and [r.score for r in results] == [0.0, 0.0, 1.0]  # TextWorld's tracking still holds


@pytest.mark.parametrize(
    "command",
    ["look\x00quit", "\x00", "look\x7f", "\\boxed{go south}", "\\ quit", "look. \\boxed{take key}", "look then \\x"],
)
def test_control_characters_and_meta_commands_are_refused(command):
    assert textworld_plugin.refusal(command) is not None


@pytest.mark.parametrize("command", ["look", "take key from box", "go north. take key", "put the apple on the table"])
def test_ordinary_commands_pass(command):
    assert textworld_plugin.refusal(command) is None


@pytest.mark.slow  # a fresh process, where a command that reaches the interpreter crashes or hangs it
def test_commands_that_crash_or_hang_the_interpreter_are_invalid_actions(cache, tmp_path):
    code = textwrap.dedent(
        f"""
        import json, sys
        from omrl_plugins.envs.engines.textworld import TextWorldEnv
        env = TextWorldEnv(difficulty={TINY!r}, cache_dir={str(cache)!r})
        env.reset({SPLITS["test"][0]})
        looked = env.step("look").observation
        results = []
        for action in ["look\\x00quit", "\\x00", "\\\\boxed{{go south}}", "  \\\\boxed{{42}}"]:
            result = env.step(action)
            results.append([result.info["invalid"], result.done, result.observation])
        results.append(env.step("look").observation == looked)
        open(sys.argv[1], "w").write(json.dumps(results))
        """
    )
    out = tmp_path / "results.json"
    ran = subprocess.run(  # stdout to /dev/null: an interpreter in a meta-command loop floods it
        [sys.executable, "-c", code, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60
    )
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    *refused, same_game = json.loads(out.read_text())
    assert [(invalid, done) for invalid, done, _ in refused] == [(True, False)] * 4
    assert refused[0][2] == "A command is plain text: that one holds a control character."
    assert refused[2][2] == "'\\\\boxed{go' is a command of the game's interpreter, not of the game."
    assert same_game


def test_the_expert_replans_after_a_detour(cache):
    env = TextWorldEnv(difficulty="w2-o2-q3", cache_dir=str(cache), reward="progress")
    env.reset(SPLITS["train"][0])  # the quest is in the first room, beside the way to the other
    first = env.step(env.expert_action())
    away = next(c for c in env.admissible_actions() if c.startswith("go ") and c != env.expert_action())
    result = env.step(away)
    assert first.score == pytest.approx(1 / 3) and result.reward == pytest.approx(-1 / 3)  # further from the win
    assert result.score == 0 and env.expert_action().startswith("go ")  # the way back first
    while not result.done:
        result = env.step(env.expert_action())
    assert result.won and result.score == 1.0


def test_a_second_env_loads_the_cached_game_without_generating(cache, monkeypatch):
    seed = SPLITS["train"][1]
    first = tiny(cache).reset(seed)
    game_file = cache / textworld.__version__ / TINY / str(seed) / GAME_FILE
    made = game_file.stat().st_mtime_ns

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached game was generated again")

    monkeypatch.setattr(textworld.generator, "make_game", no_generation)
    again = tiny(cache).reset(seed)
    assert again.text == first.text and game_file.stat().st_mtime_ns == made
    assert sorted(p.name for p in game_file.parent.iterdir()) == ["game.json", "game.z8"]
    assert [p.name for p in game_file.parent.parent.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_game_another_process_finished_first_is_kept(tmp_path, monkeypatch):
    """Two processes generate the same game at once: the one that renames second keeps the first's."""
    folder = tmp_path / "w1-o1-q1" / "7"
    real_compile = textworld.generator.compile_game

    def compile_while_another_finishes(game, options):
        path = real_compile(game, options)
        folder.mkdir(parents=True)
        (folder / GAME_FILE).write_text("the other process's game")
        (folder / "game.json").write_text("{}")
        return path

    monkeypatch.setattr(textworld.generator, "compile_game", compile_while_another_finishes)
    game_file = generate_game(textworld, Difficulty(1, 1, 1), 7, folder)
    assert game_file == folder / GAME_FILE and game_file.read_text() == "the other process's game"
    assert sorted(p.name for p in tmp_path.joinpath("w1-o1-q1").iterdir()) == ["7"]  # our temp folder is gone


def story(version: int, length_units: int, size: int) -> bytes:
    """A Z-machine story file's bytes: its header says ``version`` and a length of ``length_units``."""
    header = bytes([version]) + bytes(25) + length_units.to_bytes(2, "big")
    return (header + bytes(size))[:size]


@pytest.mark.parametrize(
    "data, game, damage",
    [
        (b"{}", story(8, 100, 800), None),  # version 8: 100 units of 8 bytes
        (b"{}", story(8, 100, 1024), None),  # padded past its length, as Inform pads
        (b"{}", story(3, 100, 200), None),  # version 3: units of 2 bytes
        (b"{}", story(8, 100, 799), "game.z8 holds 799 of its 800 bytes"),  # truncated
        (b"{}", story(5, 100, 399), "game.z8 holds 399 of its 400 bytes"),
        (b"{}", b"", "game.z8 is no Z-machine story \\(0 bytes\\)"),  # empty
        (b"{}", story(8, 100, 40), "game.z8 is no Z-machine story \\(40 bytes\\)"),  # shorter than a header
        (b"{}", story(0, 100, 800), "game.z8 is no Z-machine story \\(800 bytes\\)"),
        (b"{}", story(8, 0, 800), "game.z8 holds 800 of its 0 bytes"),
        (b"{", story(8, 100, 800), "it cannot be read \\(Expecting"),  # game.json cut
        (None, story(8, 100, 800), "it cannot be read \\(.*No such file"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_damaged_cached_game_is_named(tmp_path, data, game, damage):
    if data is not None:
        (tmp_path / "game.json").write_bytes(data)
    (tmp_path / GAME_FILE).write_bytes(game)
    found = cache_damage(tmp_path)
    assert found is None if damage is None else re.fullmatch(damage + ".*", found), found


@pytest.mark.parametrize("damage", ["truncated", "empty", "cut data"])
def test_a_damaged_cached_game_is_made_again_before_the_interpreter_sees_it(cache, tmp_path, damage):
    """frotz ends the whole process on a truncated story file; a cache shared by every run must not keep one."""
    seed = SPLITS["test"][0]
    made = tiny(cache).game_file(seed)
    folder = tmp_path / textworld.__version__ / TINY / str(seed)
    folder.mkdir(parents=True)
    good = made.read_bytes()
    (folder / "game.json").write_text(made.with_name("game.json").read_text())
    (folder / GAME_FILE).write_bytes({"truncated": good[: len(good) // 2], "empty": b""}.get(damage, good))
    if damage == "cut data":
        (folder / "game.json").write_text("{")
    env = tiny(tmp_path)
    with pytest.warns(UserWarning, match="making the damaged game in .* again"):
        game_file = env.game_file(seed)  # never reset here before the fix: frotz would end pytest
    assert game_file.read_bytes() == good and cache_damage(folder) is None
    assert env.reset(seed).text == tiny(cache).reset(seed).text and env.step("look").observation
    assert [p.name for p in folder.parent.iterdir()] == [str(seed)]  # nothing left aside


def test_a_freshly_compiled_game_that_is_damaged_is_an_env_error(tmp_path, monkeypatch):
    def compile_cut(game, options):
        Path(options.path).write_bytes(story(8, 100, 500))
        Path(options.path).with_suffix(".json").write_text("{}")

    monkeypatch.setattr(textworld.generator, "compile_game", compile_cut)
    with pytest.raises(EnvError, match="the game compiled for seed 0 is damaged: game.z8 holds 500 of its 800 bytes"):
        generate_game(textworld, Difficulty(1, 1, 1), 0, tmp_path / "w1-o1-q1" / "0")
    assert list((tmp_path / "w1-o1-q1").iterdir()) == []


@pytest.mark.slow
def test_a_seed_is_the_same_game_in_any_cache_and_episodes_replay(cache, tmp_path):
    seed = SPLITS["test"][0]
    here, elsewhere = tiny(cache), tiny(tmp_path)
    assert here.reset(seed).text == elsewhere.reset(seed).text
    assert (
        here.game_file(seed).with_suffix(".json").read_text()
        == elsewhere.game_file(seed).with_suffix(".json").read_text()
    )
    actions = ["look", "inventory", here.expert_action()]
    assert [here.step(a).observation for a in actions] == [elsewhere.step(a).observation for a in actions]
    other = tiny(cache).reset(SPLITS["test"][1])
    assert other.instruction != here.reset(seed).instruction
    assert fork_support(here) == "replay"


def test_splits_are_disjoint_seed_ranges_and_unknown_ids_are_named(cache):
    env = tiny(cache)
    train, test = env.task_ids("train"), env.task_ids("test")
    assert len(test) == 500 and not set(train) & set(test)
    assert max(train) < min(test)
    with pytest.raises(UnknownTaskError, match="train 0..99999, test 1000000..1000499"):
        env.reset(500_000)
    with pytest.raises(UnknownTaskError, match="no split 'dev'; valid: train, test"):
        env.task_ids("dev")


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"difficulty": "impossible"},
            "option difficulty: 'impossible' is not a difficulty; valid: easy, medium, hard, or w<rooms>-o<",
        ),
        ({"difficulty": "w0-o3-q4"}, "option difficulty: 'w0-o3-q4' is not a difficulty; .* with 1 to 20 rooms"),
        ({"difficulty": 4}, "option difficulty: 4 is not a difficulty"),
        ({"difficulty": "w100000-o1-q1"}, "'w100000-o1-q1' is not a difficulty; .* with 1 to 20 rooms, at most 40 obj"),
        ({"difficulty": "w2-o41-q4"}, "'w2-o41-q4' is not a difficulty; .* at most 40 objects and a quest of 1 to"),
        ({"difficulty": "w2-o3-q21"}, "'w2-o3-q21' is not a difficulty; .* a quest of 1 to 20 actions"),
        ({"reward": "dense"}, "textworld option reward: unknown reward 'dense'; valid: points, progress"),
        ({"max_turns": -1}, "textworld option max_turns: -1 is not a turn count; valid: 0 .* or a positive"),
        ({"show_commands": "yes"}, "textworld option show_commands: 'yes'; valid: true or false"),
        ({"seed": 3}, "options \\['seed'\\].*its options: difficulty, reward, show_commands, max_turns, cache_dir"),
    ],
)
def test_bad_options_name_the_option_and_the_valid_values(options, message):
    with pytest.raises(ConfigError, match=message):
        create_env(TextWorldEnv, options, "textworld")


def test_a_difficulty_with_no_quest_is_a_config_error(tmp_path, monkeypatch):
    def no_quest(options):
        raise textworld.generator.QuestGenerationError("no quest")

    monkeypatch.setattr(textworld.generator, "make_game", no_quest)
    with pytest.raises(ConfigError, match="w1-o1-q9: TextWorld found no quest of 9 actions .* \\(seed 0\\); add rooms"):
        TextWorldEnv(difficulty="w1-o1-q9", cache_dir=str(tmp_path)).reset(0)
    assert [p.name for p in (tmp_path / textworld.__version__ / "w1-o1-q9").iterdir()] == []


def test_named_difficulties_and_turn_caps():
    easy, medium = DIFFICULTY_ENVS["easy"](), DIFFICULTY_ENVS["medium"]()
    assert (easy.difficulty.name, easy.max_turns) == ("w2-o3-q4", 12)  # the study's caps: 3x the quest
    assert (medium.difficulty.name, medium.max_turns) == ("w4-o6-q8", 24)
    assert TextWorldEnv(difficulty="w4-o6-q8", max_turns=30).max_turns == 30
    assert DIFFICULTY_ENVS["w8-o12-q4"]().difficulty == Difficulty(8, 12, 4)
    with pytest.raises(ConfigError, match="does not take options \\['difficulty'\\]"):
        create_env(DIFFICULTY_ENVS["easy"], {"difficulty": "hard"}, "textworld:easy")


def test_clean_feedback_drops_banner_prompt_and_blank_runs():
    raw = "\n\n  ___ \n |$$| \n\nWelcome!\n\n\n\n-= Attic =-\nA room.\n\n>    -= Attic =-0/1"
    assert clean_feedback(raw) == "Welcome!\n\n-= Attic =-\nA room."


def test_registering_the_envs_imports_no_textworld():
    code = (
        "import json, sys\n"
        "from omrl_plugins.envs.engines import textworld as plugin\n"
        "names = []\n"
        "plugin.register_envs(lambda name, env_class: names.append(name))\n"
        "print(json.dumps([names, 'textworld' in sys.modules, 'torch' in sys.modules]))\n"
    )
    names, imported, torch_imported = fresh_python_json(code)
    assert names[:4] == ["textworld", "textworld:easy", "textworld:medium", "textworld:hard"]
    assert "textworld:w4-o6-q8" in names and not imported and not torch_imported


def test_a_missing_textworld_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)  # makes `import textworld` fail
    with pytest.raises(MissingExtraError, match="pip install 'omrl\\[textworld\\]'"):
        TextWorldEnv()


@pytest.mark.slow
def test_an_expert_rollout_through_the_cli_wins_every_episode(textworld_registered, cache, tmp_path, capsys):
    assert registry.envs.get("textworld:medium") is DIFFICULTY_ENVS["medium"]
    out = tmp_path / "expert.parquet"
    options = [f"plugins.textworld.difficulty={TINY}", f"plugins.textworld.cache_dir={cache}"]
    args = ["rollout", "--env", "textworld", "--model", "tiny", "--expert", "--num-tasks", "2", "-o", str(out)]
    code, said, err = cli_exit(capsys, *args, *options)
    assert code == 0, err
    episodes = read_episodes(out)
    assert len(episodes) == 2 and all(ep.won and ep.score == 1.0 and ep.num_turns == 3 for ep in episodes)
    assert [t.info["admissible_commands"] != [] for t in episodes[0].turns] == [True, True, False]
