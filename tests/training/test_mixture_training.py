"""`omrl train` on a mixture of envs, for real on the tiny model: groups never mix envs or tasks,
per-env metrics add up to the overall ones, each env keeps its own settings, per-env reward scaling,
and a stopped run resumes to the same numbers."""

from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from omrl.config import load_config
from omrl.config.options import RolloutRunConfig
from omrl.data.trajectory import read_episodes
from omrl.errors import ConfigError
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.checkpoint import CheckpointError
from omrl.training.metrics import per_env_metrics, read_metrics
from omrl.training.rl import run_rl
from omrl.training.rollout_step import step_metrics
from tests.training.helpers import stop_then_resume

QUIET = Console(file=io.StringIO())
ARITHMETIC = "reasoning-gym:basic_arithmetic"
MIX = f"env.name=gridworld:0.5,{ARITHMETIC}:0.5"


@pytest.fixture
def config(sample_index_configs):
    return sample_index_configs(MIX, "tasks_per_step=4")


def rollout(cfg, step: int) -> list:
    return read_episodes(Path(cfg.logging.output_dir) / "rollouts" / f"step-{step:08d}.parquet")


def numbers(out) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not (k.endswith("_per_s") or "time" in k or k.startswith("peak_"))}
        for r in read_metrics(out)
    ]


@pytest.mark.slow
def test_groups_never_mix_envs_and_per_env_metrics_add_up(config):
    cfg = config("steps=3", "eval_tasks=2")
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    envs = Counter()
    for step, record in enumerate(records, start=1):
        episodes = rollout(cfg, step)
        assert len(episodes) == 4 * 3
        for group in {ep.group for ep in episodes}:  # a group is one task of one env
            assert len({(ep.env, ep.task_id) for ep in episodes if ep.group == group}) == 1
        envs.update(ep.env for ep in episodes)
        counts = {env: record.get(f"episodes/{env}", 0.0) for env in ("gridworld", ARITHMETIC)}
        assert counts == {env: sum(ep.env == env for ep in episodes) for env in counts}
        for metric in ("reward", "success", "turns", "response_tokens", "reward_sample_index"):  # weighted means
            per_env = sum(record[f"{metric}/{env}"] * n for env, n in counts.items() if n)
            assert per_env / len(episodes) == pytest.approx(record[metric]), (step, metric)
        assert sum(record.get(f"env_errors/{env}", 0.0) for env in counts) == record["env_errors"]
    assert set(envs) == {"gridworld", ARITHMETIC}
    last = records[-1]
    for env in ("gridworld", ARITHMETIC):  # each env's 2 test tasks, and the macro average
        assert f"eval_success/{env}" in last
    assert last["eval_success_macro"] == pytest.approx(
        (last["eval_success/gridworld"] + last[f"eval_success/{ARITHMETIC}"]) / 2
    )


@pytest.mark.slow
def test_each_env_trains_with_its_own_turn_cap_and_reward_weights(config):
    cfg = config(
        "env.name=gridworld",  # the mixture is named once: here by env.mix
        "env.mix=[{name: gridworld, max_turns: 3, reward: {sample_index: 10.0}}, "
        f"{{name: '{ARITHMETIC}', max_turns: 1, reward: {{sample_index: 1.0}}}}]",
        "steps=1",
        "tasks_per_step=8",
        "algorithm.advantage=dr_grpo",
        "reward.per_env_scale=std",
    )
    run_rl(cfg, console=QUIET)
    episodes = rollout(cfg, 1)
    assert {ep.env for ep in episodes} == {"gridworld", ARITHMETIC}
    assert max(ep.num_turns for ep in episodes if ep.env == "gridworld") == 3  # untrained: never reaches the goal
    assert all(ep.num_turns == 1 for ep in episodes if ep.env == ARITHMETIC)  # its own cap, not the run's 2
    record = read_metrics(cfg.logging.output_dir)[0]
    # sample indices 0, 1, 2: spread sqrt(2/3), ten times that where the env's weight is 10
    assert record["reward_scale/gridworld"] == pytest.approx(10 * (2 / 3) ** 0.5)
    assert record[f"reward_scale/{ARITHMETIC}"] == pytest.approx((2 / 3) ** 0.5)
    for ep in episodes:  # what was trained on: each env's rewards in units of its own spread
        assert sum(ep.rewards["total"]) == pytest.approx(ep.sample / (2 / 3) ** 0.5)


