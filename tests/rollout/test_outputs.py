"""No command writes over one of its inputs or over a run's own files, and each says so before any work."""

from __future__ import annotations

import json

import pytest

from omrl.cli import main
from tests.helpers import cli_exit, keys_eval, keys_rollout, tmpfs


def refused(capsys, *args: str) -> str:
    """Run the real CLI; it must exit 2 with one line on stderr, which is returned (whitespace joined)."""
    code, _, err = cli_exit(capsys, *args)
    assert code == 2
    assert "Traceback" not in err and "bug in omrl" not in err
    return " ".join(err.split())


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as training leaves it: metrics, config, a checkpoint, a step's rollout, the model."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "checkpoints" / "step-00000001" / "state.json").write_text('{"step": 1}')
    (run / "rollouts").mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "model.safetensors").write_bytes(b"weights")
    (run / "config.json").write_text("{}")
    return run


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rollout_refuses_an_output_named_like_its_readable_jsonl(fake_plugins, tmp_path, capsys):
    out = tmp_path / "expert.jsonl"
    message = refused(capsys, *keys_rollout(1, "--expert", "-o", str(out)))
    assert f"--output {out} names the readable JSONL" in message and "expert.parquet" in message
    assert not out.exists()


@pytest.mark.parametrize("name", ["expert.json", "expert.csv", "expert"])
def test_rollout_refuses_an_output_that_is_not_a_parquet_name(fake_plugins, tmp_path, capsys, name):
    """view, sft and data read a trajectory file by its suffix: parquet bytes under another name were
    written, then refused by each of them."""
    out = tmp_path / name
    message = refused(capsys, *keys_rollout(1, "--expert", "-o", str(out)))
    assert f"--output {out} names no .parquet file; valid: a .parquet path" in message and not out.exists()


def test_rollout_refuses_to_write_into_a_runs_rollouts(fake_plugins, run_dir, capsys):
    step = run_dir / "rollouts" / "step-00000001.parquet"
    step.write_bytes(b"the run's own trajectories")
    before = snapshot(run_dir)
    message = refused(capsys, *keys_rollout(1, "--expert", "-o", str(step)))
    assert "inside the run's rollouts/" in message
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("name", ["model.safetensors", "metrics.jsonl", "config.yaml", "config.json"])
def test_eval_refuses_a_report_over_a_runs_files_before_loading_anything(fake_plugins, run_dir, capsys, name):
    before = snapshot(run_dir)
    message = refused(capsys, *keys_eval(1, "--report", str(run_dir / name)))
    assert f"--report {run_dir / name} is" in message and "would destroy it" in message
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    "name",
    [
        "metrics.jsonl",
        "config.yaml",
        "model.safetensors",
        "rollouts/step-00000001.parquet",
        "checkpoints/step-00000001/state.json",
        ".",
    ],
)
def test_view_out_never_replaces_a_file_of_the_run(run_dir, capsys, name):
    before = snapshot(run_dir)
    message = refused(capsys, "view", str(run_dir), "--out", str(run_dir / name))
    assert "--out" in message
    assert snapshot(run_dir) == before


def test_view_out_refuses_the_trajectory_it_shows(tmp_path, capsys):
    from omrl.data import write_episodes
    from omrl.data.trajectory import Episode

    path = write_episodes([Episode(env="keys", task_id=0, split="test", instruction="")], tmp_path / "t.parquet")
    before = path.read_bytes()
    assert "is the viewed path itself" in refused(capsys, "view", str(path), "--out", str(path))
    assert path.read_bytes() == before


def test_view_out_is_an_html_file_never_another_kind(tmp_path, capsys):
    """A trajectory file the view does not read (another rollout's) was replaced by the page."""
    from omrl.data import write_episodes
    from omrl.data.trajectory import Episode

    shown = write_episodes([Episode(env="keys", task_id=0, split="test", instruction="")], tmp_path / "t.parquet")
    other = write_episodes([Episode(env="keys", task_id=1, split="test", instruction="")], tmp_path / "o.parquet")
    before = other.read_bytes()
    assert "give a path ending in .html" in refused(capsys, "view", str(shown), "--out", str(other))
    assert other.read_bytes() == before


