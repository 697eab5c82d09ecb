"""What an env must answer, checked where the rollout takes it: the last step of an episode carries ``won``
and ``score`` (a finished episode without them is the env's failure, not a silent loss), and ``task_ids``
returns the split's ids (an env that returns None is named, never blamed on omrl)."""

from __future__ import annotations

import pytest

from omrl.envs import EnvError, StepResult, UnknownTaskError, seat_step_problem, step_problem
from omrl.evaluation import evaluate
from omrl.rollout import EnvPool, collect
from tests.fakes import ActionTemplate, KeyEnv
from tests.helpers import expert_rollout_of


class SilentEndKeyEnv(KeyEnv):
    """The `keys` env whose winning step leaves ``won`` and ``score`` out of its info."""

    def step(self, action):
        result = super().step(action)
        if result.done:
            return StepResult(result.observation, result.reward, True, {"invalid": False})
        return result


class NoTasksKeyEnv(KeyEnv):
    """The `keys` env with a sketched ``task_ids`` (``def task_ids(self, split): ...``)."""

    def task_ids(self, split):
        return None


@pytest.mark.parametrize(("info", "missing"), [({}, "won or score"), ({"won": True}, "score"), ({"score": 1.0}, "won")])
def test_a_last_step_without_won_or_score_is_a_problem_naming_what_is_missing(info, missing):
    problem = step_problem(StepResult("done", 1.0, True, info))
    assert problem == (
        f"ended the episode (done) without {missing} in its info; the last step's info must carry won "
        "(True or False) and score (a number in [0, 1])"
    )


def test_a_step_before_the_last_may_leave_them_out_and_a_games_end_has_seat_rewards():
    assert step_problem(StepResult("go on", 0.0, False, {})) is None
    assert step_problem(StepResult("done", 1.0, True, {"won": True, "score": 1.0})) is None
    seats = ("player_0", "player_1")
    end = StepResult("", 0.0, True, {}, seat_rewards={"player_0": 1.0, "player_1": -1.0})
    assert seat_step_problem(end, seats) is None


def test_an_episode_that_ends_without_won_or_score_is_the_envs_failure_not_a_loss(tiny_tokenizer):
    episodes = collect(EnvPool(SilentEndKeyEnv, name="keys"), ActionTemplate(), tiny_tokenizer, [0, 1], expert=True)
    assert [ep.end_reason for ep in episodes] == ["env_error", "env_error"]
    assert episodes[0].error.startswith("step failed: env 'keys' ended the episode (done) without won or score")
    metrics = evaluate(episodes)
    assert metrics["env_errors"] == 2 and metrics["success_rate"] is None  # nothing measured: no rate


def test_task_ids_that_returns_none_is_named_with_what_it_must_return():
    with pytest.raises(EnvError) as refused:
        NoTasksKeyEnv().split_of("train")
    assert str(refused.value) == (
        "env NoTasksKeyEnv's task_ids('train') returned None; it must return the split's task ids as a "
        "sequence of ints, e.g. range(100) or a list"
    )
    assert list(KeyEnv().split_of("train")) == list(range(6))


class NamedTasksKeyEnv(KeyEnv):
    """Task ids as names: the session turned them into ints, and said "a bug in omrl"."""

    def task_ids(self, split):
        return ["a", "b"]


@pytest.mark.parametrize(
    "env_class, named",
    [
        (NoTasksKeyEnv, "env NoTasksKeyEnv's task_ids('train') returned None; it must return"),
        (
            NamedTasksKeyEnv,
            "env NamedTasksKeyEnv's task_ids('train') returned ['a', 'b']; it must return the split's task ids as a sequence of ints",
        ),
        (SilentEndKeyEnv, "ended the episode (done) without won or score"),
    ],
)
def test_omrl_rollout_of_an_env_outside_its_protocol_exits_2_naming_it(
    fake_plugins, register_plugin, tmp_path, capsys, env_class, named
):
    code, text = expert_rollout_of(capsys, register_plugin, env_class, tmp_path / "out.parquet")
    assert code == 2 and named in text, text
    assert "bug in omrl" not in text


class BuggyStepKeyEnv(KeyEnv):
    def step(self, action):
        return {}["observation"]  # a bug in the plugin's code


