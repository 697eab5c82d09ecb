"""`omrl sweep`: strategies x budgets on gridworld with the tiny model, the files it writes, resuming, bad input."""

from __future__ import annotations

import doctest
import importlib
import json
import math

import pytest

from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from tests.helpers import cli_exit, invoke

PNG_HEADER = b"\x89PNG\r\n\x1a\n"
# short replies and episodes keep every cell to a fraction of a second; sampling, as search needs
FAST = [
    "--env",
    "gridworld",
    "--model",
    "tiny",
    "--num-tasks",
    "2",
    "generation.max_new_tokens=8",
    "env.max_turns=3",
    "generation.temperature=1.0",
]


def best_of_n_sweep(out, budgets: str, *args: str):
    """``omrl sweep`` of best_of_n (n=2) at ``budgets`` (comma-separated) into ``out``, then ``args``: its result."""
    return invoke(
        "sweep",
        *FAST,
        "--strategies",
        "best_of_n",
        "--budgets",
        budgets,
        "-o",
        str(out),
        "plugins.best_of_n.n=2",
        *args,
    )


def cells(out) -> dict:
    record = json.loads((out / "sweep.json").read_text())
    return {(c["strategy"], c["budget"]): c for c in record["cells"]}


def test_sweep_writes_one_cell_per_strategy_and_budget_and_a_png(tmp_path):
    out = tmp_path / "sweep"
    result = invoke(
        "sweep",
        *FAST,
        "--strategies",
        "chain,best_of_n,beam",
        "--budgets",
        "16,40",
        "-o",
        str(out),
        "plugins.best_of_n.n=2",
    )
    assert result.exit_code == 0, result.output
    found = cells(out)
    # chain is pass@1: one cell with no budget; the others one cell per budget
    assert set(found) == {("chain", None), ("best_of_n", 16), ("best_of_n", 40), ("beam", 16), ("beam", 40)}
    record = json.loads((out / "sweep.json").read_text())
    assert record["setup"]["tasks"] == [1_000_000, 1_000_001] and record["setup"]["env"]["name"] == "gridworld"
    for (_strategy, budget), cell in found.items():
        assert cell["tasks"] == 2 and len(cell["per_task"]) == 2
        assert 0.0 <= cell["success_rate"] <= 1.0 and 0.0 <= cell["any_success_rate"] <= 1.0
        assert math.isclose(cell["success_se"], math.sqrt(cell["success_rate"] * (1 - cell["success_rate"]) / 2))
        assert cell["generated_tokens_per_task"] > 0 and cell["wall_seconds"] > 0
        assert cell["max_generated_tokens"] == max(t["generated_tokens"] for t in cell["per_task"])
        if budget is not None:
            assert all(0 < t["generated_tokens"] <= budget for t in cell["per_task"])
            assert 0 < cell["budget_used"] <= 1.0
        else:
            assert cell["budget_used"] is None
    # the tiny model's replies run to max_new_tokens, so a 16-token budget is two replies a task, used up
    assert found[("best_of_n", 16)]["max_generated_tokens"] == 16 and found[("best_of_n", 16)]["budget_exhausted"] == 2
    png = (out / "sweep.png").read_bytes()
    assert png.startswith(PNG_HEADER) and len(png) > 10_000
    assert "best_of_n" in result.output and "pass@1" in result.output
    assert not list(out.glob(".*.tmp"))  # no temporary file left behind


@pytest.mark.slow
def test_a_sweep_run_again_plays_only_the_new_cells(tmp_path):
    out = tmp_path / "sweep"
    first = best_of_n_sweep(out, "16")
    assert first.exit_code == 0, first.output
    before = cells(out)[("best_of_n", 16)]
    again = best_of_n_sweep(out, "16,24")
    assert again.exit_code == 0, again.output
    assert "1 cells done, 1 to play" in again.output
    after = cells(out)
    assert set(after) == {("best_of_n", 16), ("best_of_n", 24)}
    assert after[("best_of_n", 16)] == before  # kept as it was, wall time included: not played again
    # another setting (here the seed) would mix two sweeps in one file: refused, naming what differs
    with pytest.raises(ConfigError, match=r"holds a sweep with other settings \(seed: 0 there, 1 now\)"):
        best_of_n_sweep(out, "32", "--seed", "1")
    assert set(cells(out)) == {("best_of_n", 16), ("best_of_n", 24)}
    fresh = best_of_n_sweep(out, "32", "--seed", "1", "resume=false")
    assert fresh.exit_code == 0, fresh.output
    assert set(cells(out)) == {("best_of_n", 32)}


