"""A sweep cell is what `omrl eval --strategy S --budget B` plays with the same flags: its settings and its numbers."""

from __future__ import annotations

import json

from tests.helpers import eval_report, invoke

# flags both commands take; the rest (reply length, temperature, turn cap) each resolves as eval does
SAME = ["--env", "gridworld", "--model", "tiny", "--num-tasks", "2", "seed=3", "env.max_turns=3"]
BUDGET = 160


def test_each_sweep_cell_plays_with_the_settings_and_gets_the_numbers_of_eval(tmp_path):
    out = tmp_path / "sweep"
    swept = invoke(
        "sweep",
        *SAME,
        "--strategies",
        "chain,best_of_n",
        "--budgets",
        str(BUDGET),
        "-o",
        str(out),
        "plugins.best_of_n.n=2",
    )
    assert swept.exit_code == 0, swept.output
    record = json.loads((out / "sweep.json").read_text())
    cells = {c["strategy"]: c for c in record["cells"]}
    setup = record["setup"]
    _, chain = eval_report(tmp_path / "chain", "eval", *SAME)
    _, searched = eval_report(
        tmp_path / "best_of_n",
        "eval",
        *SAME,
        "--strategy",
        "best_of_n",
        "--budget",
        str(BUDGET),
        "plugins.best_of_n.n=2",
    )
    for name, report in (("chain", chain), ("best_of_n", searched)):
        played = {**setup["generation"], "temperature": cells[name]["temperature"]}
        assert played == report["config"]["generation"], name
        assert setup["env"] == report["config"]["env"], name
    assert chain["config"]["generation"]["temperature"] == 0.0  # eval's greedy pass@1 ...
    assert searched["config"]["generation"]["temperature"] == 1.0  # ... and its sampled search
    assert setup["generation"]["max_new_tokens"] == 64  # eval's preset, not the sweep config's own default
    metrics = searched["metrics"]
    assert (cells["best_of_n"]["success_rate"], cells["best_of_n"]["mean_score"]) == (
        metrics["success_rate"],
        metrics["mean_score"],
    )
    assert cells["best_of_n"]["generated_tokens_per_task"] == metrics["search/generated_tokens_per_task"]
    assert cells["chain"]["mean_score"] == chain["metrics"]["mean_score"]
