"""A reward that fails after the episodes were played: the command fails naming the reward, and the played
episodes are written without rewards beside the output instead of being lost."""

from __future__ import annotations

import pytest

from omrl.data import read_episodes
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from tests.helpers import cli_exit, keys_eval, keys_rollout


def picky(episodes, scale: str = "number"):
    """Checks its option when it scores, as a judge does: a bad one is a ConfigError after the play."""
    if scale != "number":
        raise ConfigError(f"reward 'picky' option scale={scale!r} is invalid; valid: number")
    return [[1.0] * ep.num_turns for ep in episodes]


class NaNReward:
    @hookimpl
    def register_rewards(self, register):
        register("nan_reward", lambda episodes: [[float("nan")] * ep.num_turns for ep in episodes])
        register("picky", picky)


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


def test_a_reward_option_refused_only_when_it_scores_keeps_the_played_episodes(nan_reward, capsys, tmp_path):
    out = tmp_path / "keys.parquet"
    words = keys_rollout(2, "--expert", "-o", str(out), "reward.weights={picky: 1}", "plugins.picky.scale=foo")
    code, _, err = cli_exit(capsys, *words)
    assert code == 2 and "option scale='foo' is invalid; valid: number" in " ".join(err.split())
    assert len(read_episodes(tmp_path / "keys.unscored.parquet")) == 2


def test_an_unscored_file_that_would_replace_an_input_is_refused_first(nan_reward, capsys, tmp_path):
    data = tmp_path / "qa.unscored.parquet"
    data.write_bytes(b"mine")
    code, _, err = cli_exit(
        capsys, *keys_rollout(1, "--expert", "-o", str(tmp_path / "qa.parquet"), f"plugins.keys.notes={data}")
    )
    assert code == 2 and "the unscored episodes" in err and data.read_bytes() == b"mine"