@pytest.mark.slow  # two training runs, one stopped and resumed
def test_a_stopped_mixture_run_resumes_to_the_same_numbers(config):
    settings = ("steps=3", "logging.save_steps=1")
    full = config(*settings, out="full")
    run_rl(full, console=QUIET)
    stopped = config(*settings, out="stopped")
    stop_then_resume(stopped, console=QUIET)
    assert numbers(stopped.logging.output_dir) == numbers(full.logging.output_dir)
    for step in (1, 2, 3):
        ran, resumed = rollout(full, step), rollout(stopped, step)
        assert [(ep.env, ep.task_id) for ep in resumed] == [(ep.env, ep.task_id) for ep in ran]


@pytest.mark.slow
def test_a_run_resumed_with_other_envs_is_refused(config):
    first = config("steps=1", "logging.save_steps=1", out="run")
    run_rl(first, console=QUIET)
    other = config("steps=2", f"env.name=gridworld:0.5,{ARITHMETIC}:0.5,babyai:GoToObjS6:1", "resume=true", out="run")
    with pytest.raises(CheckpointError, match="differs from the checkpoint's in env.name"):
        run_rl(other, console=QUIET)


def test_per_env_scaling_is_refused_where_it_would_be_wrong_or_ignored(config):
    with pytest.raises(ConfigError, match="unknown reward.per_env_scale 'z'; valid: none, std"):
        run_rl(config("reward.per_env_scale=z"), console=QUIET)
    with pytest.raises(ConfigError, match="compares them with greedy_scores it plays apart"):
        run_rl(config("reward.per_env_scale=std", "algorithm.advantage=remax"), console=QUIET)
    with pytest.raises(ConfigError, match="reward.per_env_scale is for the grpo and ppo recipes"):
        run_rl(config("reward.per_env_scale=std", algo="dpo"), console=QUIET)


class TwoProcesses:
    """``sum_dicts`` of two processes, played by two threads (each key summed over both, a missing key 0),
    as the strategies' all-gather does."""

    def __init__(self):
        self.barrier, self.slots = threading.Barrier(2), [{}, {}]

    def rank(self, rank: int):
        outer = self

        class Rank:
            world_size = 2

            def sum_dicts(self, values):
                outer.slots[rank] = dict(values)
                outer.barrier.wait()
                keys = set(outer.slots[0]) | set(outer.slots[1])
                out = {k: outer.slots[0].get(k, 0.0) + outer.slots[1].get(k, 0.0) for k in keys}
                outer.barrier.wait()
                return out

        return Rank()


@pytest.mark.slow
def test_per_env_metrics_over_two_processes_are_what_one_process_computes_from_all(tiny_model_dir):
    cfg = load_config(
        RolloutRunConfig,
        None,
        [f"model.name={tiny_model_dir}", "env.max_turns=2", "generation.max_new_tokens=8", MIX],
    )
    with RolloutSession.from_config(cfg) as session:
        episodes = session.play(session.task_ids("test", 3), PlaySpec(group_size=2, seed=0)).episodes
        for i, ep in enumerate(episodes):  # outcomes that differ, so every weighting shows
            ep.won, ep.score = i % 3 == 0, i / 10
        episodes[0].end_reason = "env_error"  # reward, success and score leave it out
        parts = [episodes[:3], episodes[3:]]  # uneven: one process played fewer gridworld episodes
        summaries = [session.compose(part) for part in parts]
        whole = per_env_metrics(episodes, 1.0, session.compose(episodes).env_rewards, session.env_names)
    processes, results = TwoProcesses(), [None, None]

    def run(rank: int) -> None:
        session = SimpleNamespace(mixture=True, env_names=["gridworld", ARITHMETIC], backend=None)
        metrics = step_metrics(summaries[rank], 1.0, session, processes.rank(rank))
        results[rank] = {k: v for k, v in metrics.items() if "/" in k}

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0] == results[1]
    assert set(results[0]) == set(whole)
    for key, value in whole.items():
        assert results[0][key] == pytest.approx(value), key


def test_per_env_metrics_reach_tensorboard_under_their_own_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from omrl.config.options import LoggingConfig
    from omrl.training.metrics import MetricsLogger

    cfg = LoggingConfig(output_dir=str(tmp_path), tensorboard=True)
    metrics = {"success": 0.5, "success/gridworld": 0.25, f"success/{ARITHMETIC}": 0.75}
    with MetricsLogger(tmp_path, cfg, total_steps=1, console=QUIET) as logger:
        logger.log(1, metrics)
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    scalars = EventAccumulator(str(events)).Reload()
    for key, value in metrics.items():
        assert scalars.Scalars(f"train/{key}")[0].value == pytest.approx(value)
    assert read_metrics(tmp_path)[0][f"success/{ARITHMETIC}"] == 0.75
