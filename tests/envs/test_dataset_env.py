"""The built-in `dataset` env: prompts and answers from a file, splits, attempts, clear errors, the CLI,
and GRPO raising the accuracy of the `tiny` model on a small file of sums."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omrl import registry
from omrl.data import Episode, Turn, read_episodes
from omrl.envs import EpisodeFinishedError, UnknownTaskError, create_env, fork_support
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl.rewards import RewardError, compose_rewards
from omrl_plugins.envs.dataset import TEST_START, DatasetEnv
from omrl_plugins.rewards.answers import MATH_TIMEOUT_S
from tests.helpers import cli_exit, invoke, play_expert

ROWS = [
    {"question": "2+3=", "answer": "5"},
    {"question": "Capital of France?", "answer": "Paris"},
    {"question": "Half of 1?", "answer": ["0.5", "1/2"]},
    {"question": "7*6=", "answer": 42},
    {"question": "A float answer", "answer": 72.0},
]


def write_jsonl(path, rows, blank_lines=False):
    lines = [json.dumps(row) for row in rows]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path):
    return write_jsonl(tmp_path / "qa.jsonl", ROWS, blank_lines=True)


def sums(count: int) -> list[dict[str, str]]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(count)]


def answer(env: DatasetEnv, task_id: int, *actions: str):
    env.reset(task_id)
    return [env.step(action) for action in actions]


# -- loading ------------------------------------------------------------------------------------------
def test_registered_through_its_own_entry_point():
    import importlib.metadata

    assert registry.envs.get("dataset") is DatasetEnv
    assert registry.envs.component("dataset").distribution == "omrl"
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="omrl")}
    assert names["omrl.envs.dataset"] == "omrl_plugins.envs.dataset"


def test_jsonl_rows_with_the_default_keys(jsonl):
    env = DatasetEnv(path=str(jsonl))
    assert (env.data.prompt_key, env.data.answer_key) == ("question", "answer")
    assert [item.prompt for item in env.data.train] == [row["question"] for row in ROWS]  # blank lines skipped
    # numbers become text (72.0 as "72"); a list is several accepted answers
    assert [item.answers for item in env.data.train] == [("5",), ("Paris",), ("0.5", "1/2"), ("42",), ("72",)]
    assert list(env.task_ids("train")) == [0, 1, 2, 3, 4] and list(env.task_ids("test")) == []
    first = env.reset(1)
    assert first.text == first.instruction == "Capital of France?"
    assert first.info == {"won": False, "score": 0.0, "ground_truth": "Paris"}  # a judge reads it


def test_parquet_with_chat_prompts_and_a_nested_answer_as_verl_writes_them(tmp_path):
    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i} + {i} = ?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        }
        for i in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    env = DatasetEnv(path=str(tmp_path / "train.parquet"), match="numeric")
    assert env.data.answer_key == "reward_model.ground_truth"
    assert env.reset(3).text == "Be brief.\n\n3 + 3 = ?"
    assert env.step("Think: easy\nAct: 6").won


def test_a_chat_prompt_ends_at_its_last_user_message(tmp_path):
    # an SFT-style chat holds the reply too: it was joined into the prompt, the answer in plain sight
    turns = ("system", "Be brief."), ("user", "1 + 1 = ?"), ("assistant", "2"), ("user", "2 + 3 = ?")
    chat = [{"role": role, "content": text} for role, text in turns + (("assistant", "The answer is 5."),)]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat, "answer": "5"}])
    env = DatasetEnv(path=str(path), prompt_key="messages", test_fraction=0.0)
    assert env.reset(0).text == "Be brief.\n\n1 + 1 = ?\n\n2\n\n2 + 3 = ?"
    no_user = [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "5"}]
    write_jsonl(path, [{"messages": chat, "answer": "5"}, {"messages": no_user, "answer": "5"}])
    with pytest.raises(ConfigError, match="chat.jsonl line 2: prompt 'messages' is a chat without a user message"):
        DatasetEnv(path=str(path), prompt_key="messages", test_fraction=0.0)


def test_a_json_file_may_hold_a_list_of_rows(tmp_path):
    (tmp_path / "qa.json").write_text(json.dumps(sums(3)))
    assert [item.prompt for item in DatasetEnv(path=str(tmp_path / "qa.json")).data.train] == ["0+1=", "1+1=", "2+1="]


def test_a_jsonl_line_holding_a_raw_line_separator_in_a_string_is_one_line(tmp_path):
    """JSON allows U+2028, U+2029 and U+0085 unescaped in strings, and json.dumps(ensure_ascii=False)
    writes them so: they end no JSONL line."""
    rows = [{"prompt": "one\u2028two\u2029three\x85four", "answer": "4"}, {"prompt": "5+1=", "answer": "6"}]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    items = DatasetEnv(path=str(path)).data.train
    assert [item.prompt for item in items] == [row["prompt"] for row in rows]


def test_explicit_keys_and_an_instruction(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"q": "2+2", "a": "4", "question": "ignored"}])
    env = DatasetEnv(path=str(path), prompt_key="q", answer_key="a", instruction="Answer with a number.")
    first = env.reset(0)
    assert first.text == "Answer with a number.\n\n2+2"
    assert env.step("4").info["ground_truth"] == "4"


def test_a_datasets_directory_and_a_dataset_dict_with_its_test_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(sums(3)).save_to_disk(str(tmp_path / "plain"))
    assert len(DatasetEnv(path=str(tmp_path / "plain")).data.train) == 3
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(sums(4)), "test": datasets.Dataset.from_list(sums(6)[4:])}
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    env = DatasetEnv(path=str(tmp_path / "dict"))
    assert [item.prompt for item in env.data.train] == ["0+1=", "1+1=", "2+1=", "3+1="]
    assert [item.prompt for item in env.data.test] == ["4+1=", "5+1="]
    # a test_fraction takes the test split from the train rows instead
    assert len(DatasetEnv(path=str(tmp_path / "dict"), test_fraction=0.5).data.test) == 2


def test_a_datasets_directory_without_the_package_names_the_install(tmp_path, monkeypatch):
    (tmp_path / "saved").mkdir()
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r"is a directory.*save_to_disk.*pip install datasets"):
        DatasetEnv(path=str(tmp_path / "saved"))


def test_a_changed_file_is_read_again(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", sums(2))
    assert DatasetEnv(path=str(path)).data is DatasetEnv(path=str(path)).data  # read once for the pool
    write_jsonl(path, sums(3))
    assert len(DatasetEnv(path=str(path)).data.train) == 3


# -- splits -------------------------------------------------------------------------------------------
def test_a_test_split_that_repeats_train_prompts_is_warned_of(tmp_path):
    """The same file as test_path, or repeated rows split to both sides, were evaluated on as held out."""
    path = write_jsonl(tmp_path / "qa.jsonl", sums(4))
    with pytest.warns(UserWarning, match=r"4 of the 4 test prompts \(test_path .*qa.jsonl\) are train prompts too"):
        DatasetEnv(path=str(path), test_path=str(path))
    twice = write_jsonl(tmp_path / "twice.jsonl", sums(10) + sums(10))
    with pytest.warns(UserWarning, match=r"of the 5 test prompts \(test_fraction 0.25 of .*twice.jsonl\) are train"):
        DatasetEnv(path=str(twice), test_fraction=0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DatasetEnv(path=str(write_jsonl(tmp_path / "once.jsonl", sums(10))), test_fraction=0.25)


def test_test_fraction_splits_disjointly_and_the_same_way_every_time(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", sums(40))
    env = DatasetEnv(path=str(path), test_fraction=0.25, seed=3)
    train, test = env.data.train, env.data.test
    assert (len(train), len(test)) == (30, 10)
    assert not {it.prompt for it in train} & {it.prompt for it in test}
    assert sorted(it.prompt for it in train + test) == sorted(row["prompt"] for row in sums(40))
    assert list(env.task_ids("train")) == list(range(30))
    assert list(env.task_ids("test")) == list(range(TEST_START, TEST_START + 10))
    assert env.reset(TEST_START).text == test[0].prompt
    # the same options give the same split (a fresh read too); another seed another one
    again = DatasetEnv(path=str(path), test_fraction=0.25, seed=3, instruction="x")
    assert again.data == env.data
    assert DatasetEnv(path=str(path), test_fraction=0.25, seed=4).data.test != test
    # rows keep the file's order within each split
    order = [row["prompt"] for row in sums(40)]
    assert [order.index(it.prompt) for it in test] == sorted(order.index(it.prompt) for it in test)


@pytest.mark.parametrize("command", [["eval", "--output-dir"], ["rollout", "env.split=test", "-o"]])
def test_playing_a_split_without_tasks_is_refused_naming_the_splits_that_have_some_and_the_envs_options(
    jsonl, tmp_path, capsys, command
):
    """A file with no test rows (no test_fraction, no test_path): eval and rollout fail before playing,
    not with "no episodes to evaluate", and write nothing."""
    out = tmp_path / ("out" if command[0] == "eval" else "out.parquet")
    code, _, err = cli_exit(
        capsys, *command, str(out), "--env", "dataset", "--model", "tiny", f"plugins.dataset.path={jsonl}"
    )
    assert code == 2
    assert "env 'dataset' has no tasks in split 'test'; splits with tasks: train (5)" in err
    assert "(plugins.dataset.* or -o): path, prompt_key, answer_key, test_path, test_fraction" in err
    assert not out.exists() or out.is_dir() and not any(out.iterdir())


@pytest.mark.slow
def test_train_on_a_file_with_no_test_rows_prints_an_eval_command_that_runs(jsonl, tmp_path):
    run = tmp_path / "run"
    args = ["--env", "dataset", "--model", "tiny", f"plugins.dataset.path={jsonl}"]
    steps = ["steps=1", "tasks_per_step=2", "group_size=2", "eval_tasks=0", "generation.max_new_tokens=4"]
    result = invoke("train", "--algo", "grpo", *args, *steps, "--output-dir", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    printed = f"omrl eval --model {run} --env dataset --split train"
    assert f"evaluate it (the env has no test split: on the tasks it trained on): {printed}" in said
    evaluated = invoke(*printed.split()[1:], "--num-tasks", "2", "--output-dir", str(tmp_path / "eval"))
    assert evaluated.exit_code == 0, evaluated.output


def test_a_separate_test_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", sums(3))
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "9+9=", "answer": "18"}])
    env = DatasetEnv(path=str(train), test_path=str(test))
    assert list(env.task_ids("test")) == [TEST_START]
    assert env.reset(TEST_START).text == "9+9="


def test_unknown_task_ids_and_splits_name_the_valid_ones(jsonl):
    env = DatasetEnv(path=str(jsonl), test_fraction=0.2)
    with pytest.raises(UnknownTaskError, match=r"train 0\.\.3, test 1000000\.\.1000000"):
        env.reset(4)
    with pytest.raises(UnknownTaskError, match="valid: train, test"):
        env.split_of("dev")
    with pytest.raises(UnknownTaskError, match=r"valid: train 0\.\.4$"):
        DatasetEnv(path=str(jsonl)).reset(TEST_START)  # no test split: only train's ids are named


# -- episodes -----------------------------------------------------------------------------------------
def test_one_turn_by_default_with_the_ground_truth_in_the_info(jsonl):
    env = DatasetEnv(path=str(jsonl))
    (result,) = answer(env, 0, "answer[5]")  # read as the answer rewards read it
    assert (result.reward, result.done, result.won, result.score) == (1.0, True, True, 1.0)
    assert result.info == {
        "won": True,
        "score": 1.0,
        "correct": True,
        "attempt": 1,
        "invalid": False,
        "ground_truth": "5",
    }
    (wrong,) = answer(env, 2, "0.25")
    assert (wrong.reward, wrong.done, wrong.won, wrong.observation) == (0.0, True, False, "Incorrect.")
    assert wrong.info["ground_truth"] == ["0.5", "1/2"]
    with pytest.raises(EpisodeFinishedError):
        env.step("5")


def test_more_attempts_give_feedback_and_another_turn(jsonl):
    env = DatasetEnv(path=str(jsonl), max_attempts=3)
    assert env.max_turns == 3 and DatasetEnv.max_turns == 1
    first, second = answer(env, 1, "Lyon", "the paris")
    assert (first.done, first.reward, first.observation) == (False, 0.0, "Incorrect, try again (attempt 2 of 3).")
    assert (second.done, second.reward, second.won, second.info["attempt"]) == (True, 1.0, True, 2)
    results = answer(env, 1, "Lyon", "", "Nice")
    assert [r.done for r in results] == [False, False, True] and not results[-1].won
    assert results[1].info["invalid"] and not results[0].info["invalid"]
    assert results[-1].observation == "Incorrect."


@pytest.mark.parametrize(
    "match,right,wrong",
    [
        ("exact", ["Paris", " the PARIS! "], ["Paris, France"]),
        ("numeric", ["$42", "It is 42.0000001"], ["4.2", "no idea"]),
        ("math", ["\\frac{84}{2}", "x = 42"], ["41"]),
    ],
)
def test_the_match_option_decides_what_is_correct(tmp_path, match, right, wrong):
    truth = "Paris" if match == "exact" else "42"
    env = DatasetEnv(path=str(write_jsonl(tmp_path / "qa.jsonl", [{"prompt": "?", "answer": truth}])), match=match)
    assert [answer(env, 0, a)[0].won for a in right + wrong] == [True] * len(right) + [False] * len(wrong)


def test_numeric_tolerances(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"prompt": "pi?", "answer": "3.14159"}])
    assert not answer(DatasetEnv(path=str(path), match="numeric"), 0, "3.14")[0].won
    assert answer(DatasetEnv(path=str(path), match="numeric", rel_tol=0.001), 0, "3.14")[0].won
    assert answer(DatasetEnv(path=str(path), match="numeric", abs_tol=0.01), 0, "3.14")[0].won


def test_math_matching_works_off_the_main_thread(tmp_path):
    env = DatasetEnv(path=str(write_jsonl(tmp_path / "qa.jsonl", [{"prompt": "?", "answer": "1/2"}])), match="math")
    won = []
    thread = threading.Thread(target=lambda: won.append(answer(env, 0, "\\frac{2}{4}")[0].won))
    thread.start()
    thread.join()
    assert won == [True]


@pytest.mark.slow  # waits out a deadline
def test_an_answer_that_would_compute_forever_is_wrong_within_the_deadline_off_the_main_thread(tmp_path):
    """As a tool env scores it: math-verify's own bound (a signal alarm) does not work off the main thread."""
    env = DatasetEnv(path=str(write_jsonl(tmp_path / "qa.jsonl", [{"prompt": "?", "answer": "3"}])), match="math")
    results, started = [], time.monotonic()
    thread = threading.Thread(target=lambda: results.append(answer(env, 0, "9^{9^{9^{9}}}")[0]), daemon=True)
    thread.start()
    thread.join(60)
    assert [step.won for step in results] == [False] and time.monotonic() - started < MATH_TIMEOUT_S + 5


