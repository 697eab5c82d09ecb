"""Train splits clear of the test split (``engines/disjoint.py``): game boards drawn again past the test
boards, the test split as it was, and the test split's keys kept on disk for the next process."""

from __future__ import annotations

import hashlib

import pytest

from omrl import registry
from omrl.envs import create_env
from omrl_plugins.envs.engines import disjoint
from omrl_plugins.envs.engines.disjoint import content_key
from omrl_plugins.envs.engines.gem import REDRAWN_GAMES
from omrl_plugins.envs.engines.reasoning_gym import ReasoningGymEnv
from omrl_plugins.envs.engines.textarena import REDRAWN, TextArenaEnv
from tests.helpers import play_expert


@pytest.fixture(autouse=True)
def fresh_process(tmp_path, monkeypatch):
    """Each test as a new process on a new machine: no test keys in memory, none on disk."""
    monkeypatch.setenv("OMRL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(disjoint, "_TEST_KEYS", {})
    return tmp_path / "home" / "split-keys"


def gem(name):
    return create_env(registry.envs.get(f"gem:{name}"), {}, f"gem:{name}")


def digest(texts):
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


# -- the keys of a test split, on disk ------------------------------------------------------------
def test_test_keys_are_computed_once_a_machine_and_damaged_ones_again(fresh_process):
    computed = []

    def texts():
        computed.append(1)
        return ["a board", "another board"]

    keys = disjoint.test_keys("k", texts, disk=("engine", "1.0", "game"))
    assert keys == {content_key("a board"), content_key("another board")} and len(computed) == 1
    (stored,) = fresh_process.iterdir()
    disjoint._TEST_KEYS.clear()  # the next process: read from disk, not computed
    assert disjoint.test_keys("k", texts, disk=("engine", "1.0", "game")) == keys and len(computed) == 1
    disjoint._TEST_KEYS.clear()  # another version of the package computes its own
    assert disjoint.test_keys("k", texts, disk=("engine", "2.0", "game")) == keys and len(computed) == 2
    for damage in ['["a board"', "[]", '["not a key"]']:
        stored.write_text(damage)
        disjoint._TEST_KEYS.clear()
        assert disjoint.test_keys("k", texts, disk=("engine", "1.0", "game")) == keys
    assert len(computed) == 5


def test_reasoning_gym_train_questions_are_as_before_and_the_next_process_reads_the_test_keys():
    env = ReasoningGymEnv(dataset="lcm")
    train = [env.reset(task_id).text for task_id in range(100)]
    # the first 100 train questions as omrl made them before the keys were kept on disk
    assert (
        digest(train) == "f46b400d91d32c2c"
        and train[5] == "Find the Least Common Multiple (LCM) of these numbers: 60, 100"
    )
    disjoint._TEST_KEYS.clear()
    again = ReasoningGymEnv(dataset="lcm")
    assert [again.reset(task_id).text for task_id in range(100)] == train
    assert "test" not in again._datasets  # the test questions were not generated again


# -- game boards ------------------------------------------------------------------------------------
def assert_train_clear_of_test(env, own_board, recorded, redrawn_least):
    """The test boards are those omrl dealt before (``recorded``: a digest of all 500), no train board of
    the first 200 ids is one, and a train id whose own board is no test board keeps it."""
    test = [env.reset(task_id).text for task_id in range(1_000_000, 1_000_500)]
    assert digest(test) == recorded
    train = [env.reset(task_id).text for task_id in range(200)]
    own = [own_board(task_id) for task_id in range(200)]
    assert sum(board in set(test) for board in own) >= redrawn_least  # the seeds alone share that many
    assert not set(train) & set(test) and len(set(train)) > 20
    assert all(train[task_id] == own[task_id] for task_id in range(200) if own[task_id] not in set(test))
    return train, next(task_id for task_id in range(200) if own[task_id] in set(test))


@pytest.mark.parametrize(
    "game, recorded, redrawn_least",
    [
        ("FrozenLake-v0", "b5993f1d8e801442", 150),
        ("2048-v0", "bb3dc03578f4af65", 180),
        ("FrozenLake-v0-random", "e838084cc1320cff", 60),
    ],
)
def test_a_textarena_train_board_is_never_a_test_board(game, recorded, redrawn_least):
    env = TextArenaEnv(game=game)
    assert game in REDRAWN
    train, redrawn = assert_train_clear_of_test(env, lambda task_id: env._start(task_id).board, recorded, redrawn_least)
    disjoint._TEST_KEYS.clear()  # the next process reads the test boards' keys from disk
    again = TextArenaEnv(game=game)
    assert [again.reset(task_id).text for task_id in range(30)] == train[:30]
    if game.startswith("FrozenLake"):  # the expert plays the board drawn again
        assert play_expert(again, redrawn)[-1].won and again.reset(redrawn).text == train[redrawn]


def gem_own_board(env):
    def own(task_id):
        with env._random.active():
            return env._first_board(task_id)

    return own


@pytest.mark.parametrize(
    "game, recorded, redrawn_least",
    [
        ("game:Game2048-v0-easy", "bdae0204426450e5", 150),
        pytest.param("game:Sokoban-v0-easy", "dd6362a0f541b369", 40, marks=pytest.mark.slow),  # 15 ms a room
    ],
)
def test_a_gem_train_board_is_never_a_test_board(game, recorded, redrawn_least):
    env = gem(game)
    assert game in REDRAWN_GAMES
    train, _ = assert_train_clear_of_test(env, gem_own_board(env), recorded, redrawn_least)
    assert env.reset(1_000_003).text == env.reset(1_000_003).text  # the test split stays put after redraws
    again = gem(game)
    assert [again.reset(task_id).text for task_id in range(30)] == train[:30]


def test_games_with_too_few_boards_say_so():
    def description(name):
        return registry.envs.component(name).description

    assert "Train and test share all its 24 boards: a test score measures play on boards seen in training" in (
        description("gem:game:FifteenPuzzle-v0-easy")
    )
    assert "share its one board" in description("textarena:TowerOfHanoi-v0")
    assert "487 of the 500 test boards" in description("textarena:2048-v0-3x3")
    assert "share" not in description("textarena:FrozenLake-v0") + description("gem:game:Game2048-v0-easy")
