"""examples/learn_selfplay.py at its smallest budget, on Kuhn Poker: every stage runs (the rules player's
expert games, SFT, GRPO in self-play, both models against the random player) and its outputs are well
formed. The learning itself is measured by the full run (docs/learning.md), not here."""

from __future__ import annotations

import json
import math

import pytest

from omrl.data import read_episodes
from omrl.training.metrics import read_metrics
from tests.helpers import load_example

pytest.importorskip("textarena")


@pytest.mark.slow  # SFT, GRPO and four evaluations: about a minute and a half on 2 cores
def test_the_selfplay_example_writes_a_well_formed_summary(tmp_path, recwarn):
    example = load_example("learn_selfplay")
    budget = example.QUICK
    summary = example.main(tmp_path, budget, seed=0)
    said = [str(w.message) for w in recwarn]  # its budget sets nothing omrl warns of as wasted
    assert not [w for w in said if "warmup_steps=" in w or "mini_batch_size=" in w], said

    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    expert = read_episodes(tmp_path / "expert.parquet")
    assert len(expert) == 2 * budget.expert_games  # the rules player at both seats of every game
    assert {ep.info["players"]["player_0"] for ep in expert} == {"expert"}
    assert all(sum(ep.loss_mask) > 0 and ep.end_reason == "done" for ep in expert)
    assert (tmp_path / "sft" / "config.json").exists() and (tmp_path / "grpo" / "config.json").exists()
    steps = read_metrics(tmp_path / "grpo")
    assert len(steps) == budget.grpo_steps and all("win_rate/seat:player_0" in step for step in steps)

    for name in ("sft", "selfplay"):
        result = summary[name]
        assert result == json.loads((tmp_path / f"eval_{name}.json").read_text())
        assert result["games"] == 2 * budget.eval_games  # eval_games at each seat
        rates = [result[f"{o}_rate"] for o in ("win", "draw", "loss", "unfinished", "error")]
        assert sum(rates) == pytest.approx(1.0) and all(0 <= r <= 1 for r in rates)
        assert 0 <= result["win_rate_se"] <= 0.5 and 0 <= result["refused_move_rate"] <= 1
        assert len(result["per_game"]) == result["games"] and set(result["per_game"].values()) <= {0.0, 1.0}
        assert sum(result["per_game"].values()) / result["games"] == pytest.approx(result["win_rate"])
    assert set(summary["sft"]["per_game"]) == set(summary["selfplay"]["per_game"])  # the same games: paired
    assert summary["win_rate_gain"] == pytest.approx(summary["selfplay"]["win_rate"] - summary["sft"]["win_rate"])
    assert summary["win_rate_gain_se"] >= 0 and summary["win_rate_gain_se_unpaired"] >= 0
    assert math.isfinite(summary["success_gain_in_se"]) and math.isfinite(summary["success_gain_in_unpaired_se"])
    assert summary["opponent_in_eval"] == "random"
    assert summary["budget"]["eval_games"] == budget.eval_games and summary["minutes"] > 0
