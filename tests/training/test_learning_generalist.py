"""The generalist example's pipeline at a test budget: GRPO on a mixture of two envs must raise the
reward it optimises in both envs, from one SFT model trained on both envs' expert data.

examples/learn_generalist.py takes the `tiny` model through expert data of three envs, SFT on the
mixture and GRPO on the mixture; this test runs the same stages (the same functions) on two of its
envs, small enough for the suite, with a reward both envs' actions can move within a few steps:
the share of the agent's actions that turn or go left (gridworld's `left`, BabyAI's `turn left`).
"""

from __future__ import annotations

import pytest

from omrl.hookspecs import hookimpl
from omrl.training.metrics import read_metrics
from tests.helpers import load_example

ENVS = ["gridworld", "babyai:GoToRedBallNoDists"]


class GoesLeft:
    """Reward: the share of an episode's actions that say `left` (one term per turn, summing to it)."""

    @hookimpl
    def register_rewards(self, register):
        def goes_left(episodes):
            """Share of the episode's turns whose action goes or turns left."""
            return [[float("left" in (t.action or "")) / len(ep.turns) for t in ep.turns] for ep in episodes]

        register("goes_left", goes_left)


@pytest.mark.slow
def test_grpo_on_a_mixture_raises_the_reward_in_both_envs(tmp_path, register_plugin):
    register_plugin(GoesLeft(), name="goes-left")
    example = load_example("learn_generalist")
    budget = example.Budget(
        expert_episodes=100, sft_epochs=16.0, grpo_steps=6, tasks_per_step=12, group_size=4, eval_tasks=0
    )  # tasks_per_step 12 of three envs: 8 a step for two
    data = example.expert_data(tmp_path / "expert.parquet", budget, ENVS)
    sft = example.sft_stage(data, tmp_path / "sft", budget, seed=0)
    short = "env.mix=[{name: gridworld, max_turns: 4, demonstration: false}, " + (
        "{name: 'babyai:GoToRedBallNoDists', max_turns: 4, demonstration: false}]"
    )
    example.grpo_stage(sft, tmp_path / "grpo", ENVS, budget, seed=0, reward="{goes_left: 1.0}", overrides=(short,))

    records = read_metrics(tmp_path / "grpo")
    assert len(records) == budget.grpo_steps
    for env in ENVS:
        rewards = [r[f"reward/{env}"] for r in records if f"reward/{env}" in r]
        assert len(rewards) >= 4, env  # drawn by weight: nearly every step has both envs
        assert all(r[f"format_ok/{env}"] > 0.5 for r in records if f"format_ok/{env}" in r)  # SFT taught the format
        first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
        assert last > first + 0.1, f"GRPO did not raise the reward in {env}: {rewards}"


def test_a_difference_is_paired_over_the_same_test_tasks():
    """Both models play the same tasks: the difference's standard error is over each task's change, so
    a uniform gain on tasks of very different difficulty is many standard errors (unpaired: few)."""
    example = load_example("learn_generalist")

    def env(values):
        mean, se = example.mean_and_se(values)
        return {"success": mean, "se": se, "tasks": len(values), "per_task": dict(enumerate(values))}

    sft = {name: env([0.0, 0.25, 0.5, 1.0 - 0.1]) for name in example.ENVS}
    rl = {name: env([0.1, 0.35, 0.6, 1.0]) for name in example.ENVS}  # every task up by 0.1
    results = {kind: {"sampled": models} for kind, models in (("after_sft", sft), ("after_rl", rl), ("alone", rl))}
    targets = example.targets(results)
    gridworld = targets["rl_minus_sft"]["gridworld"]
    assert gridworld["diff"] == pytest.approx(0.1) and gridworld["se"] == pytest.approx(0.0, abs=1e-12)
    assert gridworld["se_unpaired"] > 0.2  # the tasks' own spread, which pairing cancels
    assert targets["macro_rl_minus_sft"]["diff"] == pytest.approx(0.1) and targets["macro_above_sft_by_2se"]
    assert targets["no_env_worse_by_2se"] and targets["mixture_minus_alone"]["gridworld"]["diff"] == 0.0


def test_a_stage_made_with_another_budget_is_refused(tmp_path):
    """A stage's result is reused only by the budget that made it (a smaller run's models once stood in
    for the full run's)."""
    example = load_example("learn_generalist")
    assert example.stage(tmp_path, "sft", lambda: "quick", example.QUICK)["result"] == "quick"
    assert example.stage(tmp_path, "sft", lambda: "again", example.QUICK)["result"] == "quick"  # kept
    with pytest.raises(SystemExit, match="another budget"):
        example.stage(tmp_path, "sft", lambda: "full", example.FULL)
