"""A short fault-injection soak (scripts/soak.py): real rollouts through the `agentgym` client
against gridworld servers that fail, pause and restart; every episode is accounted for and no
two clients ever act on one server env."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


@pytest.fixture(scope="module")
def soak_module():
    spec = importlib.util.spec_from_file_location("omrl_soak_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_short_soak_keeps_every_invariant(soak_module, tiny_model_dir):
    from omrl.models import load_tokenizer

    report = soak_module.soak(episodes=48, seed=0, servers=2, fault_rate=0.15, timeout=0.5, batch=8,
                              chaos_interval=0.4, tokenizer=load_tokenizer(tiny_model_dir), batch_seconds=60)
    print("\n".join(report.lines()))
    assert report.violations == []
    assert report.requested == 48 == report.finished + report.failed
    assert report.failed_without_reason == 0
    assert report.finished > 0 and report.failed > 0  # both ends were exercised
    assert report.faults["restart"] >= 1 and report.faults["pause"] >= 1
    assert sum(report.faults[k] for k in soak_module.FAULTS) > 10


def test_soak_counts_expose_a_broken_invariant(soak_module):
    """The checks themselves: an episode lost, a reasonless failure, a NaN reward."""
    from omrl.data.trajectory import Episode, Turn

    report = soak_module.Report()
    failed = Episode(env="agentgym", task_id=1, split="test", instruction="", end_reason="env_error", error="")
    nan = Episode(env="agentgym", task_id=2, split="test", instruction="", end_reason="done",
                  turns=[Turn(observation="", response="", action="up", format_ok=True, reward=float("nan"),
                              done=True)])
    soak_module.check_batch(report, 3, [failed, nan])
    assert report.requested == 3 and report.failed == 1 and report.finished == 1
    assert len(report.violations) == 3
    assert "3 episodes requested, 2 came back" in report.violations[0]
    assert "env_error without a reason" in report.violations[1] and "nan" in report.violations[2]
    assert "INVARIANT BROKEN (3)" in "\n".join(report.lines())


def test_script_exits_non_zero_when_an_invariant_breaks(soak_module, monkeypatch, capsys):
    broken = soak_module.Report(requested=2, violations=["client 1 reached env 0 of server 0 start 2"])
    monkeypatch.setattr(soak_module, "soak", lambda *args, **kwargs: broken)
    assert soak_module.main(["--episodes", "2", "--seed", "5"]) == 1
    assert "INVARIANT BROKEN (1)" in capsys.readouterr().out
    monkeypatch.setattr(soak_module, "soak", lambda *args, **kwargs: soak_module.Report(requested=2))
    assert soak_module.main(["--episodes", "2"]) == 0