def test_the_expert_answers_and_episodes_fork(jsonl):
    env = DatasetEnv(path=str(jsonl), max_attempts=2)
    assert all(play_expert(env, task)[-1].won for task in env.task_ids("train"))
    assert env.expert_action() is None
    assert fork_support(env) == "snapshot"
    env.reset(1)
    env.step("Lyon")
    state = env.snapshot()
    other = DatasetEnv(path=str(jsonl), max_attempts=2)
    other.restore(state)
    assert other.step("Paris").won and env.step("Paris").info["attempt"] == 2


def test_the_answer_rewards_and_a_users_own_reward_score_its_episodes(jsonl, register_plugin):
    class Brevity:
        @hookimpl
        def register_rewards(self, register):
            def short_and_right(episodes, limit=8):
                """1 for a right answer of at most ``limit`` characters (reads the env's ground_truth)."""
                out = []
                for ep in episodes:
                    last = ep.turns[-1]
                    right = last.action == last.info["ground_truth"] and len(last.action) <= limit
                    out.append([0.0] * (len(ep.turns) - 1) + [float(right)])
                return out

            register("short_and_right", short_and_right)

    register_plugin(Brevity(), name="brevity-reward")
    env = DatasetEnv(path=str(jsonl))
    episodes = []
    for task, action in [(0, "5"), (1, "paris"), (3, "42 exactly"), (4, "72")]:
        (result,) = answer(env, task, action)
        turn = Turn("obs", f"Act: {action}", action, True, result.reward, True, info=result.info)
        episodes.append(Episode(env="dataset", task_id=task, split="train", instruction="", turns=[turn]))
    weights = {"exact_match": 1, "accuracy": 1, "short_and_right": 1}
    means = compose_rewards(episodes, weights, {"short_and_right": {"limit": 4}})
    assert [ep.rewards["exact_match"] for ep in episodes] == [[1.0], [1.0], [0.0], [1.0]]
    assert [ep.rewards["accuracy"] for ep in episodes] == [[1.0], [1.0], [1.0], [1.0]]
    assert [ep.rewards["short_and_right"] for ep in episodes] == [[1.0], [0.0], [0.0], [1.0]]
    assert means["total"] == pytest.approx((3 + 4 + 2) / 4)
    compose_rewards([episodes[0], *episodes[2:]], {"numeric_match": 1, "math_verify": 1})
    assert [ep.rewards["numeric_match"] for ep in episodes[2:]] == [[1.0], [1.0]]
    assert [ep.rewards["math_verify"] for ep in episodes[2:]] == [[1.0], [1.0]]
    with pytest.raises(RewardError, match="ground truth 'Paris' .* holds no number"):
        compose_rewards(episodes[1:2], {"numeric_match": 1})


