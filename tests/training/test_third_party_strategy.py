"""A third-party strategy and advantage estimator are treated as the built-ins are: the core reads
what a strategy declares (omrl.search.StrategyTraits), never its name, and saves each trained
episode with the advantages the estimator gave it, which omrl view shows as recorded."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.data.trajectory import read_episodes
from omrl.errors import PluginError
from omrl.hookspecs import hookimpl
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import StrategyTraits, strategy_traits
from omrl.search.sweep import cells_of
from omrl.training import config_checks, rollout_step
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from omrl.view import open_run
from omrl_plugins.strategies.best_of_n import best_of_n
from omrl_plugins.strategies.chain import chain
from tests.helpers import first_difference
from tests.training.helpers import SampleIndexReward, gridworld_configs

QUIET = Console(file=io.StringIO())


def relay(ctx, tasks):
    """chain under another name: what it declares, not what it is called, decides how it is treated."""
    return chain(ctx, tasks)


def pick(ctx, tasks, n: int = 2):
    """best_of_n under another name, declaring nothing: a tree strategy, one tree per sample."""
    return best_of_n(ctx, tasks, n=n)


def centered(data, algo):
    """Each row's score minus its group's mean, on its sampled tokens (no std division)."""
    scores = (data.token_rewards * data.loss_mask).sum(-1)
    groups, inverse = torch.unique(data.group_ids, return_inverse=True)
    sums = scores.new_zeros(len(groups)).index_add_(0, inverse, scores)
    sizes = torch.bincount(inverse, minlength=len(groups)).to(scores.dtype)
    advantages = (scores - (sums / sizes)[inverse])[:, None] * data.loss_mask
    return advantages, advantages


class ThirdParty(SampleIndexReward):
    """A plugin as an installed package would be: a strategy, one that declares nothing, an estimator
    and (from SampleIndexReward) a reward that ranks the samples of a task by their index."""

    @hookimpl
    def register_rollout_strategies(self, register):
        register("relay", relay, group_in_one_tree=True, batched_without_budget=True)
        register("pick", pick)

    @hookimpl
    def register_algorithms(self, register):
        register("centered", centered, kind="advantage")


@pytest.fixture
def config(tiny_model_dir, tmp_path, register_plugin):
    """``config(*overrides, out=...)``: a two-step grpo run on gridworld with the third-party plugin."""
    register_plugin(ThirdParty("sample_rank"), name="third-party")

    return gridworld_configs(tiny_model_dir, tmp_path, "reward.weights={sample_rank: 1.0}", "optim.micro_batch_size=4")


def the_numbers(out: str) -> list[dict]:
    """The run's logged numbers, less times and speeds."""
    return [
        {k: v for k, v in record.items() if not (k.endswith("_per_s") or "time" in k or k.startswith("peak_"))}
        for record in read_metrics(out)
    ]


