"""examples/agents/learn_calculator.py end to end at its quick size: expert episodes recorded through the
gateway, SFT on them, GRPO through the gateway, held-out evaluations (the full size's numbers are in
benchmarks/results/learn_calculator/)."""

import dataclasses
import json
import sys

import pytest

from tests.helpers import EXAMPLES


@pytest.mark.slow  # the learning demo's stages: rollout, SFT, GRPO
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # LangGraph 1.x names its prebuilt graph deprecated
def test_every_stage_runs_and_the_expert_data_holds_real_tool_calls(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "agents"))  # the example names its agent learn_calculator:agent
    monkeypatch.delitem(sys.modules, "learn_calculator", raising=False)
    from learn_calculator import QUICK, main

    budget = dataclasses.replace(QUICK, expert_episodes=16, grpo_steps=1, eval_tasks=4)
    summary = main(tmp_path, budget)
    assert summary["after_sft"]["episodes"] == summary["after_grpo"]["episodes"] == 8
    assert summary["after_sft"]["env_errors"] == summary["after_grpo"]["env_errors"] == 0
    assert json.loads((tmp_path / "summary.json").read_text())["budget"]["expert_episodes"] == 16
    from omrl.data import read_episodes

    expert = read_episodes(tmp_path / "expert_tool.parquet")
    assert len(expert) == 16 and all(ep.won for ep in expert)
    assert all(ep.turns[0].info["tool_calls"] == [{"status": "ok", "name": "multiply"}] for ep in expert)
