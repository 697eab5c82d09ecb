"""``omrl rm train`` / ``omrl rm eval`` on trajectories holding a token id the tokenizer does not have
(a -1, or an id of another vocabulary, as a bad server's answer was once written): refused when the data
is loaded, naming the file, the row and the id, before any training or scoring, never "a bug in omrl"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omrl.data import read_episodes, write_episodes
from tests.helpers import cli_exit, expert_and_model_episodes, invoke

TRAIN = [
    "--model",
    "tiny",
    "--kind",
    "orm",
    "--label",
    "success",
    "--num-train-epochs",
    "1",
    "optim.micro_batch_size=4",
    "packing=false",
    "logging.tensorboard=false",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Gridworld episodes with both outcomes on the tiny tokenizer: the expert's (won), the model's (lost)."""
    out = tmp_path_factory.mktemp("rm-bad-data")
    won, lost = expert_and_model_episodes(3)
    write_episodes(won + lost, out / "good.parquet")
    return out


def _with_bad_id(source: Path, target: Path, row: int, token: int) -> Path:
    """``source`` with the first reply token of episode ``row`` replaced by ``token``."""
    episodes = read_episodes(source)
    ep = episodes[row]
    ep.token_ids[ep.turns[0].span[0]] = token
    write_episodes(episodes, target)
    return target


def _exit_2(args: list[str], capsys) -> str:
    code, _, err = cli_exit(capsys, *args)
    err = " ".join(err.split())
    assert code == 2 and "bug in omrl" not in err, err
    return err


@pytest.mark.parametrize("token", [-1, 4096, 151_000])
def test_rm_train_refuses_an_id_outside_the_vocabulary_naming_file_row_and_id(data_dir, tmp_path, capsys, token):
    bad = _with_bad_id(data_dir / "good.parquet", tmp_path / "bad.parquet", row=4, token=token)
    err = _exit_2(["rm", "train", *TRAIN, "--data", str(bad), "--output-dir", str(tmp_path / "rm")], capsys)
    assert (
        f"{bad} row 4 (task " in err
        and f"holds the token id {token}, outside the tokenizer's vocabulary (0 to 4095)" in err
    ), err
    assert not (tmp_path / "rm" / "model.safetensors").exists()


def test_rm_train_checks_the_eval_data_before_training(data_dir, tmp_path, capsys):
    bad = _with_bad_id(data_dir / "good.parquet", tmp_path / "held_out.parquet", row=1, token=-1)
    err = _exit_2(
        [
            "rm",
            "train",
            *TRAIN,
            "--data",
            str(data_dir / "good.parquet"),
            "--eval-data",
            str(bad),
            "--output-dir",
            str(tmp_path / "rm"),
        ],
        capsys,
    )
    assert f"{bad} row 1 (task " in err and "holds the token id -1" in err, err
    assert not (tmp_path / "rm" / "model.safetensors").exists()  # refused before any step


def test_rm_eval_refuses_an_id_outside_the_vocabulary_before_scoring(data_dir, tmp_path, capsys):
    rm = tmp_path / "rm"
    result = invoke("rm", "train", *TRAIN, "--data", str(data_dir / "good.parquet"), "--output-dir", str(rm))
    assert result.exit_code == 0, result.output
    bad = _with_bad_id(data_dir / "good.parquet", tmp_path / "bad.parquet", row=2, token=99_999)
    err = _exit_2(["rm", "eval", "--model", str(rm), "--data", str(bad)], capsys)
    assert f"{bad} row 2 (task " in err and "holds the token id 99999" in err, err
    assert not list(rm.glob("rm_eval*.json"))
    # data of one outcome: eval warns its auc means nothing, and writes its own report beside train's
    won = [ep for ep in read_episodes(data_dir / "good.parquet") if ep.won]
    write_episodes(won, tmp_path / "won.parquet")
    with pytest.warns(UserWarning, match=r"won.parquet has the same outcome, so auc and pair") as caught:
        result = invoke("rm", "eval", "--model", str(rm), "--data", str(tmp_path / "won.parquet"))
    # omrl's own warning, said as one (it was located in typer's main.py, and printed with that file and line)
    assert [w.filename for w in caught if "same outcome" in str(w.message)][0].endswith("rm_cmd.py")
    assert result.exit_code == 0 and (rm / "rm_eval-won.json").exists(), result.output
    # no pair: no accuracy (it was NaN in the table, and NaN in the JSON, which JSON readers refuse)
    assert json.loads((rm / "rm_eval-won.json").read_text())["pairs"]["accuracy"] is None
    assert "nan" not in result.output
    # the reward model carries a manifest too: a flipped byte in it is named, not scored with
    weights = rm / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    err = _exit_2(["rm", "eval", "--model", str(rm), "--data", str(data_dir / "good.parquet")], capsys)
    assert "is damaged: model.safetensors changed since it was written" in err, err
    # and so does every other load of it (a reward plugin or a search scorer during training)
    from omrl.errors import DamagedModelError
    from omrl.rm.model import RewardModel

    with pytest.raises(DamagedModelError, match="model.safetensors changed since it was written"):
        RewardModel.load(rm)


