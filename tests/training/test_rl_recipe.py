"""The RL recipe (`omrl train`): grpo, ppo and dpo runs on gridworld with the tiny model."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from omrl.errors import ConfigError, NonFiniteLossError, NothingLearned
from omrl.hookspecs import hookimpl
from omrl.models import load_model
from omrl.training.checkpoint import CheckpointError, latest_checkpoint
from omrl.training.metrics import read_metrics
from omrl.training.rl import RLRecipe, run_rl
from tests.training.helpers import SampleIndexReward, gridworld_configs, stop_then_resume, train_command

QUIET = Console(file=io.StringIO())


def varies(key: str) -> bool:
    """Speeds, times and memory: not the run's numbers."""
    return key.endswith("_per_s") or "time" in key or key.startswith("peak_")


@pytest.fixture
def rl_config(tiny_model_dir, tmp_path):
    """``rl_config(*overrides)``: a run of a few seconds a step on gridworld."""

    return gridworld_configs(
        tiny_model_dir,
        tmp_path,
        "env.max_turns=3",
        "eval_tasks=2",
        "reward.weights={goal: 1.0}",
        "optim.micro_batch_size=4",
    )


def test_grpo_run_writes_metrics_checkpoints_and_a_loadable_model(rl_config, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")  # rewards that differ within each group
    cfg = rl_config("logging.save_steps=1", "logging.keep_checkpoints=1", "reward.weights={sample_index: 1.0}")
    summary = run_rl(cfg, console=QUIET)
    out = cfg.logging.output_dir
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]  # the last step carries the final evaluation, once
    for r in records[:2]:
        assert math.isfinite(r["loss"]) and 0.0 <= r["success"] <= 1.0 and r["grad_norm"] is not None
    assert "eval_success" in records[-1] and summary["steps"] == 2
    assert latest_checkpoint(out).name == "step-00000002"
    assert len(list((latest_checkpoint(out).parent).glob("step-*"))) == 1  # keep_checkpoints=1
    model, _ = load_model(out)  # the final model, loadable like any model directory
    assert model.config.model_type == "qwen2"


@pytest.mark.slow
def test_each_step_logs_its_own_generation_and_the_evaluation_its_own(rl_config):
    cfg = rl_config("eval_every=1")  # an evaluation after step 1, before step 2's rollout
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    # 2 tasks x 3 samples a step: exactly the rollout's sampled tokens, none of the evaluation's
    assert [r["generated_tokens"] for r in records] == pytest.approx([6 * r["response_tokens"] for r in records])
    for r in records:
        assert r["prefill_tokens"] > 0 and 0.0 <= r["prefill_hit_rate"] <= 1.0
        assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["peak_rss_gb"] > 0
        assert r["eval_generated_tokens"] > 0 and 0.0 <= r["eval_prefill_hit_rate"] <= 1.0


def updates_and_schedule(rl_config, *overrides: str):
    """(config, the optimizer's update counts, the schedule's state) of a 2-step run in mini-batches of 2
    on a linear schedule."""
    settings = ("mini_batch_size=2", "reward.weights={sample_index: 1.0}", "eval_tasks=0", "optim.lr_schedule=linear")
    cfg = rl_config(*settings, *overrides)
    run_rl(cfg, console=QUIET)
    checkpoint = latest_checkpoint(cfg.logging.output_dir)
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    updates = {int(state["step"]) for state in optimizer["state"].values()}
    return cfg, updates, torch.load(checkpoint / "scheduler.pt", weights_only=True)


