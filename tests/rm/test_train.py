"""``omrl rm train`` / ``omrl rm eval``: labels from trajectory files, the recipe, resume, the report."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.config import load_config
from omrl.config.options import RmTrainRunConfig, RolloutRunConfig
from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.errors import ConfigError, OmrlError
from omrl.rm.evaluate import evaluate_reward_model, selection_curve
from omrl.rm.labels import LabelError, examples, pairs
from omrl.rm.metrics import auc, expected_calibration_error
from omrl.rm.model import RewardModel
from omrl.rm.train import RmRecipe, run_rm_train
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import play_strategy
from omrl.training.metrics import read_metrics
from omrl.training.optim import lr_multiplier
from tests.helpers import REACT_GRIDWORLD, an_episode, expert_and_model_episodes, invoke
from tests.training.launch import Job, run_jobs

GRIDWORLD = [*REACT_GRIDWORLD, "env.max_turns=4"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Gridworld episodes with both outcomes, on the tiny tokenizer: the expert's (won) and the
    random-init tiny model's (lost), two samples of each of 6 train tasks."""
    out = tmp_path_factory.mktemp("rm-data")
    won, lost = expert_and_model_episodes(6, group_size=2)
    for ep in won:
        ep.sample = 2  # the expert's episode is each task's third sample
    write_episodes(won, out / "expert.parquet")
    write_episodes(lost, out / "model.parquet")
    assert any(ep.won for ep in won) and not any(ep.won for ep in lost)
    return out


@pytest.fixture(scope="module")
def one_epoch_orm(data_dir, tmp_path_factory) -> Path:
    """An outcome model trained one epoch on ``data_dir``, once for the tests that only read it."""
    out = tmp_path_factory.mktemp("rm") / "orm"
    run_rm_train(config(data_dir, out, "num_train_epochs=1"))
    return out


def config(data: Path, out: Path, *overrides: str) -> RmTrainRunConfig:
    return load_config(
        RmTrainRunConfig,
        None,
        [
            "model.name=tiny",
            f"dataset={data}",
            f"logging.output_dir={out}",
            "optim.learning_rate=1e-3",
            "optim.micro_batch_size=4",
            "num_train_epochs=3",
            "packing=false",
            "logging.tensorboard=false",
            *overrides,
        ],
    )


def episode(
    task: int, won: bool, node_ids: list[int], parents: list[int], end: str = "done", sample: int = 0
) -> Episode:
    """A hand-built path: turn t's reply is token 10 + t at position 2t + 1."""
    turns = [
        Turn("obs", "Act: up", "up", True, 0.5 * t, False, span=(2 * t + 1, 2 * t + 2), node_id=n, parent_id=p)
        for t, (n, p) in enumerate(zip(node_ids, parents))
    ]
    ids = [1] + [x for t in range(len(turns)) for x in (10 + t, 2)]
    zeros = [0] * len(ids)
    return an_episode(
        task_id=task,
        turns=turns,
        token_ids=ids,
        loss_mask=zeros,
        logprobs=[0.0] * len(ids),
        won=won,
        score=float(won),
        end_reason=end,
        sample=sample,
    )


# -- labels ------------------------------------------------------------------------------------------
def test_outcome_labels_sit_on_the_last_token_and_pairs_put_the_winner_first():
    eps = [
        episode(0, True, [1, 2], [0, 1]),
        episode(0, False, [3], [0], sample=1),
        episode(1, False, [1], [0], end="env_error"),
    ]
    found, cut = examples(eps, "orm", "success", "f.parquet", max_seq_length=100)
    # read at the last reply's end (not the env's words after it); env_error left out
    assert [(ex.input_ids, ex.positions, ex.targets) for ex in found] == [
        ([1, 10, 2, 11], [3], [1.0]),
        ([1, 10], [1], [0.0]),
    ]
    assert cut == 0
    (pair,) = pairs(found, max_pairs_per_task=8)
    assert pair.chosen.targets == [1.0] and pair.rejected.targets == [0.0]


