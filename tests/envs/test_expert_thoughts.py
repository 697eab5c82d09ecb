"""An env's expert may say why it acts (``expert_thought``): expert SFT data then carries that thought,
and where an env gives none the reply is the action line alone, never an empty "Think:" line."""

from __future__ import annotations

import json

from omrl_plugins.envs.gridworld import GridWorld
from tests.helpers import invoke


def test_the_gridworld_expert_names_the_goal_and_says_when_its_move_is_a_detour():
    env, detours, thoughts = GridWorld(), 0, set()
    for task_id in range(40):
        env.reset(task_id)
        while (move := env.expert_action()) is not None:
            thought = env.expert_thought()
            goal = env._maze.goal[0] - env._agent[0], env._maze.goal[1] - env._agent[1]
            toward = {"up": goal[0] < 0, "down": goal[0] > 0, "left": goal[1] < 0, "right": goal[1] > 0}[move]
            assert thought.startswith("The goal is ") and thought.endswith(
                f"; {move} gets closer." if toward else f"; {move} goes around the walls."
            ), (task_id, move, goal, thought)
            detours += not toward
            thoughts.add(thought)
            env.step(move)
        assert env.expert_thought() == ""  # the episode is over: nothing to explain
    assert detours > 0 and len(thoughts) > 20


def test_expert_rollout_data_has_the_envs_thought_or_no_think_line(tmp_path, fake_plugins):
    invoke("rollout", "--env", "gridworld", "--expert", "--num-tasks", "3", "-o", str(tmp_path / "grid.parquet"))
    # the `keys` test env predates expert_thought: its expert says nothing, as before
    invoke("rollout", "--env", "keys", "--template", "react", "--expert", "-o", str(tmp_path / "keys.parquet"))
    for name, opening in (("grid", "Think: The goal is "), ("keys", "Act: ")):
        rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        replies = [m["content"] for row in rows for m in row["messages"] if m["role"] == "assistant"]
        assert replies and all(reply.startswith(opening) for reply in replies), replies
        assert not any(line.strip() == "Think:" for reply in replies for line in reply.splitlines())
        assert all(turn["format_ok"] for row in rows for turn in row["turns"])  # the react template reads them back


def test_env_play_shows_the_experts_thought_beside_its_action():
    from typer.testing import CliRunner

    from omrl.cli import build_app

    shown = CliRunner().invoke(build_app(), ["env", "play", "gridworld", "--task", "0"], input=":expert\n:quit\n")
    assert "expert: down (The goal is 2 down, 1 left; down gets closer.)" in shown.output, shown.output


def test_a_thought_that_would_crowd_out_the_action_is_left_out(tmp_path):
    """With a token cap too small for thought and action, the expert's reply is its action alone (cut,
    it would act on nothing): its episodes still win."""
    out = tmp_path / "short.parquet"
    invoke(
        "rollout", "--env", "gridworld", "--expert", "--num-tasks", "3", "-o", str(out), "generation.max_new_tokens=8"
    )
    rows = [json.loads(line) for line in (tmp_path / "short.jsonl").read_text().splitlines()]
    replies = [m["content"] for row in rows for m in row["messages"] if m["role"] == "assistant"]
    assert replies and all(reply.startswith("Act: ") for reply in replies), replies
    assert all(row["won"] for row in rows), [row["won"] for row in rows]


def test_expert_episodes_cut_at_the_context_limit_are_warned_of(tmp_path, capsys):
    """textworld-express's expert needed more than the default 2048 tokens: 9 of 12 demonstrations ended cut,
    and exit 0 said nothing."""
    from tests.helpers import cli_exit

    out = tmp_path / "cut.parquet"
    code, stdout, _ = cli_exit(capsys, "rollout", "--env", "gridworld", "--expert", "--num-tasks", "3",
                               "generation.max_context=200", "-o", str(out))  # fmt: skip
    said = " ".join(stdout.split())
    assert code == 0 and "expert episodes ended at generation.max_context=200 tokens before the expert finished" in said
    code, stdout, _ = cli_exit(capsys, "rollout", "--env", "gridworld", "--expert", "--num-tasks", "3", "-o", str(out))
    assert code == 0 and "before the expert finished" not in stdout