@pytest.mark.slow
def test_a_strategy_declaring_what_chain_declares_trains_exactly_as_chain(config):
    builtin = config("rollout.strategy=chain", "algorithm.advantage=centered", out="chain")
    plugin = config("rollout.strategy=relay", "algorithm.advantage=centered", out="relay")
    summaries = [run_rl(cfg, console=QUIET) for cfg in (builtin, plugin)]
    assert [s["skipped_updates"] for s in summaries] == [0, 0]
    for step in (1, 2):
        name = f"rollouts/step-{step:08d}.parquet"
        played = [read_episodes(Path(cfg.logging.output_dir) / name) for cfg in (builtin, plugin)]
        difference = first_difference(*played)
        assert difference is None, difference  # the very same episodes, advantages included
    for got, want in zip(*(the_numbers(cfg.logging.output_dir) for cfg in (plugin, builtin)), strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_rollouts_are_saved_with_the_estimators_advantages_and_the_viewer_shows_them(config):
    cfg = config("rollout.strategy=relay", "algorithm.advantage=centered", "steps=1")
    run_rl(cfg, console=QUIET)
    episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert len(episodes) == 2 * 3 and all(turn.node_id == -1 for ep in episodes for turn in ep.turns)  # chains
    for ep in episodes:  # sample_rank 0, 1, 2 in each group: centered gives -1, 0, 1 on every sampled token
        assert len(ep.advantages) == len(ep.token_ids) == len(ep.returns) and ep.values == []  # no critic
        trained = [a for a, m in zip(ep.advantages, ep.loss_mask) if m]
        assert trained == pytest.approx([ep.sample - 1.0] * len(trained))
        assert not any(a for a, m in zip(ep.advantages, ep.loss_mask) if not m)
    store = open_run(cfg.logging.output_dir)
    shown = {(s["group"], s["sample"]): s["advantage"] for s in store.query({"limit": "50"})["items"]}
    assert sorted(shown.values()) == pytest.approx([-1.0, -1.0, 0.0, 0.0, 1.0, 1.0])
    assert "as the trainer recorded them" in store.overview()["advantage"]


def test_a_skipped_update_saves_its_rollout_with_all_zero_advantages(config):
    cfg = config("rollout.strategy=relay", "steps=1", "reward.weights={goal: 1.0}")  # the tiny model never wins
    assert run_rl(cfg, console=QUIET)["skipped_updates"] == 1
    episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert all(ep.advantages and not any(ep.advantages) for ep in episodes if any(ep.loss_mask))


def test_the_plugins_batched_rollout_is_the_sessions_own(config):
    # what `omrl train` played before every rollout went through the strategy: session.play, unchanged
    cfg = config("rollout.strategy=relay", "generation.temperature=1.0")
    with RolloutSession.from_config(cfg) as session:
        through_plugin = rollout_step.play_step(cfg, session, [0, 1], seed=7).episodes
        direct = session.play([0, 1], PlaySpec(split=cfg.env.split, group_size=cfg.group_size, seed=7)).episodes
    difference = first_difference(through_plugin, direct)
    assert difference is None, difference


def test_what_a_strategy_declares_decides_how_the_core_treats_it(config):
    assert strategy_traits("relay") == strategy_traits("chain") == StrategyTraits(True, True)
    assert strategy_traits("pick") == strategy_traits("beam") == StrategyTraits()
    batched, with_budget, tree = (
        config("rollout.strategy=relay"),
        config("rollout.strategy=relay", "rollout.budget=64"),
        config("rollout.strategy=pick"),
    )
    assert not config_checks.searched(batched) and config_checks.searched(with_budget) and config_checks.searched(tree)
    assert rollout_step.trees_per_task(batched) == 1 and rollout_step.trees_per_task(tree) == 3  # group_size trees
    assert cells_of(["relay", "pick"], [100, 200]) == [("relay", None), ("pick", 100), ("pick", 200)]


def test_a_tree_strategy_of_a_plugin_trains_with_its_own_estimator(config):
    cfg = config(
        "rollout.strategy=pick",
        "algorithm.advantage=centered",
        "steps=1",
        "group_size=1",
        "generation.temperature=1.0",
        "plugins.pick={n: 3}",
    )
    summary = run_rl(cfg, console=QUIET)
    paths = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    assert summary["skipped_updates"] == 0 and all(turn.node_id > 0 for ep in paths for turn in ep.turns)
    finished = [ep for ep in paths if ep.end_reason not in ("pruned", "budget")]
    assert finished and all(len(ep.advantages) == len(ep.token_ids) for ep in finished)


def test_unknown_traits_name_the_plugin_and_the_valid_ones(register_plugin):
    class Sloppy:
        @hookimpl
        def register_rollout_strategies(self, register):
            register("sloppy", relay, one_tree=True)

    register_plugin(Sloppy(), name="sloppy-plugin")
    with pytest.raises(
        PluginError,
        match="'sloppy-plugin' registered strategy 'sloppy' with traits one_tree; "
        "valid: group_in_one_tree, batched_without_budget",
    ):
        strategy_traits("sloppy")