class BuggyResetKeyEnv(KeyEnv):
    def reset(self, task_id):
        return {}["task"]  # a bug in the plugin's code


def test_an_env_plugins_bug_names_its_file_and_line_and_a_failure_of_the_world_does_not(
    tiny_tokenizer, register_plugin
):
    """An env's exception read "step failed: KeyError: 'observation'", which says nothing of where; an
    ``EnvError`` (its server is down) is the env's own report, and says enough."""
    from tests.training.helpers import EnvPlugin

    register_plugin(EnvPlugin("buggy_keys", BuggyStepKeyEnv), name="buggy-env")
    for env_class, when, key in ((BuggyStepKeyEnv, "step", "observation"), (BuggyResetKeyEnv, "reset", "task")):
        ep = collect(EnvPool(env_class, name="keys"), ActionTemplate(), tiny_tokenizer, [0], expert=True)[0]
        line = getattr(env_class, when).__code__.co_firstlineno + 1
        assert ep.error == f"{when} failed: KeyError: '{key}' (in plugin 'buggy-env' (-) at {__file__}:{line})"
    world = collect(EnvPool(KeyEnv, {"fail_task": 0}, name="keys"), ActionTemplate(), tiny_tokenizer, [0], expert=True)
    assert world[0].error == "step failed: EnvError: chest 0 exploded"


class TupleResetKeyEnv(KeyEnv):
    """Its reset returns gym's tuple, not an Observation: a bug in its plugin."""

    def reset(self, task_id):
        return ("obs", {})


def test_a_training_step_an_env_answered_outside_the_protocol_stops_at_once_naming_the_env(
    tiny_model_dir, tmp_path, register_plugin, monkeypatch
):
    """It was played twice more after 5 s and 10 s waits, then "run again once the env is back": the
    env's plugin, not the world, had failed, and a replay meets it again."""
    import io

    from rich.console import Console

    from omrl.errors import EnvFailure
    from omrl.training.rl import run_rl
    from tests.training.helpers import EnvPlugin, gridworld_config

    waits = []
    monkeypatch.setattr("omrl.training.online_run.time.sleep", waits.append)
    register_plugin(EnvPlugin("tuple_keys", TupleResetKeyEnv), name="tuple-env")
    cfg = gridworld_config(
        tiny_model_dir, tmp_path / "run", "env.name=tuple_keys", "env.template=react", "generation.max_new_tokens=4",
        "tasks_per_step=1", "group_size=2", "reward.weights={goal: 1}",
    )  # fmt: skip
    with pytest.raises(EnvFailure) as stopped:
        run_rl(cfg, console=Console(file=io.StringIO()))
    message = " ".join(str(stopped.value).split())
    assert waits == []  # no replay
    assert "reset failed: env 'tuple_keys' returned a tuple, not an Observation" in message
    assert "fix the plugin of the env 'tuple_keys' (it answered outside omrl's env protocol)" in message
    assert "env is back" not in message


class TrainOnlyKeyEnv(KeyEnv):
    """No test split, as a verifiers environment without an eval_dataset."""

    splits = ("train",)

    def task_ids(self, split):
        if split != "train":
            raise UnknownTaskError(f"no split {split!r}; valid: train")
        return range(6)


def test_an_env_without_a_test_split_trains_and_its_evaluations_play_none(tiny_model_dir, tmp_path, register_plugin):
    """`omrl train` asked for its test split and stopped: "has no split 'test'", though eval_tasks was 0."""
    import io

    from rich.console import Console

    from omrl.training.rl import run_rl
    from tests.training.helpers import EnvPlugin, gridworld_config

    register_plugin(EnvPlugin("train_keys", TrainOnlyKeyEnv), name="train-only-env")
    for eval_tasks in (0, 2):
        cfg = gridworld_config(
            tiny_model_dir, tmp_path / f"run{eval_tasks}", "env.name=train_keys", "env.template=react", "steps=1",
            "tasks_per_step=1", "group_size=2", "reward.weights={goal: 1}", f"eval_tasks={eval_tasks}",
        )  # fmt: skip
        if eval_tasks:
            with pytest.warns(UserWarning, match="env 'train_keys' has no test tasks"):
                assert run_rl(cfg, console=Console(file=io.StringIO()))["steps"] == 1
        else:
            assert run_rl(cfg, console=Console(file=io.StringIO()))["steps"] == 1