def test_view_out_beside_the_runs_files_is_written(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["view", str(run_dir), "--out", str(run_dir / "page.html")])
    assert exit_info.value.code in (0, None)
    assert (run_dir / "page.html").read_text().startswith("<!")


def test_data_convert_refuses_the_source_and_a_runs_files(run_dir, tmp_path, capsys):
    source = tmp_path / "sft.jsonl"
    source.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    assert "is the source itself" in refused(capsys, "data", "convert", str(source), str(source))
    before = snapshot(run_dir)
    assert "a run's metrics.jsonl" in refused(capsys, "data", "convert", str(source), str(run_dir / "metrics.jsonl"))
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    "command, flag, target, expected",
    [
        ("eval", "--report", "model.safetensors", "model weights"),  # a report over the reward model's weights
        ("train", "--output-dir", ".", "output_dir {run} overlaps the input --model"),  # a run over its base model
    ],
)
def test_rm_refuses_to_write_over_its_model(run_dir, tmp_path, capsys, command, flag, target, expected):
    before = snapshot(run_dir)
    data = tmp_path / "d.parquet"
    message = refused(capsys, "rm", command, "--model", str(run_dir), "--data", str(data), flag, str(run_dir / target))
    assert expected.format(run=run_dir) in message
    assert snapshot(run_dir) == before


def test_sweep_refuses_an_out_that_is_a_file_or_inside_a_runs_checkpoints(fake_plugins, run_dir, capsys):
    before = snapshot(run_dir)
    assert "is a file" in refused(
        capsys, "sweep", "--env", "keys", "--model", "tiny", "--out", str(run_dir / "metrics.jsonl")
    )
    assert "inside the run's checkpoints/" in refused(
        capsys, "sweep", "--env", "keys", "--model", "tiny", "--out", str(run_dir / "checkpoints")
    )
    assert snapshot(run_dir) == before


def test_train_and_sft_never_write_a_run_over_their_base_model_or_dataset(tmp_path, tiny_model_dir, capsys):
    """`omrl train`/`omrl sft` with output_dir the model they start from (or their dataset) stop before
    any work, naming the overlap."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    before = snapshot(base)
    message = refused(capsys, "train", "--model", str(base), "--env", "gridworld", "--output-dir", str(base))
    assert "overlaps the input --model" in message and snapshot(base) == before
    data = tmp_path / "data.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    message = refused(capsys, "sft", "--model", "tiny", "--dataset", str(data), "--output-dir", str(data))
    assert "overlaps the input --dataset" in message


@pytest.fixture
def unwritable(tmp_path):
    """A folder nothing can be written in: read-only to a user, a read-only mount for root (which
    permissions do not stop)."""
    import os

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    with tmpfs(folder, "size=1m,ro"):
        yield folder


def test_rollout_and_eval_refuse_an_unwritable_folder_before_playing(fake_plugins, unwritable, capsys):
    """They played every episode (hours with a real model), then failed to write, the results unprinted."""
    code, _, err = cli_exit(capsys, *keys_rollout(2, "--expert", "-o", str(unwritable / "e.parquet")))
    assert code == 2 and f"cannot be written: the folder {unwritable} is not writable" in " ".join(err.split()), err
    code, out, err = cli_exit(capsys, *keys_eval(2, "--output-dir", str(unwritable / "ev")))
    assert code == 2 and f"the folder {unwritable} is not writable" in " ".join(err.split()), err
    assert "success" not in out  # refused before any episode


def test_an_atomic_write_refused_by_its_folder_names_the_file_asked_for(unwritable):
    """It named its random temporary sibling (.e.parquet.9pgdezzq.tmp)."""
    from omrl.atomic import atomic_write_text

    with pytest.raises(OSError) as refused:
        atomic_write_text(unwritable / "report.json", "{}")
    assert refused.value.filename == str(unwritable / "report.json")