# -- bad input ------------------------------------------------------------------------------------------
def bad(tmp_path, text: str, name: str = "qa.jsonl") -> str:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return str(tmp_path / name)


@pytest.mark.parametrize(
    "options,message",
    [
        ({}, r"needs plugins\.dataset\.path=FILE: a \.jsonl file"),
        ({"path": "nowhere.jsonl"}, r"path='nowhere\.jsonl': no such file or directory; valid: a \.jsonl"),
        ({"match": "fuzzy"}, r"match='fuzzy' is invalid; valid: exact, numeric, math"),
        ({"max_attempts": 0}, r"max_attempts=0 is invalid; valid: an integer in 1\.\.100"),
        ({"test_fraction": 1.0}, r"test_fraction=1\.0 is invalid; valid: a number in \[0, 1\)"),
        ({"test_fraction": 0.5, "test_path": "x.jsonl"}, "test_path and test_fraction both give a test split"),
        ({"seed": "0"}, r"seed='0' is invalid; valid: an integer"),
        ({"rel_tol": -1}, r"rel_tol=-1 is invalid; valid: a finite number >= 0"),
        ({"prompt_key": 3}, r"prompt_key=3 is invalid; valid: text"),
    ],
)
def test_bad_options_name_what_is_valid(jsonl, options, message):
    options = {"path": str(jsonl), **options} if options else {}
    with pytest.raises(ConfigError, match=message):
        DatasetEnv(**options)


