"""One key path for how tasks are played: ``rollout.strategy`` and ``rollout.budget`` in rollout, eval and
train alike; the old top-level keys of rollout and eval still work, with a warning naming the new ones."""

from __future__ import annotations

import pytest

from omrl.config import DeprecatedKeyWarning, describe, load_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig, TrainRunConfig


@pytest.mark.parametrize("cls", [RolloutRunConfig, EvalRunConfig, TrainRunConfig])
def test_every_playing_command_keeps_strategy_and_budget_under_rollout(cls):
    keys = [row[0] for row in describe(cls)]
    assert "rollout.strategy" in keys and "rollout.budget" in keys
    assert "strategy" not in keys and "budget" not in keys
    cfg = load_config(cls, None, ["rollout.strategy=beam", "rollout.budget=400"])
    assert (cfg.rollout.strategy, cfg.rollout.budget) == ("beam", 400)


@pytest.mark.parametrize("cls", [RolloutRunConfig, EvalRunConfig])
def test_the_old_top_level_keys_still_work_and_say_where_they_moved(cls):
    with pytest.warns(DeprecatedKeyWarning, match="rollout.strategy"):
        cfg = load_config(cls, None, ["strategy=best_of_n", "budget=64"])
    assert (cfg.rollout.strategy, cfg.rollout.budget) == ("best_of_n", 64)
