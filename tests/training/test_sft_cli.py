"""``omrl sft`` and ``omrl data`` from the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from omrl.cli import build_app, main
from omrl.data import Episode, write_episodes
from tests.training.helpers import sft_command


def test_sft_flags_override_preset_and_key_values(tiny_model_dir, agent_jsonl, tmp_path):
    out = tmp_path / "run"
    args = [
        "sft",
        f"model.name={tiny_model_dir}",
        "optim.weight_decay=0.1",
        "optim.learning_rate=1e-3",
        "--dataset",
        str(agent_jsonl),
        "--output-dir",
        str(out),
        "--learning-rate",
        "1e-3",
        "--num-train-epochs",
        "1",
        "--per-device-train-batch-size",
        "4",
        "--gradient-accumulation-steps",
        "1",
        "--no-packing",
        "--max-seq-length",
        "200",
        "--logging-steps",
        "1",
        "--save-steps",
        "1",
    ]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "trained 2 steps" in result.output and str(out) in result.output
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["optim"] == {
        **cfg["optim"],
        "learning_rate": 1e-3,
        "weight_decay": 0.1,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
    }
    assert (cfg["packing"], cfg["max_seq_length"], cfg["logging"]["save_steps"]) == (False, 200, 1)
    assert cfg["description"].startswith("SFT on agent conversations")  # the default `sft` preset underneath
    assert (out / "model.safetensors").exists()


def test_a_flag_and_an_override_that_disagree_are_refused(tiny_model_dir, agent_jsonl, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "sft",
                f"model.name={tiny_model_dir}",
                "optim.learning_rate=0.5",
                "--learning-rate",
                "1e-3",
                "--dataset",
                str(agent_jsonl),
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
    assert info.value.code == 2
    assert "optim.learning_rate=0.5 and the flag for optim.learning_rate (0.001) disagree" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_run_on_a_model_folder_resumes_from_another_folder(tiny_model_dir, agent_jsonl, tmp_path, monkeypatch):
    """The model folder and the dataset are kept as absolute paths: ``../models/base`` and ``../data/a.jsonl``
    from elsewhere are the same model and data."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "base")
    (tmp_path / "data").mkdir()
    shutil.copy(agent_jsonl, tmp_path / "data" / "a.jsonl")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(build_app(), sft_command("models/base", "data/a.jsonl", Path("run"))).exit_code == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = sft_command("../models/base", "../data/a.jsonl", Path("../run"), "--resume")
    result = CliRunner().invoke(build_app(), again)
    assert result.exit_code == 0, result.output
    assert "it did them all: raise steps (or num_train_epochs) to train more" in " ".join(result.output.split())
    # nothing typed again: the run's config.yaml keeps the folder and the data as the checkpoints do
    # ('models/base' and 'data/a.jsonl' were not found from here, or refused as a changed model.name, dataset)
    result = CliRunner().invoke(build_app(), ["sft", "--resume", "--output-dir", "../run"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["dataset"] == str(
        tmp_path / "data" / "a.jsonl"
    )
    (tmp_path / "models").rename(tmp_path / "moved")  # the project moved: the kept absolute path is gone
    with pytest.warns(UserWarning, match="the run's model folder .* is gone; resuming on .*moved/base"):
        result = CliRunner().invoke(
            build_app(), sft_command("../moved/base", "../data/a.jsonl", Path("../run"), "--resume")
        )
    assert result.exit_code == 0, result.output


def test_a_finished_run_whose_final_save_was_cut_short_saves_it_on_resume(tiny_model_dir, agent_jsonl, tmp_path):
    """It said "it did them all" as if the model were there: a Ctrl-C during the final save left none."""
    command = sft_command(tiny_model_dir, agent_jsonl, tmp_path / "run")
    assert CliRunner().invoke(build_app(), command).exit_code == 0
    for name in ("config.json", "model.safetensors", "omrl_model.step"):  # as a save cut short leaves it
        (tmp_path / "run" / name).unlink()
    result = CliRunner().invoke(build_app(), [*command, "--resume"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "it did them all, but its final model was not saved after the last" in said
    assert (tmp_path / "run" / "omrl_model.step").read_text().strip() == re.search(r"at step (\d+) of", said)[1]
    assert "its final model was not saved" not in " ".join(
        CliRunner().invoke(build_app(), [*command, "--resume"]).output.split()
    )


def test_sft_resume_with_a_changed_flag_exits_2_naming_the_key(tiny_model_dir, agent_jsonl, tmp_path, capsys):
    base = sft_command(tiny_model_dir, agent_jsonl, tmp_path)
    assert CliRunner().invoke(build_app(), base).exit_code == 0
    with pytest.raises(SystemExit) as info:
        main([*base, "--learning-rate", "0.01", "--resume"])
    assert info.value.code == 2
    assert (
        "cannot resume: the config differs from the checkpoint's in optim.learning_rate: 2e-05 -> 0.01"
        in capsys.readouterr().err.replace("\n", "")
    )


def test_sft_bad_dataset_row_exits_2_with_file_and_row(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]}\n')
    with pytest.raises(SystemExit) as info:
        main(["sft", f"model.name={tiny_model_dir}", "--dataset", str(bad), "--output-dir", str(tmp_path / "o")])
    assert info.value.code == 2
    assert f"{bad} row 1 message 1: unknown role 'bot'" in capsys.readouterr().err.replace("\n", "")


def test_data_convert_and_show(tmp_path):
    messages = [{"role": "user", "content": "Find [red] shoes"}, {"role": "assistant", "content": "search[red shoes]"}]
    episodes = [
        Episode(env="webshop", task_id=i, split="train", instruction="x", messages=messages, score=float(i))
        for i in range(3)
    ]
    traj = write_episodes(episodes, tmp_path / "traj.parquet")
    out = tmp_path / "good.jsonl"
    runner, app = CliRunner(), build_app()
    result = runner.invoke(app, ["data", "convert", str(traj), str(out), "--min-reward", "1", "--style", "sharegpt"])
    assert result.exit_code == 0, result.output
    assert "wrote 2 conversations, mean reward 1.500" in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in records] == [1, 2] and records[0]["conversations"][0]["from"] == "human"
    shown = runner.invoke(app, ["data", "show", str(out), "-n", "1"])
    assert shown.exit_code == 0 and "Find [red] shoes" in shown.output and "2 conversations" in shown.output
