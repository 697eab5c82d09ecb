"""The ``reasoning-gym:<dataset>`` envs on the real reasoning_gym package: the dataset's own answer
wins, its own scorer gives the reward, splits are fixed item indices, and names cost no import."""

from __future__ import annotations

import math
import random
import sys

import numpy as np
import pytest

from omrl import registry
from omrl.data import read_episodes
from omrl.envs import EpisodeFinishedError, UnknownTaskError, create_env, package_installed, reset_problem, step_problem
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import MissingExtraError
from omrl_plugins.envs.engines.reasoning_gym import DATASETS, LEFT_OUT, SPLITS, ReasoningGymEnv
from tests.helpers import eval_report, fresh_python_json, invoke


def make(name, **options):
    return create_env(registry.envs.get(f"reasoning-gym:{name}"), options, f"reasoning-gym:{name}")


def test_names_are_the_packages_datasets_and_registering_them_imports_nothing():
    from reasoning_gym.factory import DATASETS as PACKAGE_DATASETS

    assert sorted(DATASETS + tuple(LEFT_OUT)) == sorted(PACKAGE_DATASETS) and not set(DATASETS) & set(LEFT_OUT)
    names = [name for name in registry.envs.names() if name.startswith("reasoning-gym:")]
    assert names == sorted(f"reasoning-gym:{dataset}" for dataset in DATASETS) and len(names) == 103
    chain_sum = registry.envs.get("reasoning-gym:chain_sum")
    assert issubclass(chain_sum, ReasoningGymEnv) and chain_sum.max_turns == 1
    assert (chain_sum.package, chain_sum.extra) == ("reasoning-gym", "reasoning-gym") and package_installed(chain_sum)

    code = (
        "import json, sys\n"
        "from omrl import registry\n"
        "names = [n for n in registry.envs.names() if n.startswith('reasoning-gym:')]\n"
        "print(json.dumps({'names': len(names), 'imported': 'reasoning_gym' in sys.modules}))\n"
    )
    assert fresh_python_json(code) == {"names": 103, "imported": False}


def test_the_datasets_own_answer_wins_and_its_scorer_is_the_reward():
    env = make("chain_sum")
    for task_id in list(env.task_ids("test"))[:3]:
        first = env.reset(task_id)
        assert first.text == first.instruction and first.text.startswith("State the final answer")
        result = env.step(env.expert_action())
        assert result.done and result.won and result.reward == 1.0 and result.score == 1.0
        assert result.info["invalid"] is False and env.expert_action() is None
        with pytest.raises(EpisodeFinishedError):
            env.step("1")
    env.reset(1_000_000)
    answer = env.expert_action()
    reply = f"The answer is {answer}"
    partial = env.step(reply)  # chain_sum's partial credit: len(answer) / len(reply)
    assert partial.done and not partial.won and partial.reward == pytest.approx(len(answer) / len(reply))
    env.reset(1_000_000)
    wrong = env.step("no idea")
    assert wrong.done and not wrong.won and wrong.reward == wrong.score == 0.0 and "scored 0.0" in wrong.observation


def test_task_ids_are_item_indices_under_each_splits_seed():
    import reasoning_gym

    env = make("chain_sum")
    train, test = env.task_ids("train"), env.task_ids("test")
    assert (train, test) == (SPLITS["train"], SPLITS["test"]) and not set(train) & set(test)
    expected = reasoning_gym.create_dataset("chain_sum", seed=1_000_000, size=500)[7]["question"]
    assert env.reset(1_000_007).text == expected
    assert make("chain_sum").reset(1_000_007).text == expected  # another instance, the same task
    train_questions = {env.reset(task_id).text for task_id in train[:30]}
    assert not train_questions & {env.reset(task_id).text for task_id in test[:30]}
    with pytest.raises(UnknownTaskError, match="train 0..9999, test 1000000..1000499"):
        env.reset(10_000)
    with pytest.raises(UnknownTaskError, match="valid: train, test"):
        env.task_ids("dev")


def test_a_train_task_never_asks_a_test_question():
    import reasoning_gym

    env = make("lcm")  # few questions: different seeds often give the same one
    test = {item["question"] for item in reasoning_gym.create_dataset("lcm", seed=1_000_000, size=500)}
    assert env.reset(1_000_007).text == reasoning_gym.create_dataset("lcm", seed=1_000_000, size=500)[7]["question"]
    train = [env.reset(task_id).text for task_id in range(300)]
    assert not set(train) & test and len(set(train)) > 100
    drawn_again = next(
        t for t in range(300) if reasoning_gym.create_dataset("lcm", seed=t, size=1)[0]["question"] in test
    )
    again = make("lcm")
    assert again.reset(drawn_again).text == train[drawn_again]  # deterministic, another instance alike
    assert again.step(again.expert_action()).won  # scored by the dataset it was drawn from