def test_monte_carlo_labels_are_the_share_of_won_finished_leaves_below_each_turn():
    # root 0 -> node 1 -> {2 (won), 3 (lost), 4 (pruned: no outcome)}
    eps = [
        episode(0, True, [1, 2], [0, 1]),
        episode(0, False, [1, 3], [0, 1], sample=1),
        episode(0, False, [1, 4], [0, 1], end="pruned", sample=2),
    ]
    found, _ = examples(eps, "prm", "mc", "trees.parquet", max_seq_length=100)
    labelled = {(tuple(ex.input_ids[: p + 1]), t) for ex in found for p, t in zip(ex.positions, ex.targets)}
    # node 1 (shared) is labelled once: 1 win of 2 finished; node 2: 1/1; node 3: 0/1
    assert labelled == {((1, 10), 0.5), ((1, 10, 2, 11), 1.0), ((1, 10, 2, 11), 0.0)}


def test_mc_score_labels_use_each_paths_final_score_where_nothing_won():
    eps = [episode(0, False, [1, 2], [0, 1]), episode(0, False, [1, 3], [0, 1], sample=1)]
    eps[0].score, eps[1].score = 0.8, 0.2
    with pytest.raises(LabelError, match="every label in trees is 0.0"):
        from omrl.rm.labels import check_outcomes

        check_outcomes(examples(eps, "prm", "mc", "trees", 100)[0], "mc", "trees")
    found, _ = examples(eps, "prm", "mc_score", "trees", 100)
    labelled = sorted(t for ex in found for t in ex.targets)
    assert labelled == pytest.approx([0.2, 0.5, 0.8])  # node 1: the mean of its two continuations


def test_step_reward_labels_every_turn():
    found, _ = examples([episode(0, True, [-1, -1, -1], [-1, -1, -1])], "prm", "step_reward", "f", 100)
    assert found[0].positions == [1, 3, 5] and found[0].targets == [0.0, 0.5, 1.0]


def test_missing_labels_name_the_file_and_what_is_missing():
    chains = [episode(0, True, [-1], [-1]), episode(0, False, [-1], [-1])]
    with pytest.raises(LabelError, match=r"chains\.parquet holds chains without tree node ids.*mc_value"):
        examples(chains, "prm", "mc", "chains.parquet", 100)
    with pytest.raises(
        LabelError, match=r"label 'mc' is not one a 'orm'.*orm: success, score; prm: mc, mc_score, step_reward"
    ):
        examples(chains, "orm", "mc", "chains.parquet", 100)
    with pytest.raises(LabelError, match=r"empty\.parquet has no finished episode"):
        examples([episode(0, True, [1], [0], end="budget")], "orm", "success", "empty.parquet", 100)


def test_long_episodes_are_dropped_for_an_orm_and_cut_for_a_prm():
    long = [episode(0, True, [-1] * 3, [-1] * 3), episode(0, False, [-1], [-1])]
    found, cut = examples(long, "orm", "success", "f", max_seq_length=4)
    assert cut == 1 and len(found) == 1
    found, cut = examples(long, "prm", "step_reward", "f", max_seq_length=4)
    assert cut == 1 and found[0].positions == [1, 3] and len(found[0].input_ids) == 4


def test_an_orm_scores_an_open_search_node_at_its_last_reply_not_the_next_prompt(data_dir, one_epoch_orm):
    rm = RewardModel.load(one_epoch_orm)
    ep = read_episodes(data_dir / "model.parquet")[0]
    (whole,) = rm.inputs([ep])
    assert whole.positions == [ep.turns[-1].span[1] - 1] and len(whole.input_ids) == whole.positions[0] + 1
    prompt_after = replace(ep, token_ids=ep.token_ids + [5, 6, 7])  # an open node: ids go on to the next prompt
    assert rm.score_episodes([prompt_after]) == rm.score_episodes([ep])


def test_bad_labels_fail_naming_the_file_and_value(data_dir, tmp_path):
    with pytest.raises(LabelError, match=r"every labelled episode in f is longer than max_seq_length=3.*longest: 4"):
        examples(
            [episode(0, True, [-1, -1], [-1, -1]), episode(0, False, [-1, -1], [-1, -1])],
            "orm",
            "success",
            "f",
            max_seq_length=3,
        )
    eps = read_episodes(data_dir / "expert.parquet")
    eps[0].score = 2.5
    write_episodes(eps + read_episodes(data_dir / "model.parquet"), tmp_path / "scores.parquet")
    with pytest.raises(
        ConfigError, match=r"scores\.parquet has the label 2\.5 \(score\).*bce needs labels in \[0, 1\]"
    ):
        run_rm_train(config(tmp_path / "scores.parquet", tmp_path / "rm", "label=score"))


