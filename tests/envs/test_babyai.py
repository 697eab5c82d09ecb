"""The ``babyai`` envs on the real minigrid package: expert episodes to a win, AgentGym's text,
invalid actions, registration without importing minigrid, snapshot/restore, and `omrl eval`."""

from __future__ import annotations

import random
import subprocess
import sys

import gymnasium
import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
import pytest

from omrl import registry
from omrl.envs import EnvError, EpisodeFinishedError, UnknownTaskError, create_env, fork_support
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.babyai import LEVEL_ENVS, LEVELS, BabyAIEnv, gym_id
from omrl_plugins.envs.engines.babyai_text import shortest_path
from omrl_plugins.envs.engines.common import MissingExtraError
from tests.helpers import eval_two_tasks, play_expert

# levels minigrid's BabyAIBot solves, from one room to the boss level
EXPERT_LEVELS = [
    "GoToRedBall",
    "OpenRedDoor",
    "PickupLoc",
    "PutNextLocalS6N4",
    "UnlockLocalDist",
    "BlockedUnlockPickup",
    "KeyCorridorS6R3",
    "BossLevel",
]


def test_levels_are_agentgyms_forty_and_all_exist_in_minigrid():
    assert len(LEVELS) == len(set(LEVELS)) == 40
    assert LEVELS[0] == "GoToRedBallGrey" and LEVELS[39] == "BossLevelNoUnlock"  # AgentGym's levels 1 and 40
    missing = [level for level in LEVELS if gym_id(level) not in gymnasium.envs.registry]
    assert missing == []


@pytest.mark.parametrize("level", EXPERT_LEVELS)
def test_expert_wins_with_minigrids_reward(level):
    env = create_env(LEVEL_ENVS[level])
    for task_id in list(env.task_ids("test"))[:2]:
        results = play_expert(env, task_id, admissible=True)
        final = results[-1]
        game = env._episode.game
        assert game.step_count == len(results)  # the expert plays one low-level action per turn
        steps, max_steps = game.step_count, game.max_steps
        assert final.won and final.score == pytest.approx(1 - 0.9 * steps / max_steps)
        assert final.reward == final.score and all(r.reward == 0 for r in results[:-1])
        assert all(not r.won and r.score == 0 and r.info["invalid"] is False for r in results[:-1])
        assert final.observation.endswith("The task is completed.")
        with pytest.raises(EpisodeFinishedError):
            env.step("turn left")
        assert env.expert_action() is None and env.admissible_actions() is None


def test_family_uses_agentgyms_numbering_and_text():
    env = BabyAIEnv()
    assert list(env.task_ids("test")) == list(range(400))
    assert env.level_and_seed(1) == ("GoToRedBall", 0) and env.level_and_seed(161) == ("GoToRedBall", 4)
    assert env.level_and_seed(39) == ("BossLevelNoUnlock", 0)
    first = env.reset(161)
    game = env._episode.game
    assert first.instruction == f"Your goal: {game.mission}" == "Your goal: go to the red ball"
    seeing = "\nIn front of you in this room, you can see several objects: "
    assert first.text.startswith(first.instruction + seeing)
    assert "There is a red ball 1 " in first.text and "You are not carrying anything." in first.text
    assert first.info == {"won": False, "score": 0.0, "invalid": False, "level": "GoToRedBall", "seed": 4}
    actions = env.admissible_actions()
    assert actions[:2] == ["turn left", "turn right"] and actions[-1] == "check available actions"
    assert first.text.endswith("Available actions: [" + ", ".join(f'"{a}"' for a in actions) + "]")
    # a macro action plays its shortest path: it ends facing the ball (and wins this level)
    result = env.step("Go to red ball 1.")
    assert result.won and result.done and 0.1 <= result.score < 1.0
    # same task, same episode
    again = BabyAIEnv()
    assert again.reset(161).text == first.text and again.step("go to red ball 1").score == result.score


def test_a_broken_mission_and_running_out_of_steps_end_the_episode_lost():
    # OpenDoorsOrderN4Debug, seed 0: "open the purple door after you open the red door", where the
    # bot opens the purple one first, which this strict level counts as a failure
    env = create_env(LEVEL_ENVS["OpenDoorsOrderN4Debug"])
    env.reset(0)
    result = env.step(env.expert_action())
    while not result.done:
        result = env.step(env.expert_action())
    assert not result.won and result.score == 0 and "The task failed" in result.observation
    env = create_env(LEVEL_ENVS["GoToRedBall"])
    env.reset(0)
    turns = [env.step("turn left") for _ in range(64)]  # the level's max_steps
    assert [r.done for r in turns] == [False] * 63 + [True]
    assert not turns[-1].won and "You ran out of steps (64)" in turns[-1].observation