class Interrupting:
    """A strategy `interrupting` that stops the run as Ctrl-C would, before it plays anything."""

    @hookimpl
    def register_rollout_strategies(self, register):
        def interrupting(ctx, tasks):
            if tasks:  # not in the check that runs every strategy on no tasks first
                raise KeyboardInterrupt
            return []

        register("interrupting", interrupting)


@pytest.mark.slow
def test_an_interrupted_sweep_keeps_its_finished_cells_and_says_how_to_go_on(register_plugin, capsys, tmp_path):
    register_plugin(Interrupting(), name="interrupting-strategy")
    code, _, err = cli_exit(
        capsys,
        "sweep",
        *FAST,
        "--strategies",
        "best_of_n,interrupting",
        "--budgets",
        "16",
        "-o",
        str(tmp_path),
        "plugins.best_of_n.n=2",
    )
    assert code == 130
    err = " ".join(err.split())
    assert "interrupted during interrupting @ 16 tokens; the 1 finished cells are in" in err
    assert set(cells(tmp_path)) == {("best_of_n", 16)}  # whole JSON, the finished cell in it
    assert (tmp_path / "sweep.png").read_bytes().startswith(PNG_HEADER)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--strategies", "chain,bean"],
            "unknown rollout strategy 'bean'. Did you mean 'beam'? Valid: beam, best_of_n, "
            "chain, dfsdt, mc_value, mcts",
        ),
        (["--budgets", "500,abc"], "--budgets '500,abc': 'abc' is not a positive whole number of tokens"),
        (["--budgets", "0"], "'0' is not a positive whole number of tokens"),
        (["--budgets", "-20"], "'-20' is not a positive whole number of tokens"),
        (["--budgets", "500,,1000"], "has an empty item; valid: items separated by commas, e.g. 500,1000,2000"),
        (["--budgets", "4"], "budget 4 is smaller than one reply (generation.max_new_tokens=8)"),
        (["--budgets", "16,16"], "budgets lists 16 more than once"),
        (["plugins.beam.width=0"], "beam option width=0 is invalid"),
    ],
)
def test_bad_sweep_input_is_one_line_and_plays_nothing(capsys, tmp_path, args, message):
    code, _, err = cli_exit(
        capsys, "sweep", *FAST, "--strategies", "chain,beam", "--budgets", "16", "-o", str(tmp_path), *args
    )
    assert code == 2
    assert message in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "sweep.json").exists()


def test_a_strategy_the_env_cannot_fork_for_fails_before_any_cell_plays(chest_plugins, capsys, tmp_path):
    # chain (which needs no fork) comes first: without the check up front it would play and be written
    code, _, err = cli_exit(
        capsys,
        "sweep",
        "--env",
        "chest-plain",
        "env.template=chest-action",
        "--model",
        "tiny",
        "--num-tasks",
        "1",
        "--strategies",
        "chain,best_of_n,mcts",
        "--budgets",
        "8",
        "generation.max_new_tokens=4",
        "generation.temperature=1.0",
        "-o",
        str(tmp_path),
    )
    assert code == 2
    err = " ".join(err.split())
    assert "strategy 'mcts' branches episodes, but env 'chest-plain' (PlainChestEnv) cannot copy one" in err
    assert "neither snapshot()/restore() nor deterministic = True" in err
    assert not (tmp_path / "sweep.json").exists()