def test_the_tokenizer_check_reads_every_file_not_only_the_first(data_dir, tmp_path, smollm2_dir):
    from omrl.models import load_tokenizer
    from omrl.rm.model import mismatched_episode

    tiny = load_tokenizer("tiny")
    ours = read_episodes(data_dir / "model.parquet")
    cfg = load_config(RolloutRunConfig, None, [*GRIDWORLD, "model.name=smollm2-135m"])
    with RolloutSession.from_config(cfg) as session:
        foreign = session.play(session.task_ids("train", 1), PlaySpec(split="train", expert=True)).episodes
    assert mismatched_episode(tiny, ours) is None
    assert mismatched_episode(tiny, ours + foreign) is foreign[0]


# -- metrics -----------------------------------------------------------------------------------------
def test_auc_and_calibration_on_worked_examples():
    assert auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False]) == 0.75
    assert auc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert expected_calibration_error([0.9, 0.9, 0.1, 0.1], [1, 1, 0, 0]) == pytest.approx(0.1)


def test_selection_curve_compares_the_pick_with_random_and_the_oracle():
    eps = [episode(t, won, [-1], [-1], sample=s) for t in range(2) for s, won in enumerate([False, True, False, False])]
    scores = [
        0.1,
        0.9,
        0.2,
        0.3,  # task 0: the model ranks the winner first
        0.1,
        0.0,
        0.5,
        0.2,
    ]  # task 1: it picks a loser
    curve = selection_curve(eps, scores)
    assert [row["n"] for row in curve] == [1, 2, 4]
    n2 = curve[1]
    assert (n2["selected"], n2["random"], n2["oracle"]) == (0.5, 0.5, 1.0)
    assert curve[2]["selected"] == 0.5 and curve[2]["random"] == 0.25 and curve[2]["gain"] == 0.25


# -- the recipe ----------------------------------------------------------------------------------------
@pytest.mark.slow  # a learning check
def test_an_outcome_model_learns_to_tell_wins_from_losses(data_dir, tmp_path):
    losses = []
    summary = run_rm_train(
        config(data_dir, tmp_path / "orm", f"eval_dataset={data_dir}"),
        on_step_end=lambda step, m: losses.append(m["loss"]),
    )
    assert summary["examples"] == 18 and summary["steps"] == 15
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # it fits its training data
    report = json.loads((tmp_path / "orm" / "rm_eval.json").read_text())
    assert report["scores"]["auc"] > 0.9 and report["pairs"]["accuracy"] > 0.9
    assert report["selection"][-1]["n"] == 2  # 3 samples a task: N = 1, 2

    # an ordinary transformers model, with what it was trained for in its config
    from transformers import AutoModelForTokenClassification

    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "orm")
    assert loaded.config.omrl_reward_model["kind"] == "orm" and loaded.config.num_labels == 1
    rm = RewardModel.load(tmp_path / "orm")
    episodes = read_episodes(data_dir / "expert.parquet") + read_episodes(data_dir / "model.parquet")
    scores = rm.score_episodes(episodes)
    assert min(s for s, ep in zip(scores, episodes) if ep.won) > max(s for s, ep in zip(scores, episodes) if not ep.won)


@pytest.mark.slow  # a training run, then a merge
def test_bradley_terry_trains_on_pairs_and_lora_merges_into_a_plain_model(data_dir, tmp_path):
    summary = run_rm_train(
        config(
            data_dir, tmp_path / "bt", "objective=bt", "model.lora_rank=4", "model.lora_target_modules=[q_proj, v_proj]"
        )
    )
    assert summary["examples"] == 18 and summary["steps"] == 9  # 12 pairs (2 per task), 4 a micro-batch
    rm = RewardModel.load(tmp_path / "bt")
    assert rm.objective == "bt"
    assert not any("lora" in name for name, _ in rm.model.named_parameters())


