"""The learning example's pipeline at a test budget: GRPO must raise the reward it optimises.

examples/learn_gridworld.py takes the `tiny` model through expert data, SFT and GRPO (with
GiGPO's step-level advantages) on gridworld; this test runs the same stages (the same functions,
the same GRPO settings) small enough for the suite, with a reward that a few GRPO steps can
move: the share of the agent's moves that go left.
"""

from __future__ import annotations

import pytest

from omrl.hookspecs import hookimpl
from omrl.training.metrics import read_metrics
from tests.helpers import load_example


class MovesLeft:
    """Reward: the share of an episode's moves that go left (one term per turn, summing to it)."""

    @hookimpl
    def register_rewards(self, register):
        def moves_left(episodes):
            """Share of the episode's turns whose action is 'left'."""
            return [[float(turn.action == "left") / len(ep.turns) for turn in ep.turns] for ep in episodes]

        register("moves_left", moves_left)


@pytest.mark.slow
@pytest.mark.parametrize(
    "generation",
    [(), ("rollout.async_generation=true", "rollout.max_staleness=1", "rollout.generation_threads=1")],
    ids=["sync", "async-staleness-1"],
)
def test_grpo_raises_the_reward_it_optimises(tmp_path, register_plugin, generation):
    register_plugin(MovesLeft(), name="moves-left")
    example = load_example("learn_gridworld")
    budget = example.Budget(  # the example's GRPO settings (learning rate 5e-4, mini-batches of 16)
        expert_episodes=100, sft_epochs=16.0, grpo_steps=6, tasks_per_step=8, group_size=4, eval_tasks=0, eval_every=0
    )
    data = example.expert_data(tmp_path / "expert.parquet", budget.expert_episodes)
    sft = example.sft_stage(data, tmp_path / "sft", budget, seed=0)
    example.grpo_stage(
        sft, tmp_path / "grpo", budget, seed=0, reward="{moves_left: 1.0}", overrides=("env.max_turns=4", *generation)
    )  # short episodes: a fast test

    records = read_metrics(tmp_path / "grpo")
    rewards = [r["reward"] for r in records]
    assert len(rewards) == budget.grpo_steps
    assert all(r["format_ok"] > 0.5 for r in records)  # SFT taught the reply format the reward reads
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.15, f"GRPO did not raise the reward: {rewards}"


def test_the_example_plots_its_summary(tmp_path):
    summary = {
        "before_sft": {"sampled": 0.0, "greedy": 0.0},
        "after_sft": {"sampled": 0.47, "greedy": 0.32},
        "after_grpo": {"sampled": 0.56, "greedy": 0.42},
        "curve": [(0, 0.47), (5, 0.5), (10, 0.56)],
        "eval_tasks": 100,
        "eval_samples": 4,
    }
    load_example("learn_gridworld").plot(summary, tmp_path / "success.png")
    assert (tmp_path / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["success.png"]  # no temporary file left behind
