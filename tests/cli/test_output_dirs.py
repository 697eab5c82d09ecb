"""Where a training command writes its run: never over a folder's model or config the user keeps there."""

from __future__ import annotations

import pytest

TRAINERS = {
    "train": ("train", "--env", "gridworld"),
    "sft": ("sft", "--dataset", "data.jsonl"),
    "rm train": ("rm", "train", "--data", "episodes.parquet"),
}


def train_into(omrl_main, command: str, folder, name: str, text: str) -> tuple[int, str]:
    """``command`` of the tiny model into a new ``folder`` holding the file ``name`` (``text``): its exit
    status and stderr."""
    folder.mkdir()
    (folder / name).write_text(text)
    code, _, err = omrl_main(*TRAINERS[command], "--model", "tiny", "--output-dir", str(folder))
    return code, err


@pytest.mark.parametrize("command", TRAINERS)
@pytest.mark.parametrize("kept", ["config.json", "model.safetensors", "tokenizer.json", "config.yaml"])
def test_a_folder_holding_a_model_or_a_config_is_refused_as_a_new_run(command, kept, omrl_main, no_model, tmp_path):
    """``--output-dir hfmodel`` used to write the run's model and config.yaml over the files kept there."""
    folder = tmp_path / "hfmodel"
    code, err = train_into(omrl_main, command, folder, kept, "the user's own")
    assert code == 2, err
    assert f"output_dir {folder} is not a run but holds {kept}" in " ".join(err.split())
    assert [p.name for p in folder.iterdir()] == [kept] and (folder / kept).read_text() == "the user's own"


@pytest.mark.parametrize("command", TRAINERS)
@pytest.mark.parametrize("name", ["checkpoints", "rollouts"])
def test_a_file_where_the_run_writes_a_folder_is_refused_before_training(command, name, omrl_main, no_model, tmp_path):
    """It was found at the first save, after the steps before it were trained, as "a bug in omrl" (exit 1)."""
    folder = tmp_path / "run"
    code, err = train_into(omrl_main, command, folder, name, "mine")
    assert code == 2, err
    assert f"output_dir {folder} holds a file named {name}, where the run writes its {name} folder" in " ".join(
        err.split()
    )
    assert (folder / name).read_text() == "mine"


def test_plot_refuses_a_file_as_its_folder(omrl_main, tmp_path):
    """It used to crash as "a bug in omrl" (a folder made under the file), exit 1."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    code, _, err = omrl_main("plot", str(run), "-o", str(taken))
    assert code == 2, err
    assert f"--out {taken} is a file; give a folder" in " ".join(err.split())
    assert taken.read_text() == "mine" and not (run / "plots").exists()


@pytest.mark.parametrize("command", TRAINERS)
def test_resume_without_an_output_dir_is_refused(command, omrl_main, no_model, tmp_path, monkeypatch):
    """sft and rm train used to resume into a fresh default folder, then say it held nothing to resume."""
    monkeypatch.chdir(tmp_path)
    code, _, err = omrl_main(*TRAINERS[command], "--model", "tiny", "--resume")
    assert code == 2 and "--resume needs --output-dir: the run directory to continue" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", TRAINERS)
def test_resume_into_a_folder_that_is_not_there_says_so_first(command, omrl_main, no_model, tmp_path):
    """sft said "no dataset given" of a run folder mistyped."""
    gone = tmp_path / "runs" / "typo"
    code, _, err = omrl_main(*TRAINERS[command], "--model", "tiny", "--resume", "--output-dir", str(gone))
    assert code == 2 and f"nothing to resume: no folder {gone}; run without --resume" in err, err
    assert not gone.exists()


@pytest.mark.parametrize("command", TRAINERS)
def test_resume_of_a_folder_that_holds_no_run_says_so_before_the_settings(command, omrl_main, no_model, tmp_path):
    """The settings of a run it would not play came first, then "no complete checkpoint"."""
    (tmp_path / "notes").mkdir()
    code, out, err = omrl_main(*TRAINERS[command], "--resume", "--output-dir", str(tmp_path / "notes"))
    assert code == 2 and f"nothing to resume: {tmp_path / 'notes'} holds no run (no config.yaml" in err, err
    assert "worked example" not in out + err and "algorithm  " not in out + err  # no settings of a run it cannot resume