def test_rm_eval_names_what_is_wrong_with_model_or_data(data_dir, tmp_path, capsys):
    """Both were given; the error said both were needed."""
    err = _exit_2(["rm", "eval", "--model", "tiny", "--data", str(data_dir / "good.parquet")], capsys)
    assert "--model 'tiny' is not a folder; give a reward model directory that `omrl rm train` wrote" in err, err
    err = _exit_2(["rm", "eval", "--model", str(tmp_path)], capsys)
    assert "omrl rm eval needs --data" in err and "--model" not in err, err


def test_rm_eval_on_a_policy_model_is_refused_before_transformers_loads_it(data_dir, tiny_model_dir):
    """transformers printed its report of the score head the policy lacks, then the error came (its own
    logging reaches the console of a real process, not pytest's capture)."""
    import subprocess
    import sys

    args = ["rm", "eval", "--model", tiny_model_dir, "--data", str(data_dir / "good.parquet")]
    done = subprocess.run([sys.executable, "-m", "omrl", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not an omrl reward model" in done.stderr
    assert "LOAD REPORT" not in done.stdout + done.stderr and "MISSING" not in done.stdout + done.stderr


def test_rm_train_and_eval_refuse_a_trajectory_file_cut_down_to_fewer_columns(data_dir, tmp_path, capsys):
    """Without won its wins would train as losses; without turns or rewards it was "a bug in omrl"."""
    import pyarrow.parquet as pq

    whole = pq.read_table(data_dir / "good.parquet")  # dropping a column keeps the omrl.schema tag
    for column in ("won", "rewards"):
        pq.write_table(whole.drop_columns([column]), tmp_path / f"no_{column}.parquet")
    rm = tmp_path / "rm"
    err = _exit_2(["rm", "train", *TRAIN, "--data", str(tmp_path / "no_won.parquet"), "--output-dir", str(rm)], capsys)
    assert f"{tmp_path / 'no_won.parquet'} lacks the column(s) won: it is not a whole omrl trajectory file" in err
    assert not (rm / "model.safetensors").exists()
    result = invoke("rm", "train", *TRAIN, "--data", str(data_dir / "good.parquet"), "--output-dir", str(rm))
    assert result.exit_code == 0, result.output
    err = _exit_2(["rm", "eval", "--model", str(rm), "--data", str(tmp_path / "no_rewards.parquet")], capsys)
    assert f"{tmp_path / 'no_rewards.parquet'} lacks the column(s) rewards: it is not a whole omrl trajectory" in err


def test_rm_train_reads_the_eval_labels_before_training(data_dir, tmp_path, capsys):
    """Held-out data without labels for the model (here none at all) fails before step 1, not after the run."""
    empty = write_episodes([], tmp_path / "no_rows.parquet")
    rm = tmp_path / "rm"
    args = ["--data", str(data_dir / "good.parquet"), "--eval-data", str(empty), "--output-dir", str(rm)]
    err = _exit_2(["rm", "train", *TRAIN, *args], capsys)
    assert f"{empty} has no finished episode with 'success' labels (episodes: 0, finished: 0)" in err, err
    assert not (rm / "model.safetensors").exists() and not (rm / "metrics.jsonl").exists()


def test_rm_train_on_a_rollouts_readable_jsonl_points_at_its_parquet(data_dir, tmp_path, capsys):
    """It said the JSONL was 'truncated, damaged or not a parquet file'."""
    (tmp_path / "train.parquet").write_bytes((data_dir / "good.parquet").read_bytes())
    (tmp_path / "train.jsonl").write_text("{}\n")
    err = _exit_2(["rm", "train", *TRAIN, "--data", str(tmp_path / "train.jsonl")], capsys)
    assert "train.jsonl is a JSONL file; reward models train on the trajectory .parquet" in err
    assert f"use {tmp_path / 'train.parquet'} beside it" in err and "damaged" not in err