def test_a_dataset_that_draws_every_item_up_front_plays_too():
    env = make("acre")  # acre builds its whole split at the first reset
    env.reset(1_000_001)
    assert env.step(env.expert_action()).won
    assert make("acre").reset(1_000_001).text == env.reset(1_000_001).text


def test_an_answer_the_scorer_cannot_read_is_invalid_and_scores_zero():
    env = make("prime_factorization")
    env.reset(1_000_000)
    result = env.step("hello")  # prime_factorization's scorer raises ValueError on it
    assert result.done and result.info["invalid"] and result.reward == 0.0 and not result.won
    assert "could not be scored (ValueError" in result.observation


def test_what_the_package_gives_reaches_the_protocol_check_unchanged(monkeypatch):
    env = make("chain_sum")
    env.reset(1_000_000)
    dataset = env._datasets["test"]
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: float("nan"))
    result = env.step("1")
    assert math.isnan(result.reward) and math.isnan(result.info["score"])  # not clipped into a 0
    assert "returned reward nan" in step_problem(result)

    from reasoning_gym.arithmetic.basic_arithmetic import BasicArithmeticDataset

    monkeypatch.setattr(BasicArithmeticDataset, "__getitem__", lambda self, idx: {"question": 42, "answer": "1"})
    assert "returned text 42; it must be text" in reset_problem(make("basic_arithmetic").reset(1_000_000))


def test_dataset_settings_are_an_option():
    env = make("chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    question = env.reset(1_000_000).text
    assert question.count("+") + question.count("-") == 1 and env.step(env.expert_action()).won


@pytest.mark.parametrize(
    "config, message",
    [
        ({"min_term": 2}, "unknown settings \\['min_term'\\]; valid: min_terms, max_terms"),
        ({"seed": 3}, "\\['seed'\\] are set by the split"),
        ({"min_terms": 0}, "min_terms must be positive"),
    ],
)
def test_bad_dataset_settings_name_the_valid_ones(config, message):
    with pytest.raises(ConfigError, match=message):
        make("chain_sum", config=config)


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("chain_summ", "unknown reasoning-gym dataset 'chain_summ'; close matches: chain_sum"),
        ("composite", "'composite' is left out: it only mixes other datasets"),
    ],
)
def test_unknown_and_left_out_datasets_say_what_is_valid(dataset, message):
    with pytest.raises(ConfigError, match=message):
        ReasoningGymEnv(dataset=dataset)


def test_a_named_dataset_takes_no_dataset_option():
    with pytest.raises(ConfigError, match="does not take options \\['dataset'\\].*its options: config"):
        make("chain_sum", dataset="gcd")


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
    with pytest.raises(MissingExtraError, match="pip install 'omrl\\[reasoning-gym\\]'"):
        make("chain_sum")


def test_the_callers_random_states_are_untouched():
    env = make("list_functions")  # list_functions draws from the global generators
    random.seed(3)
    np.random.seed(3)
    expected = (random.random(), np.random.random())
    random.seed(3)
    np.random.seed(3)
    env.reset(1_000_002)
    env.step(env.expert_action())
    assert (random.random(), np.random.random()) == expected


def test_an_expert_rollout_through_the_cli_wins_every_episode(tmp_path):
    out = tmp_path / "expert.parquet"
    result = invoke(
        "rollout", "--env", "reasoning-gym:chain_sum", "--model", "tiny", "--expert", "--num-tasks", "3", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert len(episodes) == 3 and all(ep.won and ep.score == 1.0 and ep.num_turns == 1 for ep in episodes)
    assert episodes[0].messages[1]["content"].startswith("State the final answer")


def test_eval_runs_a_dataset_by_its_name(tmp_path):
    _, data = eval_report(
        tmp_path,
        "eval",
        "--env",
        "reasoning-gym:chain_sum",
        "--model",
        "tiny",
        "--num-tasks",
        "2",
        "generation.max_new_tokens=4",
    )
    metrics = data["metrics"]
    assert metrics["episodes"] == 2 and sum(metrics["end_reasons"].values()) == 2