@pytest.mark.slow
def test_a_skipped_update_does_not_advance_the_schedule(data_dir, tmp_path):
    cfg = config(data_dir, tmp_path / "nan", "num_train_epochs=1", "optim.warmup_steps=2", "optim.lr_schedule=linear")
    recipe = RmRecipe(cfg, console=Console(file=io.StringIO()))
    recipe.setup()
    values, calls = recipe._values, []

    def nan_on_the_second_call(batch):
        calls.append(1)
        return values(batch) * (float("nan") if len(calls) == 2 else 1.0)

    recipe._values = nan_on_the_second_call  # one micro-batch a step: step 2's loss is NaN
    try:
        summary = recipe.train()
    finally:
        recipe.cleanup()
    total = recipe.total_steps
    assert summary["skipped_updates"] == 1 and summary["steps"] == total >= 4
    applied_before = [0, 1, 1] + list(range(2, total - 1))  # step 3 uses the rate step 2 would have
    lrs = [r["lr"] for r in read_metrics(tmp_path / "nan")]
    assert lrs == pytest.approx([1e-3 * lr_multiplier(n, total, 2, "linear") for n in applied_before])
    assert recipe.scheduler.last_epoch == total - 1


@pytest.mark.slow  # two reward-model training runs, one stopped and resumed
def test_resume_continues_to_the_same_weights(data_dir, tmp_path):
    whole = tmp_path / "whole"
    run_rm_train(config(data_dir, whole))

    class Stop(KeyboardInterrupt):
        pass

    def stop_at_7(step, metrics):
        if step == 7:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_rm_train(config(data_dir, cut, "logging.save_steps=1"), on_step_end=stop_at_7)
    run_rm_train(config(data_dir, cut, "logging.save_steps=1", "resume=true"))
    a, b = RewardModel.load(whole).model.state_dict(), RewardModel.load(cut).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_process_model_trains_on_monte_carlo_values_from_trees(tmp_path):
    cfg = load_config(RolloutRunConfig, None, GRIDWORLD + ["plugins.mc_value.k=2"])
    with RolloutSession.from_config(cfg) as session:
        spec = PlaySpec(split="train", strategy="mc_value")
        trees = play_strategy(session, session.task_ids("train", 2), spec).trees
    paths = [ep for tree in trees for ep in tree.episodes()]
    for i, ep in enumerate(paths):  # the random-init model never wins: make every third path a win
        ep.won = i % 3 == 0
    write_episodes(paths, tmp_path / "trees.parquet")
    summary = run_rm_train(
        config(tmp_path / "trees.parquet", tmp_path / "prm", "kind=prm", "label=mc", "num_train_epochs=1")
    )
    assert summary["steps"] >= 1
    rm = RewardModel.load(tmp_path / "prm")
    assert rm.kind == "prm"
    per_turn = rm.score_turns(paths[:2])
    assert [len(s) for s in per_turn] == [len(ep.turns) for ep in paths[:2]]
    assert all(0 < s < 1 for scores in per_turn for s in scores)


def test_bad_settings_and_foreign_tokens_are_refused_before_training(data_dir, tmp_path):
    with pytest.raises(OmrlError, match="unknown reward model kind 'xrm'; valid: orm, prm"):
        run_rm_train(config(data_dir, tmp_path / "a", "kind=xrm"))
    with pytest.raises(OmrlError, match="objective 'bt'.*is for kind 'orm'"):
        run_rm_train(config(data_dir, tmp_path / "b", "kind=prm", "label=step_reward", "objective=bt"))
    with pytest.raises(ConfigError, match="label=step_reward is a real-valued reward; valid objective for it: mse"):
        run_rm_train(config(data_dir, tmp_path / "c", "kind=prm", "label=step_reward"))
    with pytest.raises(LabelError, match=r"every label in .*expert\.parquet is 1\.0"):
        run_rm_train(config(data_dir / "expert.parquet", tmp_path / "d"))
    with pytest.raises(ConfigError, match="were not tokenized with 'smollm2-135m''s tokenizer.*text=true"):
        run_rm_train(config(data_dir, tmp_path / "e", "model.name=smollm2-135m"))
    assert not (tmp_path / "e" / "config.json").exists()  # nothing half-written