def test_expert_gives_up_where_minigrids_bot_cannot_help():
    env = create_env(LEVEL_ENVS["KeyInBox"])  # the bot refuses to open the box that holds the key
    env.reset(0)
    results = []
    while (action := env.expert_action()) is not None:
        results.append(env.step(action))
    assert len(results) < 10 and not results[-1].done
    # UnlockToUnlock, seed 4: the bot replans in a circle forever; the env stops it at its cap
    env = create_env(LEVEL_ENVS["UnlockToUnlock"])
    env.reset(4)
    env.step(env.expert_action())
    assert env.expert_action() is None and env.admissible_actions()


def test_minigrid_prints_nothing_on_our_stdout(capsys):
    BabyAIEnv().reset(6)  # GoToImpUnlock, seed 0: minigrid rejects layouts before it finds one
    assert capsys.readouterr().out == ""


def test_the_demonstration_is_what_the_env_shows():
    env = create_env(LEVEL_ENVS["GoToLocalS8N7"])
    shown = [env.reset(1002).text]
    for turn in BabyAIEnv.demonstration[:-1]:
        shown.append(env.step(turn.action).observation)
    assert shown == [turn.observation for turn in BabyAIEnv.demonstration]
    assert env.step(BabyAIEnv.demonstration[-1].action).won