def test_unknown_options_are_refused_with_the_env_options():
    with pytest.raises(ConfigError, match=r"its options: path, prompt_key, answer_key, test_path, test_fraction"):
        create_env(DatasetEnv, {"file": "qa.jsonl"}, "dataset")


@pytest.mark.parametrize(
    "text,message",
    [
        ("", r"the file holds no rows"),
        ("\n  \n", r"the file holds no rows"),
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c", answer: "d"}\n', r"qa\.jsonl line 2: not valid JSON"),
        (
            '{"prompt": "a", "answer": "b"}\n\n["c", "d"]\n',
            r"qa\.jsonl line 3: is \['c', 'd'\] \(list\), not an object of columns",
        ),
        ('{"text": "a", "label": "b"}\n', r"no prompt column found \(tried prompt, question.*its columns: text, label"),
        (
            '{"prompt": "a", "label": "b"}\n',
            r"no answer column found \(tried answer, ground_truth.*columns: prompt, label",
        ),
        (
            '{"prompt": "a", "answer": "b"}\n{"prompt": "c"}\n',
            r"qa\.jsonl line 2: has no answer column 'answer' \(its columns: prompt",
        ),
        (
            '{"prompt": "a", "answer": {"value": 1}}\n',
            r"line 1: answer 'answer' is \{'value': 1\} \(dict\); valid: text, a number, or a",
        ),
        ('{"prompt": "a", "answer": true}\n', r"line 1: answer 'answer' is True \(bool\)"),
        ('{"prompt": "a", "answer": null}\n', r"line 1: answer 'answer' is None \(NoneType\)"),
        ('{"prompt": "a", "answer": []}\n', r"line 1: answer 'answer' is \[\] \(list\)"),
        ('{"prompt": "a", "answer": "  "}\n', r"line 1: answer 'answer' is empty"),
        ('{"prompt": 7, "answer": "b"}\n', r"line 1: prompt 'prompt' is 7 \(int\); valid: text, or a chat"),
        ('{"prompt": " ", "answer": "b"}\n', r"line 1: prompt 'prompt' is empty"),
    ],
)
def test_bad_files_name_the_line_and_what_is_valid(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        DatasetEnv(path=bad(tmp_path, text))


def test_bad_files_of_other_kinds(tmp_path):
    with pytest.raises(ConfigError, match=r"unsupported file type '\.csv'; valid: a \.jsonl file"):
        DatasetEnv(path=bad(tmp_path, "prompt,answer\n", "qa.csv"))
    with pytest.raises(ConfigError, match=r"qa\.parquet: not a readable parquet file"):
        DatasetEnv(path=bad(tmp_path, "not parquet", "qa.parquet"))
    (tmp_path / "latin1.jsonl").write_bytes('{"prompt": "a", "answer": "b"}\n{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.jsonl line 2: not UTF-8 text \(byte 46\)"):
        DatasetEnv(path=str(tmp_path / "latin1.jsonl"))
    with pytest.raises(ConfigError, match=r"qa\.json: not valid JSON .*; expected a list of objects"):
        DatasetEnv(path=bad(tmp_path, '[{"prompt": "a", "answer": "b"},', "qa.json"))
    with pytest.raises(ConfigError, match=r"qa\.json record 2: is 3 \(int\), not an object of columns"):
        DatasetEnv(path=bad(tmp_path, '[{"prompt": "a", "answer": "b"}, 3]', "qa.json"))


def test_splits_that_leave_nothing_to_train_on_and_numeric_answers_without_numbers(tmp_path, jsonl):
    one = write_jsonl(tmp_path / "one.jsonl", sums(1))
    with pytest.raises(ConfigError, match=r"test_fraction=0\.1 takes all 1 rows .* leaves none to train on"):
        DatasetEnv(path=str(one), test_fraction=0.1)
    with pytest.raises(ConfigError, match=r"qa\.jsonl line 3: answer 'Paris' holds no number, which match=numeric"):
        DatasetEnv(path=str(jsonl), match="numeric")


def test_a_test_file_is_checked_as_the_train_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", sums(2))
    with pytest.raises(ConfigError, match=r"test_path='.*missing\.jsonl': no such file"):
        DatasetEnv(path=str(train), test_path=str(tmp_path / "missing.jsonl"))
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "x"}])
    with pytest.raises(ConfigError, match=r"test\.jsonl line 1: has no answer column 'answer'"):
        DatasetEnv(path=str(train), test_path=str(test))