@pytest.mark.slow
def test_each_mini_batch_is_one_optimizer_step(rl_config, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")
    # 2 tasks x 3 samples = 6 episodes: 3 mini-batches of 2 a pass, 2 passes, 2 steps -> 12 updates
    cfg, updates, scheduler = updates_and_schedule(rl_config, "ppo_epochs=2")
    assert updates == {12}
    assert scheduler["last_epoch"] == 12 and scheduler["_last_lr"][0] == pytest.approx(0.0)  # decayed over all 12
    record = read_metrics(cfg.logging.output_dir)[1]
    assert record["pg_ratio_mean"] != pytest.approx(1.0, abs=1e-7)  # later mini-batches see a moved policy


@pytest.mark.slow  # a beam search in each step
def test_a_search_rollouts_many_paths_keep_the_schedule_to_the_runs_length(rl_config, register_plugin):
    """A beam rollout's rows are its finished paths, far more than its 2 tasks: the schedule is sized
    for 1 mini-batch of 2 a step, and each step moves it one step however many mini-batches it has
    (before, every path was a step and the linear schedule reached 0 within the first step)."""
    register_plugin(SampleIndexReward(), name="sample-index")
    beam = ("group_size=1", "rollout.strategy=beam", "plugins.beam.width=2", "plugins.beam.branch=3")
    cfg, updates, scheduler = updates_and_schedule(rl_config, *beam, "plugins.beam.stop_on_win=false")
    assert min(updates) > 2  # several updates a step
    assert scheduler["last_epoch"] == 2 and scheduler["_last_lr"][0] == pytest.approx(0.0)
    first, second = read_metrics(cfg.logging.output_dir)
    assert first["lr"] == pytest.approx(cfg.optim.learning_rate) and second["lr"] == pytest.approx(
        cfg.optim.learning_rate / 2
    )


def test_mini_batch_size_must_not_be_negative(rl_config):
    with pytest.raises(ConfigError, match="mini_batch_size must be >= 0"):
        run_rl(rl_config("mini_batch_size=-1"), console=QUIET)


def test_evaluation_samples_each_test_task_at_the_eval_temperature(rl_config):
    recipe = RLRecipe(
        rl_config("eval_temperature=1.0", "eval_samples_per_task=3", "eval_tasks=2", "generation.temperature=0.7"),
        console=QUIET,
    )
    played = []
    try:
        recipe.setup()
        play = recipe.run.session.play

        def spy(tasks, spec):
            result = play(tasks, spec)
            played.append((len(result.episodes), spec.limits.temperature))
            return result

        recipe.run.session.play = spy
        result = recipe.run.evaluate()
    finally:
        recipe.cleanup()
    assert played == [(6, 1.0)]  # 2 tasks x 3 samples, sampled rather than greedy
    assert recipe.run.session.limits.temperature == 0.7  # the rollouts' sampling is back
    assert 0.0 <= result["eval_success"] <= 1.0


def test_several_greedy_eval_samples_are_refused(rl_config):
    with pytest.raises(ConfigError, match="eval_samples_per_task=4 is invalid; valid: 1, or more with eval_temp"):
        run_rl(rl_config("eval_samples_per_task=4"), console=QUIET)


def test_ppo_trains_a_value_head(rl_config):
    # a length penalty makes the returns nonzero even when the random model never reaches a goal
    cfg = rl_config(
        "algorithm.name=ppo",
        "algorithm.advantage=gae",
        "steps=1",
        "algorithm.lam=0.95",
        "reward.weights={goal: 1.0, length_penalty: 1.0}",
        "plugins.length_penalty={budget: 2, per_token: 0.1}",
    )
    summary = run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert math.isfinite(record["value_loss"]) and record["value_loss"] > 0
    extra = torch.load(latest_checkpoint(cfg.logging.output_dir) / "extra.pt", weights_only=True)
    assert extra["value_head"]["proj.weight"].abs().sum() > 0  # it moved away from its zero init
    assert summary["skipped_updates"] == 0
    # the rollout is saved with gae's advantages and returns and the critic's values, per token
    from omrl.data.trajectory import read_episodes

    episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    for ep in episodes:
        assert len(ep.advantages) == len(ep.returns) == len(ep.values) == len(ep.token_ids)
        assert not any(v for v, m in zip(ep.values, ep.loss_mask) if not m)  # values on the sampled tokens only
    assert any(any(ep.returns) for ep in episodes)  # the length penalty's (the values: the head's zero init)


def test_dpo_trains_on_pairs_from_rollouts(rl_config, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")
    cfg = rl_config("algorithm.name=dpo", "steps=1", "group_size=3", "reward.weights={sample_index: 1.0}")
    run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert record["dpo_pairs"] == cfg.tasks_per_step
    assert math.isfinite(record["loss"]) and record["loss"] == pytest.approx(
        math.log(2), abs=0.05
    )  # policy == reference


def test_an_update_with_all_zero_advantages_is_skipped_loudly(rl_config):
    cfg = rl_config("steps=1", "eval_tasks=0")  # the random model never reaches a goal: every reward is 0
    before = {k: v.clone() for k, v in load_model(cfg.model.name)[0].state_dict().items()}
    console = Console(file=io.StringIO(), width=400)
    summary = run_rl(cfg, console=console)
    assert summary["skipped_updates"] == 1
    said = " ".join(console.file.getvalue().split())
    assert "every one of this run's 1 updates was skipped, so the model in" in said  # said at the end, with
    assert "every advantage is 0" in said and "more SFT epochs" in said  # the cause and what to change
    after = load_model(cfg.logging.output_dir)[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_kl_to_the_reference_is_logged(rl_config, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")
    cfg = rl_config(
        "steps=1", "algorithm.kl_coef=0.1", "algorithm.kl_estimator=k3", "reward.weights={sample_index: 1.0}"
    )
    run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert record["kl"] == pytest.approx(0.0, abs=1e-6)  # before the first update the policy is the reference


@pytest.mark.slow
def test_resumed_run_matches_an_uninterrupted_one(rl_config, register_plugin):
    register_plugin(SampleIndexReward(), name="sample-index")
    keys = ("reward", "success", "loss", "grad_norm", "response_tokens")
    full = rl_config("steps=3", "logging.save_steps=1", "reward.weights={sample_index: 1.0}", out="full")
    run_rl(full, console=QUIET)

    killed = rl_config("steps=3", "logging.save_steps=1", "reward.weights={sample_index: 1.0}", out="killed")
    stop_then_resume(killed, console=QUIET)

    expected = {r["step"]: r for r in read_metrics(full.logging.output_dir)}
    resumed = read_metrics(killed.logging.output_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3], "each step logged once, the last with the final evaluation"
    for record in resumed:
        for key in keys:
            assert record[key] == pytest.approx(expected[record["step"]][key], rel=1e-4, abs=1e-6), (
                record["step"],
                key,
            )


def test_resume_with_a_different_config_names_the_keys(rl_config):
    cfg = rl_config("steps=1")
    run_rl(cfg, console=QUIET)
    changed = rl_config("steps=1", "group_size=5", "resume=true")
    with pytest.raises(CheckpointError, match=r"group_size: 3 -> 5"):
        run_rl(changed, console=QUIET)
    with pytest.raises(CheckpointError, match="holds checkpoints of an earlier run"):
        run_rl(rl_config("steps=1"), console=QUIET)


class NanLoss:
    """A policy loss that is always NaN: the recipe must skip, count and finally stop."""

    @hookimpl
    def register_algorithms(self, register):
        def nan_loss(data, cfg):
            """Always NaN."""
            loss = (data.log_probs * data.loss_mask).sum() * float("nan")
            return loss, {}

        register("nan_loss", nan_loss, kind="policy_loss")


@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_stop_the_run(rl_config, register_plugin):
    register_plugin(NanLoss(), name="nan-loss")
    register_plugin(SampleIndexReward(), name="sample-index")
    cfg = rl_config(
        "algorithm.policy_loss=nan_loss",
        "steps=2",
        "optim.max_nan_steps=5",
        "eval_tasks=0",
        "reward.weights={sample_index: 1.0}",
    )
    before = {k: v.clone() for k, v in load_model(cfg.model.name)[0].state_dict().items()}
    with pytest.raises(NothingLearned, match="every one of this run.s 2 updates was skipped.*non-finite"):
        run_rl(cfg, console=QUIET)  # under max_nan_steps, yet a run that changed nothing does not exit 0
    assert read_metrics(cfg.logging.output_dir)[-1]["skipped_updates"] == 2
    after = load_model(cfg.logging.output_dir)[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped update changed the weights"
    with pytest.raises(NonFiniteLossError, match="2 updates in a row"):
        run_rl(
            rl_config(
                "algorithm.policy_loss=nan_loss",
                "steps=3",
                "optim.max_nan_steps=2",
                "reward.weights={sample_index: 1.0}",
                out="stops",
            ),
            console=QUIET,
        )


def test_a_run_on_a_relative_model_folder_resumes_from_another_folder(tiny_model_dir, tmp_path, monkeypatch):
    """--resume from a subfolder refused 'model.name: /abs/base -> base': config.yaml kept the path as typed."""
    import shutil

    from omrl.cli import build_app

    shutil.copytree(tiny_model_dir, tmp_path / "base")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert train_command("base", Path("run"), "logging.save_steps=1").exit_code == 0
    monkeypatch.chdir(tmp_path / "sub")
    result = CliRunner().invoke(build_app(), ["train", "--resume", "--output-dir", "../run", "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert read_metrics(tmp_path / "run")[-1]["step"] == 2


def test_train_command(tiny_model_dir, tmp_path):
    from omrl.cli import build_app

    out = tmp_path / "cli-run"
    result = train_command(tiny_model_dir, out, "tasks_per_step=1", "group_size=2")
    assert result.exit_code == 0, result.output
    assert "omrl train: done" in result.output and (out / "config.json").exists()
    assert read_metrics(out)[0]["step"] == 1
    bad = CliRunner().invoke(build_app(), ["train", "--algo", "sac"])
    assert bad.exit_code != 0 and "unknown --algo 'sac'; valid: grpo, ppo, dpo" in str(bad.exception)
    typo = CliRunner().invoke(build_app(), ["train", "--algo", "ppoo"])
    assert "unknown --algo 'ppoo' (did you mean 'ppo'?); valid: grpo, ppo, dpo" in str(typo.exception)


def test_on_policy_old_log_probs_from_the_updates_forward_change_nothing(rl_config, register_plugin, monkeypatch):
    """One pass, one mini-batch: the update's own forward (detached) replaces the separate no-grad
    forward of the old log-probs, and every number of the run stays bit-identical."""
    register_plugin(SampleIndexReward(), name="sample-index")
    calls = []
    real = RLRecipe._score

    def counting(self, mb, on_policy):
        calls.append(on_policy)
        return real(self, mb, on_policy)

    monkeypatch.setattr(RLRecipe, "_score", counting)
    # whole rows in both runs: a shared prefix changes float rounding (tests/training/test_shared_prefix.py);
    # 2 samples a task, so no row has advantage 0 (such rows do not run, and the update could measure no gap there)
    settings = ("reward.weights={sample_index: 1.0}", "eval_tasks=0", "optim.share_prefix=false", "group_size=2")
    fast = rl_config(*settings, out="fast")
    run_rl(fast, console=QUIET)
    assert calls == []  # no forward before the update at all
    monkeypatch.setattr(RLRecipe, "_old_log_probs_from_update", lambda self, passes: False)
    slow = rl_config(*settings, out="slow")
    run_rl(slow, console=QUIET)
    assert calls and not any(calls)
    for a, b in zip(read_metrics(fast.logging.output_dir), read_metrics(slow.logging.output_dir), strict=True):
        # the sampler's mismatch is summed per micro-batch in one, over the batch in the other: rounding apart
        measured = [k for k in a if k.startswith("mismatch_")]
        assert measured and [a[k] for k in measured] == pytest.approx([b[k] for k in measured], abs=1e-12)
        assert {k: v for k, v in a.items() if not varies(k) and k not in measured} == {
            k: v for k, v in b.items() if not varies(k) and k not in measured
        }
    fast_model, _ = load_model(fast.logging.output_dir)
    slow_model, _ = load_model(slow.logging.output_dir)
    for (name, p), q in zip(fast_model.state_dict().items(), slow_model.state_dict().values()):
        assert torch.equal(p, q), name


class HalfTheTasksLearn:
    """A reward under which the even tasks' samples score their index squared (none at the mean) and the
    odd tasks' all score 1: every odd task's rows get advantage 0."""

    @hookimpl
    def register_rewards(self, register):
        def half_the_tasks(episodes):
            """Even tasks: the sample's index squared; odd tasks: 1 (on the last turn)."""
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample**2 if ep.group % 2 == 0 else 1)] for ep in episodes]

        register("half_the_tasks", half_the_tasks)


@pytest.mark.slow
def test_rows_whose_advantages_are_all_zero_are_not_run_and_the_update_is_the_same(
    rl_config, register_plugin, monkeypatch
):
    """ppo_clip says zero-advantage rows add nothing (omrl.algos): a task whose samples all got the same
    reward runs no forward or backward, and the run's losses and weights are those of running it."""
    register_plugin(HalfTheTasksLearn(), name="half-the-tasks")
    ran = []
    real = RLRecipe._policy_forward

    def counting(self, mb, prefix=None):
        ran.append(len(mb))
        return real(self, mb, prefix)

    monkeypatch.setattr(RLRecipe, "_policy_forward", counting)
    # one whole row a micro-batch: the gradients sum in the same order, so the weights are bit-identical
    # (a shared prefix would group the rows that run otherwise: float rounding, test_shared_prefix.py)
    settings = ("reward.weights={half_the_tasks: 1.0}", "eval_tasks=0", "optim.micro_batch_size=1")
    settings += ("optim.share_prefix=false",)
    lean = rl_config(*settings, out="lean")
    run_rl(lean, console=QUIET)
    assert sum(ran) == 2 * 3  # 2 steps: of 2 tasks x 3 samples, the odd task's 3 rows never ran
    monkeypatch.setattr("omrl.training.rl.rows_that_learn", lambda mini: mini)
    ran.clear()
    every = rl_config(*settings, out="every")
    run_rl(every, console=QUIET)
    assert sum(ran) == 2 * 6
    for a, b in zip(read_metrics(lean.logging.output_dir), read_metrics(every.logging.output_dir), strict=True):
        assert a["zero_advantage_rows"] == 0.5 and b["zero_advantage_rows"] == 0.0
        assert (a["loss"], a["pg_loss"], a["grad_norm"]) == (b["loss"], b["pg_loss"], b["grad_norm"])
    lean_model, _ = load_model(lean.logging.output_dir)
    every_model, _ = load_model(every.logging.output_dir)
    for (name, p), q in zip(lean_model.state_dict().items(), every_model.state_dict().values()):
        assert torch.equal(p, q), name


def test_each_steps_episodes_are_written_for_omrl_view(rl_config):
    from omrl.data.trajectory import read_episodes
    from omrl.view.sources import discover

    cfg = rl_config("eval_tasks=0")
    run_rl(cfg, console=QUIET)
    files = sorted((Path(cfg.logging.output_dir) / "rollouts").iterdir())
    assert [f.name for f in files] == ["step-00000001.parquet", "step-00000002.parquet"]
    assert all(len(read_episodes(f)) == 2 * 3 for f in files)  # tasks_per_step x group_size
    # the random model never wins: each update is skipped, its rollout saved with the all-zero advantages
    assert all(
        len(ep.advantages) == len(ep.token_ids) and not any(ep.advantages) for f in files for ep in read_episodes(f)
    )
    assert not discover(cfg.logging.output_dir).empty
