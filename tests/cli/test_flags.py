"""What a flag or an override says is what the command uses: none is dropped or bent on the way."""

from __future__ import annotations

import pytest

# the first error each command meets after it has read --budget: an output under a file (-o: eval's --output-dir too)
PAST_THE_BUDGET = {"rollout": ("-o", "{file}/x.parquet"), "eval": ("-o", "{file}/sub")}


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("command", PAST_THE_BUDGET)
def test_budget_0_replaces_a_presets_budget(command, omrl_main, no_model, a_file, tmp_path):
    preset = tmp_path / "small-budget.yaml"
    preset.write_text("rollout:\n  budget: 5\n")  # smaller than one reply: refused when it is used
    where = [w.format(file=a_file) for w in PAST_THE_BUDGET[command]]
    words = (command, str(preset), "--env", "gridworld", "--model", "tiny", *where)
    code, _, err = omrl_main(*words)
    assert code == 2 and "budget 5 is smaller than one reply" in err
    code, _, err = omrl_main(*words, "--budget", "0")
    assert code == 2 and f"{a_file} is a file, not a folder" in err, err  # past the budget: 0 was used


@pytest.mark.parametrize("command", PAST_THE_BUDGET)
def test_budget_0_and_an_override_of_the_budget_disagree(command, omrl_main, no_model, a_file, tmp_path):
    where = [w.format(file=a_file) for w in PAST_THE_BUDGET[command]]
    code, _, err = omrl_main(command, "--env", "gridworld", "--model", "tiny", "rollout.budget=200", "--budget", "0",
                             *where)  # fmt: skip
    assert code == 2
    assert "the override rollout.budget=200 and the flag for rollout.budget (0) disagree" in err


@pytest.mark.parametrize("command", ["rollout", "eval", "train"])
def test_a_plugins_block_no_plugin_reads_is_refused_naming_a_close_match(command, omrl_main, no_model, tmp_path):
    """plugins.gridwrld.size=5 used to play the default grid, silently."""
    out = ("-o", str(tmp_path / "t.parquet")) if command == "rollout" else ("--output-dir", str(tmp_path / "out"))
    code, _, err = omrl_main(command, "--env", "gridworld", "--model", "tiny", "plugins.gridwrld.size=5", *out)
    assert code == 2, err
    assert "plugins.gridwrld: no env, template, reward, strategy, scorer or algorithm is named gridwrld" in err
    assert "did you mean plugins.gridworld?" in err
    assert list(tmp_path.iterdir()) == []


def test_a_plugins_block_of_an_env_family_member_is_read(omrl_main, no_model, tmp_path):
    """Options are looked up by the whole registered name, colon and all: such a block is valid."""
    taken = tmp_path / "afile"
    taken.write_text("")
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--expert", "plugins.babyai:GoToDoor.seed=1",
                             "plugins.gridworld.size=5", "-o", str(taken / "t.parquet"))  # fmt: skip
    assert code == 2 and f"{taken} is a file, not a folder" in err, err  # past the plugins check


def test_eval_samples_0_is_refused_naming_samples(omrl_main, no_model, tmp_path):
    """It used to load the model, play, then fail on group_size, a key the user never typed."""
    code, _, err = omrl_main("eval", "--env", "gridworld", "--model", "tiny", "--samples", "0",
                             "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert code == 2 and "Invalid value for '--samples'" in err, err


@pytest.mark.parametrize("value", ["0", "-2"])
def test_eval_samples_per_task_below_1_is_refused_before_the_model_loads(omrl_main, no_model, tmp_path, value):
    code, _, err = omrl_main("eval", "--env", "gridworld", "--model", "tiny", f"samples_per_task={value}",
                             "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert code == 2 and f"samples_per_task must be >= 1 (samples of each task), got {value}" in err, err


def test_debug_after_the_command_is_taken(omrl_main, tmp_path):
    code, _, err = omrl_main("plot", str(tmp_path / "nonexist"), "--debug")
    assert code == 2 and "No such option" not in err, err
    assert "Traceback" in err  # --debug: the traceback, not one line


def test_plugins_help_names_every_kind(omrl_main):
    from omrl import registry

    code, out, _ = omrl_main("plugins", "--help")
    kinds = [kind for found in registry.ALL.values() for kind in found.kinds]
    assert code == 0 and [kind for kind in kinds if kind not in " ".join(out.split())] == []


def test_a_preset_for_rm_eval_names_the_command_as_typed(omrl_main, tmp_path):
    preset = tmp_path / "rme.yaml"
    preset.write_text("command: rm-eval\n")
    code, _, err = omrl_main("eval", str(preset))
    assert code == 2 and "is for `omrl rm eval`, not `omrl eval`" in err, err


def test_rollout_refuses_an_output_that_would_replace_the_dataset_it_reads(omrl_main, no_model, tmp_path):
    """-o data/qa.parquet wrote its readable JSONL over data/qa.jsonl, the env's own questions, and exited 0."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text('{"question": "What is 17 + 25?", "answer": "42"}\n')
    code, _, err = omrl_main("rollout", "--env", "dataset", "--expert", f"plugins.dataset.path={questions}",
                             "-o", str(tmp_path / "qa.parquet"))  # fmt: skip
    err = " ".join(err.split())
    assert code == 2 and f"the readable JSONL {questions} is plugins.dataset.path itself" in err, err
    assert questions.read_text() == '{"question": "What is 17 + 25?", "answer": "42"}\n'


@pytest.mark.parametrize("command", [("train",), ("sft",), ("rm", "train")])
def test_dash_o_is_the_output_folder_of_every_command_that_writes_one(command, omrl_main, no_model, a_file):
    code, _, err = omrl_main(*command, "-o", str(a_file / "run"))
    assert code == 2 and f"{a_file} is a file, not a folder" in err, err


@pytest.mark.parametrize(
    "words, flag",
    [
        (("rollout", "--group-size", "0"), "--group-size"),
        (("rollout", "--num-tasks", "0"), "--num-tasks"),
        (("eval", "--num-tasks", "0"), "--num-tasks"),
        (("sweep", "--num-tasks", "0"), "--num-tasks"),
        (("train", "--steps", "0"), "--steps"),
    ],
)
def test_a_count_flag_below_1_is_refused_naming_the_flag(words, flag, omrl_main, no_model):
    code, _, err = omrl_main(*words)
    assert code == 2 and f"Invalid value for '{flag}'" in err, err
