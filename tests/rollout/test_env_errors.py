"""Episodes that failed in the env are reported as such: left out of success, counted beside it with
their first reasons, and past max_env_error_rate the command exits 2."""

from __future__ import annotations

import json
import warnings

import pytest

from omrl.data import read_episodes
from omrl.envs import EnvError, StepResult
from omrl.rollout import EnvPool, collect
from omrl.training.metrics import rollout_metrics
from tests.fakes import ActionTemplate, KeyEnv, Registers
from tests.helpers import an_episode, cli_exit, keys_eval, keys_rollout


class DownKeyEnv(KeyEnv):
    """The `keys` env whose server is gone for task ``fail_task``: its reset fails, whatever the model says."""

    def reset(self, task_id: int):
        if task_id == self.fail_task:
            raise EnvError(f"keys server: connection refused (task {task_id})")
        return super().reset(task_id)


@pytest.fixture
def down_env(fake_plugins, register_plugin):
    register_plugin(Registers({"keys_down": DownKeyEnv}), name="keys-down")


def run(capsys, *args: str) -> tuple[int, str]:
    """The real CLI: its exit status and everything it printed (whitespace joined)."""
    code, out, err = cli_exit(capsys, *args)
    return code or 0, " ".join((out + err).split())


def test_env_errors_are_no_losses_and_past_the_share_the_rollout_exits_2(fake_plugins, tmp_path, capsys):
    out = tmp_path / "expert.parquet"
    code, text = run(capsys, *keys_rollout(4, "--expert", "plugins.keys.fail_task=1", "-o", str(out)))
    assert code == 2
    assert "error: 1 of 4 episodes (25%) failed in the env 'keys'" in text
    assert "more than max_env_error_rate=0.1 allows" in text and "chest 1 exploded" in text
    assert "success_rate │ 100.0%" in text and "env_errors │ 1" in text  # the expert won every episode it played
    assert [ep.end_reason for ep in read_episodes(out)].count("env_error") == 1  # written all the same


def test_under_the_share_the_run_succeeds_and_says_why_episodes_failed(down_env, tmp_path, capsys):
    report = tmp_path / "report.json"
    code, text = run(
        capsys,
        *keys_eval(
            4, "plugins.keys_down.fail_task=1", "max_env_error_rate=0.5", "--report", str(report), env="keys_down"
        ),
    )
    assert code == 0, text
    assert "env errors: 1 of 4 episodes failed in the env 'keys_down'" in text
    assert "1 episode, of task 1:" in text and "connection refused (task 1)" in text
    metrics = json.loads(report.read_text())["metrics"]
    assert metrics["env_errors"] == 1 and metrics["env_error_rate"] == 0.25
    assert metrics["success_rate"] == sum(e["won"] for e in json.loads(report.read_text())["episodes"]) / 3


def test_eval_past_the_share_exits_2_naming_the_reasons(down_env, tmp_path, capsys):
    report = tmp_path / "report.json"
    code, text = run(capsys, *keys_eval(4, "plugins.keys_down.fail_task=1", "--report", str(report), env="keys_down"))
    assert code == 2 and "1 of 4 episodes (25%) failed in the env 'keys_down'" in text
    assert "connection refused (task 1)" in text
    assert report.exists()  # the report lists them


def test_every_episode_failing_says_so_without_the_zero_reward_advice(fake_plugins, tmp_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, text = run(
            capsys,
            *keys_rollout(
                1, "--expert", "--group-size", "8", "plugins.keys.fail_task=0", "-o", str(tmp_path / "t.parquet")
            ),
        )
    assert (
        code == 2 and "every episode failed in the env 'keys'" in text and "chest 0 exploded" in text
    )  # not its expert
    assert not [w for w in caught if "all rewards are 0" in str(w.message)]
    assert "all rewards are 0" not in text


def test_a_bad_share_is_refused_before_any_episode(fake_plugins, tmp_path, capsys):
    code, text = run(capsys, *keys_rollout(1, "--expert", "max_env_error_rate=2", "-o", str(tmp_path / "t.parquet")))
    assert code == 2 and "max_env_error_rate must be a share between 0 and 1, got 2.0" in text
    assert not (tmp_path / "t.parquet").exists()


def test_training_metrics_leave_env_errors_out_of_success(fake_plugins):

    ends = ["done", "done", "env_error", "env_error"]
    episodes = [an_episode(env="keys", task_id=t, won=t < 2, score=float(t < 2), end_reason=ends[t]) for t in range(4)]
    metrics = rollout_metrics(episodes, 1.0, {})
    assert metrics["success"] == 1.0 and metrics["score"] == 1.0
    assert metrics["env_errors"] == 2.0 and metrics["env_error_rate"] == 0.5


@pytest.mark.parametrize(
    "answer, wrong",
    [
        (StepResult("ok", 37.0, True, {"won": False, "score": 37.0}), "returned score 37.0; it must be in [0, 1]"),
        (StepResult("ok", 0.0, True, {"won": False, "score": -4.0}), "returned score -4.0; it must be in [0, 1]"),
        (StepResult("ok", 0.0, "no", {"won": False, "score": 0.0}), "returned done 'no'; it must be True or False"),
    ],
)
def test_a_step_answer_outside_the_protocol_is_an_env_error_never_a_reward(tiny_tokenizer, answer, wrong):
    """A score of 37 would be trained as a reward of 37; a done of "no" would end the episode as true."""

    class Garbled(KeyEnv):
        def step(self, action):
            return answer

    (episode,) = collect(EnvPool(Garbled, name="garbled"), ActionTemplate(), tiny_tokenizer, [0], expert=True)
    assert episode.end_reason == "env_error" and wrong in episode.error


def test_a_reason_shared_by_several_episodes_names_the_first_task_as_the_first():
    """It said "6 episodes, from task 0" of episodes from tasks 0 to 5."""
    from omrl.data import Episode
    from omrl.env_errors import env_error_reasons

    failed = [Episode("e", task, "train", "", end_reason="env_error", error="down") for task in range(3)]
    assert env_error_reasons(failed) == ["3 episodes, the first of task 0: down"]