@pytest.mark.parametrize("module", ["omrl.search.sweep", "omrl.cli.sweep_cmd"])
def test_docstring_examples_hold(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def _final_model(path, scale: float):
    """The tiny model written at ``path`` as a run's final model is, manifest included, its weights scaled by
    ``scale``: another scale is the same model retrained."""
    import shutil

    from safetensors.torch import load_file, save_file

    from omrl.models import MODEL_MANIFEST, resolve_model_path
    from omrl.models.manifest import manifest

    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(resolve_model_path("tiny"), path)
    weights = load_file(path / "model.safetensors")
    save_file({k: v * scale for k, v in weights.items()}, path / "model.safetensors", metadata={"format": "pt"})
    names = sorted(p.name for p in path.iterdir() if p.is_file())
    (path / MODEL_MANIFEST).write_text(manifest(path, names))


@pytest.mark.slow
def test_a_model_retrained_at_the_same_path_does_not_resume_the_earlier_models_sweep(tmp_path):
    model, out = tmp_path / "final", tmp_path / "sweep"
    _final_model(model, 1.0)
    args = ["sweep", *FAST, "--model", str(model), "--strategies", "chain", "-o", str(out)]
    assert invoke(*args).exit_code == 0
    record = json.loads((out / "sweep.json").read_text())
    assert set(record["setup"]["model_content"]) == {"manifest_sha256"}  # a final model: by its manifest
    assert invoke(*args).exit_code == 0  # the same content resumes: nothing left to play
    _final_model(model, 0.5)  # retrained at the same path
    with pytest.raises(
        ConfigError,
        match=r"holds a sweep of another model at .*final \(manifest sha256 \w{12}\.\.\. "
        r"there, manifest sha256 \w{12}\.\.\. now: retrained",
    ):
        invoke(*args)
    assert json.loads((out / "sweep.json").read_text()) == record  # left as it was
    # another model named is no retrained one: the setting that differs is named
    with pytest.raises(ConfigError, match=r'other settings \(model.name: "/.* there, "tiny" now\)'):
        invoke("sweep", *FAST, "--model", "tiny", "--strategies", "chain", "-o", str(out))
    assert invoke(*args, "resume=false").exit_code == 0  # a new table for the new model


def test_a_reward_model_retrained_at_the_same_path_does_not_resume_the_earlier_ones_cells(tmp_path):
    """The policy was known by content, the reward model that chose its answers (plugins.rm.path) only by
    path: a sweep resumed after retraining it kept the old model's cells beside the new one's."""
    from omrl.config import load_config
    from omrl.config.options import SweepRunConfig
    from omrl.search.sweep_resume import finished_cells, setup_of

    reward_model, record = tmp_path / "rm", tmp_path / "sweep.json"
    _final_model(reward_model, 1.0)
    cfg = load_config(SweepRunConfig, None, ["model.name=tiny", f"plugins.rm.path={reward_model}"])
    from omrl.search.sweep_resume import CELL_NUMBERS

    cell = {"strategy": "best_of_n", "budget": 256, "budget_used": 1.0, **{key: 0.5 for key in CELL_NUMBERS}}
    record.write_text(json.dumps({"setup": setup_of(cfg, [0, 1]), "cells": [cell]}))
    assert finished_cells(record, setup_of(cfg, [0, 1])) == [cell]
    _final_model(reward_model, 0.5)  # retrained in place
    with pytest.raises(ConfigError, match=rf"holds cells played with other content at plugins.rm.path={reward_model} "):
        finished_cells(record, setup_of(cfg, [0, 1]))
    plain = load_config(SweepRunConfig, None, ["model.name=tiny"])
    assert "plugin_files" not in setup_of(plain, [0, 1])  # a sweep that reads no file records as it did


def test_a_model_without_a_manifest_is_identified_by_its_weights_files(tmp_path):
    import os

    from omrl.search.sweep import model_content

    model = tmp_path / "hf"
    _final_model(model, 1.0)
    (model / "omrl_model.sha256").unlink()
    before = model_content(str(model))
    assert set(before) == {"files_sha256"} and model_content(str(model)) == before
    os.utime(model / "model.safetensors", ns=(1, 1))  # rewritten in place
    assert model_content(str(model)) != before
    assert model_content("org/some-hub-model") == {"hub_id": "org/some-hub-model"}


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda record: record.update(cells=5), "its cells are not a list"),
        (lambda record: record["cells"][0].pop("budget"), "cell 0 lacks budget"),
        (lambda record: record["cells"][0].update(success_rate="0.5"), 'cell 0 has success_rate "0.5", not a number'),
        (lambda record: record["cells"].append([1]), "cell 1 is [1], not a mapping"),
        (lambda record: record.update(setup=[1]), "is damaged: its setup is [1]"),
    ],
)
def test_a_damaged_sweep_record_is_refused_naming_the_cell_before_the_model_loads(
    capsys, tmp_path, monkeypatch, damage, message
):
    """A damaged cell was a KeyError "bug in omrl", or failed only after the cells left had played."""
    out = tmp_path / "sweep"
    assert best_of_n_sweep(out, "16").exit_code == 0
    record = json.loads((out / "sweep.json").read_text())
    damage(record)
    (out / "sweep.json").write_text(json.dumps(record))

    def loading(*args, **kwargs):
        raise AssertionError("the model loaded before the damaged record was refused")

    monkeypatch.setattr("omrl.rollout.RolloutSession.from_config", loading)
    code, _, err = cli_exit(capsys, "sweep", *FAST, "--strategies", "best_of_n", "--budgets", "16,24", "-o", str(out))
    assert code == 2 and message in " ".join(err.split()), err
    assert "give another --out, or resume=false" in " ".join(err.split())


