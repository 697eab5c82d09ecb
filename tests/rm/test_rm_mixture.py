"""``omrl rm train`` on several trajectory datasets with weights (omrl.data.mixture): a policy's losses
beside an expert's wins, pairs drawn per dataset, and a bad mixture refused before the model loads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from omrl.config import load_config
from omrl.config.options import RmTrainRunConfig
from omrl.data import write_episodes
from omrl.errors import ConfigError, OmrlError
from omrl.rm.labels import LabelError
from omrl.rm.train import RmRecipe, run_rm_train
from tests.helpers import expert_and_model_episodes, invoke

QUIET = Console(file=io.StringIO())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Gridworld episodes on the tiny tokenizer: the expert's wins and the tiny model's losses (two samples a
    task) of 4 train tasks, in one file each, and as two directories of both, tasks 0-1 and tasks 2-3."""
    out = tmp_path_factory.mktemp("rm-mix")
    won, lost = expert_and_model_episodes(4, group_size=2)
    for ep in won:
        ep.sample = 2
    write_episodes(won, out / "expert.parquet")
    write_episodes(lost, out / "model.parquet")
    for name, tasks in (("first", {0, 1}), ("second", {2, 3})):
        write_episodes([ep for ep in won if ep.task_id in tasks], out / name / "expert.parquet")
        write_episodes([ep for ep in lost if ep.task_id in tasks], out / name / "model.parquet")
    return out


def config(dataset: str, out: Path, *overrides: str) -> RmTrainRunConfig:
    return load_config(
        RmTrainRunConfig,
        None,
        [
            *("model.name=tiny", f"dataset={dataset}", f"logging.output_dir={out}", "optim.learning_rate=1e-3"),
            *("optim.micro_batch_size=4", "num_train_epochs=1", "packing=false", "logging.tensorboard=false"),
            *overrides,
        ],
    )


def test_an_outcome_model_trains_on_an_experts_wins_mixed_with_a_policys_losses(data_dir, tmp_path):
    expert, model = data_dir / "expert.parquet", data_dir / "model.parquet"
    with pytest.raises(LabelError, match="every label in .*expert.parquet is 1.0"):
        run_rm_train(config(str(expert), tmp_path / "alone"))  # one outcome alone teaches nothing

    out = tmp_path / "mixed"
    result = invoke("rm", "train", *("--data", f"{expert}:0.4,{model}:0.6"), *_cli_settings(out))
    assert result.exit_code == 0, result.output
    # 4 wins and 8 losses: 12 examples, 40% of them wins (4.8 -> 5) and 60% losses (7.2 -> 7)
    mix = json.loads((out / "data_mix.json").read_text())["sources"]
    assert [(s["dataset"], s["examples"], s["drawn"]) for s in mix] == [(str(expert), 4, 5), (str(model), 8, 7)]
    assert "trained the orm reward model on 12 examples" in result.output
    assert f"{expert} (weight 0.40): 5 drawn of 4 examples" in result.output


def _cli_settings(out: Path) -> list[str]:
    return [
        *("--model", "tiny", "--output-dir", str(out), "--num-train-epochs", "1", "optim.micro_batch_size=4"),
        *("packing=false", "logging.tensorboard=false"),
    ]


@pytest.mark.slow
def test_bradley_terry_draws_pairs_each_dataset_makes_of_its_own_episodes(data_dir, tmp_path):
    first, second = data_dir / "first", data_dir / "second"
    summary = run_rm_train(config(f"{first}:3,{second}:1", tmp_path / "bt", "objective=bt"), console=QUIET)
    # each directory pairs its win with each of its 2 losses on 2 tasks: 4 pairs each, 8 in all, 6 and 2 drawn
    assert [(s["pairs"], s["drawn"]) for s in summary["data_mix"]] == [(4, 6), (4, 2)]
    assert summary["steps"] == 2  # 8 pairs, 4 a micro-batch

    with pytest.raises(
        OmrlError, match=r"model.parquet \(in a mixture each dataset pairs its own episodes\) has no task"
    ):
        run_rm_train(config(f"{first}:0.5,{data_dir / 'model.parquet'}:0.5", tmp_path / "no-pairs", "objective=bt"))


@pytest.mark.parametrize(
    "spec, match",
    [
        ("{e}:0.5,{e}:0.5", "is named twice in the mixture"),
        ("{e}:0.5,{gone}:0.5", "gone.parquet' does not exist"),
        ("{e}:0,{m}", "has weight 0.0; a weight must be a positive number"),
    ],
)
def test_a_bad_mixture_is_refused_before_the_model_loads(data_dir, tmp_path, spec, match):
    text = spec.format(e=data_dir / "expert.parquet", m=data_dir / "model.parquet", gone=tmp_path / "gone.parquet")
    recipe = RmRecipe(config(text, tmp_path / "bad"), console=QUIET)
    with pytest.raises(ConfigError, match=match):
        recipe.setup()
    assert not hasattr(recipe, "model")