def test_same_seed_same_level_on_a_level_env_and_the_family():
    level_env, family = create_env(LEVEL_ENVS["Pickup"]), BabyAIEnv()
    task = LEVELS.index("Pickup") + 40 * 3  # the family's task with seed 3
    assert level_env.reset(3).text == family.reset(task).text
    assert not set(level_env.task_ids("train")) & set(level_env.task_ids("test"))
    train_seeds = {task_id // 40 for task_id in family.task_ids("train")}
    assert not train_seeds & set(level_env.task_ids("test"))  # family train never plays a level's test seed


def test_invalid_actions_explain_and_cost_no_step():
    env = create_env(LEVEL_ENVS["GoToRedBall"])
    env.reset(0)
    game = env._episode.game
    for action, message in [
        ("fly away", "The action is not recognized"),
        ("drop", "you are not carrying anything"),
        ("", "The action is not recognized"),
        ("pickup red ball 9", "The action is not recognized"),
    ]:
        result = env.step(action)
        assert result.info["invalid"] and not result.done and result.reward == 0
        assert message in result.observation
        assert "Available actions: [" in result.observation
    assert game.step_count == 0
    checked = env.step("check available actions")
    assert not checked.info["invalid"] and game.step_count == 0
    assert checked.observation.endswith('"check available actions"]')
    # walk into the wall: "move forward" is refused there with AgentGym's words
    while "move forward" in env.admissible_actions():
        env.step("move forward")
    blocked = env.step("move forward")
    assert blocked.info["invalid"] and "barrier in front of you" in blocked.observation


def test_pick_up_carry_and_drop():
    env = create_env(LEVEL_ENVS["PickupLoc"])
    env.reset(0)
    target = next(a for a in env.admissible_actions() if a.startswith("pickup "))
    name = target.removeprefix("pickup ").rsplit(" ", 1)[0]
    picked = env.step(target.replace("pickup", "pick up"))  # the spelling models write is taken too
    assert not picked.info["invalid"] and not picked.done  # PickupLoc asks for another object
    assert f"You are carrying a {name}." in picked.observation
    assert not any(a.startswith("pickup ") for a in env.admissible_actions())
    other = next(
        a.removeprefix("go to ")
        for a in env.admissible_actions()
        if a.startswith("go to ") and a.split()[-2] in ("ball", "key", "box")
    )
    refused = env.step(f"pickup {other}")
    assert refused.info["invalid"] and f"as you are already carrying a {name}" in refused.observation
    while "drop" not in env.admissible_actions():
        env.step("turn left")
    dropped = env.step("drop")
    assert not dropped.info["invalid"] and "You are not carrying anything." in dropped.observation
    assert f"There is a {name} 1 right in front of you 1 steps away." in dropped.observation


@pytest.mark.slow  # a sweep of every macro action over 18 levels
def test_every_macro_action_does_what_it_says():
    env, copy = BabyAIEnv(), BabyAIEnv()
    rng, checked = random.Random(0), set()
    verbs = ("toggle and go through", "go through", "go to", "pickup")
    for task_id in range(0, 400, 23):
        env.reset(task_id)
        for _ in range(6):
            state = env.snapshot()
            for name, macro in env._episode.view.actions.items():
                verb = next((v for v in verbs if name.startswith(v + " ")), None)
                if verb is None:
                    continue
                copy.restore(state)
                result, game = copy.step(name), copy._episode.game
                if result.done:  # the walk there met the goal first
                    continue
                at, facing = tuple(map(int, game.agent_pos)), tuple(map(int, game.front_pos))
                done = {
                    "go to": facing == macro.target,
                    "pickup": game.carrying is not None,
                    "go through": at == macro.target,
                    "toggle and go through": at == macro.target,
                }[verb]
                assert done and not result.info["invalid"], (task_id, name, result.observation)
                checked.add(verb)
            env.step(rng.choice(env.admissible_actions()))
            if not env._episode.running:
                break
    assert checked == set(verbs)


def test_shortest_path_turns_and_walks_around_blocked_cells():
    free = {(1, 1), (2, 1), (3, 1), (3, 2)}
    # forward, forward, right, forward (minigrid's action numbers)
    assert shortest_path((1, 1), 0, (3, 2), free, arrive=True) == (2, 2, 1, 2)
    assert shortest_path((1, 1), 0, (3, 3), free, arrive=False) == (2, 2, 1, 2)  # ends facing (3, 3)
    assert shortest_path((1, 1), 0, (5, 5), free, arrive=True) is None
    assert shortest_path((1, 1), 0, (2, 1), free, arrive=False) == ()


def test_snapshot_restores_a_copy_that_steps_alike_and_shares_nothing():
    env_class = LEVEL_ENVS["UnlockLocalDist"]
    env, other = create_env(env_class), create_env(env_class)
    assert fork_support(env) == "snapshot" and env.deterministic
    env.reset(5)
    for _ in range(4):
        env.step(env.expert_action())
    state = env.snapshot()
    other.restore(state)
    assert other.admissible_actions() == env.admissible_actions()
    assert other._episode.game is not env._episode.game and other._episode.bot is not env._episode.bot
    assert other._episode.bot.mission is other._episode.game  # the copied bot advises on the copied game
    assert other._episode.view.actions is not env._episode.view.actions
    # both play on alike to the end, and playing one leaves the other and the snapshot as they were
    mine = [env.step(env.expert_action()) for _ in range(3)]
    assert state.game.step_count == 4 and other._episode.game.step_count == 4
    theirs = [other.step(other.expert_action()) for _ in range(3)]
    assert [(r.observation, r.reward, r.done, r.info) for r in mine] == [
        (r.observation, r.reward, r.done, r.info) for r in theirs
    ]
    assert state.game.step_count == 4 and state.game.agent_pos is not other._episode.game.agent_pos
    other.restore(state)  # a snapshot restores any number of times
    assert other._episode.game.step_count == 4
    with pytest.raises(EnvError, match="not a dict"):
        other.restore({})
    with pytest.raises(EnvError, match="of level UnlockLocalDist, not GoToRedBall"):
        create_env(LEVEL_ENVS["GoToRedBall"]).restore(state)


def test_bad_options_and_task_ids_name_what_is_valid():
    with pytest.raises(ConfigError, match="unknown level 'GoToRedBal'; did you mean GoToRedBall"):
        BabyAIEnv(level="GoToRedBal")
    assert BabyAIEnv(level="BabyAI-GoToRedBall-v0").name == "babyai:GoToRedBall"
    with pytest.raises(UnknownTaskError, match="valid: test 0..399, train 40000..79999"):
        BabyAIEnv().reset(400)
    with pytest.raises(UnknownTaskError, match="valid: test 0..99, train 1000..100999"):
        create_env(LEVEL_ENVS["Open"]).reset(-1)
    with pytest.raises(UnknownTaskError, match="no split 'dev'"):
        BabyAIEnv().task_ids("dev")
    with pytest.raises(ConfigError, match="does not take options \\['level'\\]"):
        create_env(LEVEL_ENVS["Open"], {"level": "Pickup"}, "babyai:Open")


def test_a_missing_minigrid_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "minigrid", None)  # makes `import minigrid` fail
    with pytest.raises(MissingExtraError, match="pip install 'omrl\\[babyai\\]'"):
        BabyAIEnv()


def test_every_level_is_registered_without_importing_minigrid():
    script = (
        "import sys; from omrl import registry; names = registry.envs.names(); "
        "cls = registry.envs.get('babyai:GoToRedBall'); "
        "print(sorted(n for n in names if n.startswith('babyai')), cls.package, cls.extra, "
        "'minigrid' in sys.modules, 'gymnasium' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    names = sorted(["babyai"] + [f"babyai:{level}" for level in LEVELS])
    assert out.strip() == f"{names} minigrid babyai False False"
    assert registry.envs.get("babyai") is BabyAIEnv
    assert all(registry.envs.get(f"babyai:{level}") is LEVEL_ENVS[level] for level in LEVELS)


def test_eval_plays_a_level_by_its_name(tmp_path):
    data = eval_two_tasks("babyai:GoToRedBall", tmp_path)
    assert data["config"]["env"]["name"] == "babyai:GoToRedBall"
