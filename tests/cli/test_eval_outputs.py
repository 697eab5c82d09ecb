"""``omrl eval`` keeps every episode it plays, in a folder of its own, and samples where it must."""

from __future__ import annotations

import json
import warnings

from omrl.data import read_episodes

TINY_GRIDWORLD = ("eval", "--env", "gridworld", "--model", "tiny", "generation.max_new_tokens=4", "env.max_turns=2")


def test_eval_writes_its_report_and_every_episode_to_a_new_folder(omrl_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = omrl_main(*TINY_GRIDWORLD, "--num-tasks", "2")
    assert code == 0, err
    (folder,) = (tmp_path / "evals").iterdir()
    assert folder.name.startswith("tiny-gridworld-")
    report = json.loads((folder / "report.json").read_text())
    episodes = read_episodes(folder / "episodes.parquet")
    assert [(ep.task_id, ep.num_turns) for ep in episodes] == [(e["task_id"], e["turns"]) for e in report["episodes"]]
    assert all(ep.turns[0].observation for ep in episodes)  # turn by turn, not a summary line
    assert len((folder / "episodes.jsonl").read_text().splitlines()) == 2
    assert f"omrl view {folder.relative_to(tmp_path)}/episodes.parquet" in out


def test_a_named_output_dir_and_a_report_path(omrl_main, tmp_path):
    code, _, err = omrl_main(*TINY_GRIDWORLD, "--num-tasks", "1", "--output-dir", str(tmp_path / "mine"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        "episodes.jsonl",
        "episodes.parquet",
        "report.json",
    ]
    code, _, err = omrl_main(*TINY_GRIDWORLD, "--num-tasks", "1", "--report", str(tmp_path / "r.json"))
    assert code == 0, err
    assert len(read_episodes(tmp_path / "r.episodes.parquet")) == 1


def test_eval_never_writes_into_a_model_directory(omrl_main, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    code, _, err = omrl_main(*TINY_GRIDWORLD, "--output-dir", str(model))
    assert code == 2
    assert f"the eval output {model} is a model directory" in err
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]


def test_several_samples_and_searches_sample_by_default(omrl_main, tmp_path):
    code, out, err = omrl_main(
        *TINY_GRIDWORLD, "--num-tasks", "1", "--samples", "2", "--output-dir", str(tmp_path / "a")
    )
    assert code == 0, err
    assert "generation.temperature=1: --samples 2 samples its replies" in out
    assert len(read_episodes(tmp_path / "a" / "episodes.parquet")) == 2
    args = ("--num-tasks", "1", "--strategy", "mcts", "--budget", "32", "--output-dir", str(tmp_path / "b"))
    code, out, err = omrl_main(*TINY_GRIDWORLD, *args)
    assert code == 0, err
    assert "generation.temperature=1: strategy mcts samples its replies" in out
    # a chain under a budget is one chain a sample: greedy, as without one (pass@1 changed with a --budget)
    args = ("--num-tasks", "1", "--budget", "64", "--output-dir", str(tmp_path / "c"))
    code, out, err = omrl_main(*TINY_GRIDWORLD, *args)
    assert code == 0 and "samples its replies" not in out, err
    assert json.loads((tmp_path / "c" / "report.json").read_text())["config"]["generation"]["temperature"] == 0


def test_a_greedy_choice_of_the_users_is_kept_and_refused_with_samples(omrl_main, tmp_path):
    code, _, err = omrl_main(*TINY_GRIDWORLD, "--samples", "2", "generation.temperature=0")
    assert code == 2
    assert "--samples 2 with greedy decoding gives the same sample every time" in err


def test_warnings_print_as_one_line_without_source(omrl_main, capsys):
    omrl_main("--version")
    warnings.warn("a [bracketed] note", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert "warning: UserWarning: a [bracketed] note (test_eval_outputs.py:" in err
    assert "warnings.warn(" not in err  # no source line