def test_a_dataset_dict_without_the_split_and_a_directory_that_is_no_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(sums(2))}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(ConfigError, match=r"a DatasetDict without a 'train' split \(splits: validation\)"):
        DatasetEnv(path=str(tmp_path / "d"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"not a dataset saved by datasets' save_to_disk"):
        DatasetEnv(path=str(tmp_path / "empty"))


def test_match_math_without_math_verify_names_the_extra(jsonl, monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ConfigError, match=r"match=math needs the math-verify package.*pip install 'omrl\[math\]'"):
        DatasetEnv(path=str(jsonl), match="math")


# -- through the CLI ----------------------------------------------------------------------------------------
SHORT = ["generation.max_new_tokens=4", "generation.max_context=256"]


def test_rollout_and_eval_through_the_cli(tmp_path, jsonl):
    out = tmp_path / "out.parquet"
    env = ["--env", "dataset", f"plugins.dataset.path={jsonl}", "--model", "tiny"]
    result = invoke("rollout", *env, *SHORT, "--num-tasks", "3", "--group-size", "2", "-o", str(out))
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert [ep.task_id for ep in episodes] == [0, 0, 1, 1, 2, 2] and {ep.env for ep in episodes} == {"dataset"}
    assert all(ep.turns[0].observation in {row["question"] for row in ROWS} for ep in episodes)

    expert = tmp_path / "expert.parquet"
    result = invoke(
        "rollout", *env, "--expert", "--num-tasks", "5", "-o", str(expert), "reward.weights={exact_match: 1}"
    )
    assert result.exit_code == 0, result.output
    assert [ep.rewards["exact_match"] for ep in read_episodes(expert)] == [[1.0]] * 5

    report = tmp_path / "report.json"
    result = invoke(
        "eval", *env, *SHORT, "plugins.dataset.test_fraction=0.4", "--num-tasks", "5", "--report", str(report)
    )
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["metrics"]["episodes"] == 2  # the test split's two rows


def test_a_bad_file_is_one_line_from_the_cli(tmp_path, capsys):
    from tests.helpers import cli_exit

    path = bad(tmp_path, '{"prompt": "a", "answer": "b"}\n{oops}\n')
    code, _, err = cli_exit(capsys, "rollout", "--env", "dataset", "--model", "tiny", f"plugins.dataset.path={path}")
    assert code != 0 and "qa.jsonl line 2: not valid JSON" in err and "Traceback" not in err


# -- does it learn? -------------------------------------------------------------------------------------------
LEARN_ENV = ["env.name=dataset", "env.max_turns=1", "plugins.dataset.match=numeric"]
LEARN_GEN = ["generation.max_new_tokens=10", "generation.max_context=256", "generation.batch_size=256"]


def sampled_accuracy(tmp_path, model: str, data, name: str, seed: int) -> float:
    """Mean success of 16 samples (temperature 1) of each of the file's prompts: the policy GRPO trains."""
    report = tmp_path / f"{name}.json"
    result = invoke(
        "eval",
        *LEARN_ENV,
        *LEARN_GEN,
        f"plugins.dataset.path={data}",
        f"model.name={model}",
        "env.split=train",
        "generation.temperature=1.0",
        f"seed={seed}",
        "--num-tasks",
        "10",
        "--samples",
        "16",
        "--report",
        str(report),
    )
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())["metrics"]["success_rate"]


