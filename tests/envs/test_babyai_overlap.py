"""BabyAI's train boards clear of its test boards (``engines/disjoint.py``): a train task whose first
board is a test board is dealt again from further seeds, the others and the test split as they were."""

from __future__ import annotations

import hashlib

import pytest

from omrl import registry
from omrl_plugins.envs.engines import disjoint
from omrl_plugins.envs.engines.babyai import BabyAIEnv, board

pytest.importorskip("minigrid")

LEVEL = "GoToRedBallNoDists"
#: first observations of test tasks, recorded before train boards were dealt again
TEST_OBSERVATIONS = {0: "8d22f5a59ecd1c05", 1: "ceed388d1f191f13", 7: "118dccf81d36a424", 99: "48775c006907ada6"}
#: the train ids of 1000..1299 whose own seed deals a test board (27 of the 100 test boards were in 1000..1999)
REDRAWN_IDS = [1067, 1080, 1103, 1168, 1190, 1241, 1246, 1282, 1283, 1294]


@pytest.fixture(autouse=True)
def fresh_process(tmp_path, monkeypatch):
    """Each test as a new process on a new machine: no test keys in memory, none on disk."""
    monkeypatch.setenv("OMRL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(disjoint, "_TEST_KEYS", {})


def test_a_train_board_is_never_a_test_board_and_the_test_split_is_unchanged():
    env = BabyAIEnv(LEVEL)
    shown = {
        task_id: hashlib.sha256(env.reset(task_id).text.encode()).hexdigest()[:16] for task_id in TEST_OBSERVATIONS
    }
    assert shown == TEST_OBSERVATIONS
    tests = set()
    for task_id in env.task_ids("test"):
        env.reset(task_id)
        tests.add(board(env._episode.game))
    redrawn = []
    for task_id in range(1000, 1300):
        info = env.reset(task_id).info
        assert board(env._episode.game) not in tests, task_id
        if info["seed"] != task_id:
            redrawn.append(task_id)
    assert redrawn == REDRAWN_IDS  # the others keep their own board
    # the family deals the same board for the same level and seed (level index 2, seed 1067)
    family = BabyAIEnv()
    assert family.reset(40_000 + 2 + 40 * 67).info["seed"] == env.reset(1067).info["seed"] != 1067


def test_a_level_with_too_few_boards_says_so():
    def description(name):
        return registry.envs.component(name).description

    assert "Train and test share its few boards" in description("babyai:OpenRedDoor")
    assert "share" not in description(f"babyai:{LEVEL}")
