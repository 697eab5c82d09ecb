"""The built-in gridworld env: deterministic tasks, a shortest-path expert, the env protocol."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.envs import EpisodeFinishedError, UnknownTaskError
from omrl.errors import ConfigError
from omrl_plugins.envs.gridworld import MOVES, GridWorld, parse_move


def play(env: GridWorld, actions: list[str]):
    return [env.step(action) for action in actions]


def test_registered_through_the_entry_point():
    assert registry.envs.get("gridworld") is GridWorld


def test_tasks_are_deterministic_per_task_id():
    a, b = GridWorld(), GridWorld()
    for task_id in (0, 17, 99_999, 1_000_000, 1_000_499):
        assert a.maze(task_id) == b.maze(task_id)
        assert a.reset(task_id).text == b.reset(task_id).text
    mazes = {GridWorld().maze(task_id) for task_id in range(50)}
    assert len(mazes) == 50  # ids give different tasks
    # the options shape the task
    assert GridWorld(size=7).maze(3).size == 7


def test_splits_are_disjoint_and_unknown_ids_name_the_valid_ranges():
    env = GridWorld()
    train, test = env.task_ids("train"), env.task_ids("test")
    assert len(train) == 100_000 and len(test) == 500
    assert not set(test) & set(train)
    with pytest.raises(UnknownTaskError, match=r"train 0\.\.99999, test 1000000\.\.1000499"):
        env.reset(500_000)
    with pytest.raises(UnknownTaskError, match="valid: train, test"):
        env.split_of("dev")


def test_the_expert_solves_every_test_task_along_a_shortest_path():
    env = GridWorld()
    lengths = set()
    for task_id in env.task_ids("test"):
        first = env.reset(task_id)
        shortest = first.info["distance"]
        assert 2 <= shortest <= 6
        results = []
        while not results or not results[-1].done:
            move = env.expert_action()
            assert move in env.admissible_actions()
            results.append(env.step(move))
        assert results[-1].won and results[-1].score == 1.0 and results[-1].reward == 1.0
        assert len(results) == shortest  # every expert move was on a shortest path
        assert [r.info["distance"] for r in results] == list(range(shortest - 1, -1, -1))
        lengths.add(shortest)
    assert lengths == {2, 3, 4, 5, 6}


def test_observation_names_the_goal_offset_and_the_blocked_moves():
    env = GridWorld(show_grid=True)
    env.reset(1_000_000)
    maze, agent = env._maze, env._agent
    text = env.reset(1_000_000).text
    first_line, *grid = text.splitlines()
    d_row, d_col = maze.goal[0] - agent[0], maze.goal[1] - agent[1]
    if d_row:
        assert f"{abs(d_row)} {'down' if d_row > 0 else 'up'}" in first_line
    if d_col:
        assert f"{abs(d_col)} {'right' if d_col > 0 else 'left'}" in first_line
    blocked = first_line.split("blocked: ")[1].rstrip(".").split(", ")
    assert sorted(blocked) == sorted(set(MOVES) - set(env.admissible_actions())) or blocked == ["none"]
    assert len(grid) == 5 and "".join(grid).count("A") == 1 and "".join(grid).count("G") == 1
    assert len(GridWorld().reset(1_000_000).text.splitlines()) == 1  # no grid unless asked


def test_invalid_and_blocked_moves_leave_the_state_unchanged_but_cost_a_turn():
    env = GridWorld(max_turns=3)
    before = env.reset(1_000_000).text
    position = env._agent
    invalid = env.step("jump over the wall")
    assert invalid.info["invalid"] is True and not invalid.done
    assert "invalid action" in invalid.observation and "up, down, left or right" in invalid.observation
    assert env._agent == position and before in invalid.observation
    blocked_moves = [m for m in MOVES if m not in env.admissible_actions()]
    assert blocked_moves, "task 1_000_000 starts next to a wall or edge"
    bumped = env.step(blocked_moves[0])
    assert bumped.info["invalid"] is False and "blocked" in bumped.observation
    assert env._agent == position
    last = env.step("???")
    assert last.done and not last.won and last.reward == 0.0  # the third turn was the last


def test_step_after_done_and_before_reset_raises():
    env = GridWorld()
    with pytest.raises(EpisodeFinishedError):
        env.step("up")
    env.reset(5)
    while True:
        result = env.step(env.expert_action())
        if result.done:
            break
    assert result.won
    with pytest.raises(EpisodeFinishedError, match="reset"):
        env.step("up")
    assert env.expert_action() is None


def test_score_gives_partial_credit_within_bounds():
    env = GridWorld()
    env.reset(1_000_001)
    scores = []
    for _ in range(11):
        away = [m for m in env.admissible_actions() if m != env.expert_action()]
        result = env.step(away[0] if away else env.expert_action())
        scores.append(result.score)
        if result.done:
            break
    assert all(0.0 <= s <= 1.0 for s in scores)
    env.reset(1_000_001)
    first = env.step(env.expert_action())
    assert 0.0 < first.score < 1.0 and first.reward == 0.0 and not first.won


def test_actions_are_parsed_leniently_and_tool_calls_become_moves():
    assert [parse_move(a) for a in (" UP ", "Left.", "[right]", '"down"')] == ["up", "left", "right", "down"]
    assert [parse_move(a) for a in ("upward", "go up", "up down", "")] == [None, None, None, None]
    env = GridWorld()
    assert env.tools[0]["parameters"]["properties"]["direction"]["enum"] == list(MOVES)
    assert env.action_from_tool_call("move", {"direction": "left"}) == "left"
    env.reset(1_000_002)
    assert env.step(env.action_from_tool_call("jump", {})).info["invalid"] is True


@pytest.mark.parametrize(
    "options",
    [
        {"size": 2},
        {"size": 5.5},
        {"wall_density": 0.9},
        {"max_distance": 9, "size": 5},
        {"min_distance": 7},
        {"max_turns": 0},
    ],
)
def test_bad_options_name_the_option_and_the_valid_range(options):
    name = next(iter(options))
    with pytest.raises(ConfigError, match=f"{name}=.*valid"):
        GridWorld(**options)