def sft_then_grpo(tmp_path, seed: int = 0) -> tuple[float, float]:
    """The sampled accuracy of the `tiny` model on 10 sums after SFT on the expert's answers, and after
    20 GRPO steps from there, all through the CLI."""
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10) if a + b <= 9]
    random.Random(0).shuffle(rows)
    data = write_jsonl(tmp_path / "sums.jsonl", rows[:10])
    env = [*LEARN_ENV, *LEARN_GEN, f"plugins.dataset.path={data}", f"seed={seed}"]
    expert = tmp_path / "expert.parquet"
    assert invoke("rollout", *env, "--model", "tiny", "--expert", "--num-tasks", "10", "-o", str(expert)).exit_code == 0
    sft = tmp_path / "sft"
    result = invoke(
        "sft",
        "--model",
        "tiny",
        "--dataset",
        str(expert),
        "--output-dir",
        str(sft),
        f"seed={seed}",
        "num_train_epochs=40",
        "optim.learning_rate=2e-3",
        "optim.micro_batch_size=8",
        "optim.gradient_accumulation_steps=1",
        "max_seq_length=256",
        "packing=false",
        "logging.tensorboard=false",
    )
    assert result.exit_code == 0, result.output
    before = sampled_accuracy(tmp_path, str(sft), data, "before", seed)

    grpo = tmp_path / "grpo"
    result = invoke(
        "train",
        "--algo",
        "grpo",
        "--model",
        str(sft),
        "--output-dir",
        str(grpo),
        *env,
        "steps=20",
        "tasks_per_step=10",
        "group_size=16",
        "mini_batch_size=64",
        "ppo_epochs=2",
        "algorithm.kl_coef=0.0",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
        "reward.weights={goal: 1.0}",
        "optim.learning_rate=1e-3",
        "optim.micro_batch_size=64",
        "optim.share_prefix=false",  # one forward per row otherwise: 3x slower for this tiny model on CPU
        "model.gradient_checkpointing=false",
        "eval_tasks=0",
        "generation.temperature=1.0",
        "logging.tensorboard=false",
        "logging.save_rollouts=false",
    )
    assert result.exit_code == 0, result.output
    return before, sampled_accuracy(tmp_path, str(grpo), data, "after", seed)


@pytest.mark.slow
def test_grpo_raises_the_accuracy_of_the_tiny_model_on_a_file_of_sums(tmp_path):
    """SFT on the expert's answers to 10 sums teaches the reply format (and a few answers); 20 GRPO
    steps on the env's own reward then lift the share of right samples on those prompts by about 0.3
    (seeds 0-3: 0.250/0.300/0.175/0.294 -> 0.594/0.594/0.594/0.556). The model memorises: held-out sums
    stay near chance. About a minute on 2 idle CPU cores."""
    before, after = sft_then_grpo(tmp_path)
    assert after > before + 0.15, f"GRPO did not raise the accuracy: {before:.3f} -> {after:.3f}"
