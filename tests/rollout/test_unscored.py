"""A reward that fails after the episodes were played: the command fails naming the reward, and the played
episodes are written without rewards beside the output instead of being lost."""

from __future__ import annotations

import pytest

from omrl.data import read_episodes
from omrl.hookspecs import hookimpl
from tests.helpers import cli_exit, keys_eval, keys_rollout


class NaNReward:
    @hookimpl
    def register_rewards(self, register):
        register("nan_reward", lambda episodes: [[float("nan")] * ep.num_turns for ep in episodes])


@pytest.fixture
def nan_reward(fake_plugins, register_plugin):
    register_plugin(NaNReward(), name="nan-reward")


def test_rollout_keeps_the_played_episodes_when_a_reward_fails(nan_reward, capsys, tmp_path):
    out = tmp_path / "keys.parquet"
    code, _, err = cli_exit(capsys, *keys_rollout(3, "--expert", "-o", str(out), "reward.weights={nan_reward: 1}"))
    assert code == 2 and "nan_reward" in err
    assert "the 3 episodes played are written without rewards to" in err and not out.exists()
    kept = read_episodes(tmp_path / "keys.unscored.parquet")
    assert [ep.task_id for ep in kept] == [0, 1, 2] and all(ep.won and not ep.rewards for ep in kept)
    assert (tmp_path / "keys.unscored.jsonl").exists()


def test_eval_keeps_the_played_episodes_when_a_reward_fails(nan_reward, capsys, tmp_path):
    folder = tmp_path / "eval"
    code, _, err = cli_exit(capsys, *keys_eval(2, "--output-dir", str(folder), "reward.weights={nan_reward: 1}"))
    assert code == 2 and "nan_reward" in err and not (folder / "report.json").exists()
    kept = read_episodes(folder / "episodes.unscored.parquet")
    assert len(kept) == 2 and all(ep.num_turns and not ep.rewards for ep in kept)


def test_an_unscored_file_that_would_replace_an_input_is_refused_first(nan_reward, capsys, tmp_path):
    data = tmp_path / "qa.unscored.parquet"
    data.write_bytes(b"mine")
    code, _, err = cli_exit(
        capsys, *keys_rollout(1, "--expert", "-o", str(tmp_path / "qa.parquet"), f"plugins.keys.notes={data}")
    )
    assert code == 2 and "the unscored episodes" in err and data.read_bytes() == b"mine"