def test_a_cell_the_env_failed_in_says_which_tasks_and_is_played_again_on_resume(tmp_path, monkeypatch):
    from omrl_plugins.envs.gridworld import GridWorld

    reset = GridWorld.reset

    def down_for_the_first_task(self, task_id):
        if task_id == 1_000_000:
            raise ConnectionError("simulator server down")
        return reset(self, task_id)

    out = tmp_path / "sweep"
    monkeypatch.setattr(GridWorld, "reset", down_for_the_first_task)
    first = best_of_n_sweep(out, "16")
    assert first.exit_code == 0, first.output
    cell = cells(out)[("best_of_n", 16)]
    assert cell["env_errors"] == 1 and [t["env_error"] for t in cell["per_task"]] == [True, False]
    assert " err" in first.output and "err: tasks the env failed in" in first.output  # the table shows it
    monkeypatch.setattr(GridWorld, "reset", reset)  # the server is back
    again = best_of_n_sweep(out, "16")
    assert again.exit_code == 0, again.output
    assert "0 cells done, 1 to play (1 again: the env failed on some of their tasks)" in " ".join(again.output.split())
    cell = cells(out)[("best_of_n", 16)]
    assert cell["env_errors"] == 0 and not any(t["env_error"] for t in cell["per_task"])


def test_a_cell_that_fails_says_the_finished_cells_are_kept_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    """A stop said so; a failure did not, and the finished cells looked lost."""
    from omrl.errors import EnvFailure
    from omrl.search import sweep

    played = sweep.run_cell

    def fails_second(session, cfg, tasks, strategy, budget, *rest):
        if budget == 24:
            raise EnvFailure("every episode failed in the env 'gridworld'")
        return played(session, cfg, tasks, strategy, budget, *rest)

    monkeypatch.setattr(sweep, "run_cell", fails_second)
    out = tmp_path / "sweep"
    code, _, err = cli_exit(capsys, "sweep", *FAST, "--strategies", "best_of_n", "--budgets", "16,24", "-o", str(out))
    said = " ".join(err.split())
    assert code == 2 and "every episode failed in the env 'gridworld' (in best_of_n @ 24 tokens)" in said, said
    assert f"the 1 finished cells are in {out / 'sweep.json'}: once that is fixed, the same command" in said
    assert set(cells(out)) == {("best_of_n", 16)}


def test_budgets_given_to_a_sweep_of_pass_at_1_strategies_alone_are_said_to_be_unread(tmp_path):
    with pytest.warns(UserWarning, match=r"budgets are not read: chain plays once, without a budget \(pass@1\)"):
        result = invoke("sweep", *FAST, "--strategies", "chain", "--budgets", "128", "-o", str(tmp_path / "sweep"))
    assert result.exit_code == 0, result.output