def test_one_outcome_left_after_a_length_cut_names_the_cut():
    """93 long, losing episodes dropped for max_seq_length=300 left 3 wins, and the error said only that
    every label was 1.0."""
    from omrl.rm.labels import Example, check_outcomes

    wins = [Example([1, 2, 3], [2], [1.0], (0,)) for _ in range(3)]
    with pytest.raises(LabelError, match=r"is 1.0 \(success, 3 examples\); 93 episodes longer than max_seq_length=300"):
        check_outcomes(wins, "success", "train.parquet", cut=93, max_seq_length=300)


@pytest.mark.slow  # a training run and an eval through the CLI
def test_cli_trains_and_evaluates(data_dir, tmp_path):
    out = tmp_path / "cli-rm"
    result = invoke(
        "rm",
        "train",
        "--model",
        "tiny",
        "--data",
        str(data_dir),
        "--output-dir",
        str(out),
        "--learning-rate",
        "1e-3",
        "logging.tensorboard=false",
    )
    assert result.exit_code == 0, result.output
    assert "reward model saved in" in result.output
    result = invoke("rm", "eval", "--model", str(out), "--data", str(data_dir))
    assert result.exit_code == 0, result.output
    report = out / f"rm_eval-{data_dir.name}.json"  # not the held-out report of rm train, rm_eval.json
    assert "best-of-N" in result.output and report.exists()
    written = json.loads(report.read_text())
    assert written["scores"] == pytest.approx(evaluate_reward_model(out, str(data_dir))["scores"])


@pytest.mark.slow
def test_rm_eval_takes_key_value_overrides_and_remembers_how_the_model_read_its_chats(data_dir, tmp_path):
    out = tmp_path / "text-rm"
    result = invoke(
        "rm", "train", "--model", "tiny", "--data", str(data_dir), "--output-dir", str(out),
        "text=true", "num_train_epochs=0.5", "logging.tensorboard=false",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = tmp_path / "report.json"
    result = invoke("rm", "eval", f"model.name={out}", f"dataset={data_dir}", f"report={report}")
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["text"] is True  # as trained, without --text
    result = invoke("rm", "eval", "--model", str(out), "--data", str(data_dir), "--no-text", "--report", str(report))
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["text"] is False
    with pytest.raises(ConfigError, match="unknown config key 'datset'; did you mean 'dataset'"):
        invoke("rm", "eval", f"model.name={out}", "datset=x")


@pytest.mark.slow
def test_two_processes_train_the_same_reward_model_as_one(data_dir, tmp_path):
    from omrl.training.metrics import read_metrics

    settings = ("optim.gradient_accumulation_steps=3", "num_train_epochs=1")  # 5 micro-batches: 3 + 2 a step
    run_rm_train(config(data_dir, tmp_path / "single", *settings))
    (weights,) = run_jobs(tmp_path, "ddp", [Job("rm", config(data_dir, tmp_path / "two", *settings), tmp_path)])
    single = read_metrics(tmp_path / "single")
    assert [r["loss"] for r in read_metrics(tmp_path / "two")] == pytest.approx([r["loss"] for r in single], rel=1e-4)
    alone = RewardModel.load(tmp_path / "single").model.state_dict()
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), f"processes disagree on {name}"
        torch.testing.assert_close(tensor, alone[name], rtol=1e-4, atol=1e-5)


def test_values_of_an_input_scored_before_are_remembered(data_dir, one_epoch_orm):
    rm = RewardModel.load(one_epoch_orm)
    episodes = read_episodes(data_dir / "model.parquet")
    calls = []
    forward = rm.model.forward
    rm.model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    first = rm.score_episodes(episodes)
    counted = len(calls)
    assert counted and rm.score_episodes(episodes) == first and rm.score_episodes(episodes[:3]) == first[:3]
    assert len(calls) == counted  # no forward for inputs scored before


@pytest.mark.slow
def test_rm_train_resume_on_the_command_line_plays_the_runs_own_config(data_dir, tmp_path):
    """As `omrl sft` and `omrl train`: what Ctrl-C prints (`omrl rm train --resume --output-dir DIR`) works as
    printed, with no flag typed again."""
    out = tmp_path / "rm"
    invoke("rm", "train", "--model", "tiny", "--data", str(data_dir), "--output-dir", str(out),
           "num_train_epochs=0.5", "logging.tensorboard=false")  # fmt: skip
    result = invoke("rm", "train", "--resume", "--output-dir", str(out))
    assert result.exit_code == 0, result.output
