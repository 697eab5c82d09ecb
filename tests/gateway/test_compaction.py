"""The compacting agent of examples/agents trains end to end: each summary starts a new row."""

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import train_one_grpo_step

EXAMPLE = Path(__file__).parents[2] / "examples" / "agents"


@pytest.mark.slow  # a training run end to end
def test_a_compacting_agent_trains_with_a_row_per_summary(tmp_path, monkeypatch):
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        "".join(json.dumps({"question": f"What is {n} plus {n}?", "answer": str(2 * n)}) + "\n" for n in range(6))
    )
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("COMPACT_AT", "120")
    monkeypatch.setenv("ROUNDS", "3")
    sys.modules.pop("compacting_agent", None)
    run = tmp_path / "run"
    result = train_one_grpo_step(questions, run, "--agent", "compacting_agent:run")
    assert "an agent program plays no action template: reward.weights={goal: 1}" in result.output
    (step,) = [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"rows_per_episode"' in line
    ]
    assert step["rows_per_episode"] > 1 and step["prefix_breaks"] >= 4  # every episode compacted at least once
    assert step["turns"] >= 4  # three rounds and at least one summary call
