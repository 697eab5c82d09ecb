"""benchmarks/continuous_batching.py records a workload's replies to a file, and a later run replays them:
the same episodes in both modes, as on a machine that lacks the model that sampled them."""

import json
import subprocess
import sys

import pytest

from tests.benchmarks.helpers import BENCHMARKS, load_benchmark


def run_benchmark(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(BENCHMARKS / "continuous_batching.py"), "--workloads", "default", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a benchmark run end to end twice, in its own processes
def test_recorded_replies_replay_as_the_same_episodes_in_both_modes(tmp_path):
    replies = tmp_path / "replies"
    recorded = run_benchmark(
        "--model", "tiny", "--rounds", "0", "--replies", str(replies), "--json", str(tmp_path / "a.json")
    )
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    digests = json.loads((replies / "default.json").read_text())
    assert digests and all(len(digest) == 40 and all(r for r in rs) for digest, rs in digests.items())

    out = tmp_path / "b.json"
    replayed = run_benchmark("--model", "tiny", "--rounds", "1", "--replies", str(replies), "--json", str(out))
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    record = json.loads(out.read_text())["default"]
    assert record["replies"] == f"replayed from {replies / 'default.json'}"
    assert record["same_episodes_each_round"] == [True]
    assert sorted(record["reply_lengths"]) == sorted(len(r) for rs in digests.values() for r in rs)
    turns, continuous = record["runs"]["turns"][0], record["runs"]["continuous"][0]
    assert turns["sampled_tokens"] == continuous["sampled_tokens"] > 0
    # a reply's first id comes from its prompt's logits, each further id from one decode row; turn by turn a
    # prompt is a forward of its own (which a group's samples share), continuously it rides a decode step
    replies_made = sum(len(rs) for rs in digests.values())
    assert 0 < turns["prefill_calls"] == turns["prefill_rows"] < replies_made
    assert continuous["prefill_calls"] == 0 < continuous["prefill_rows"] <= replies_made
    for run in (turns, continuous):
        assert run["decode_rows"] == run["sampled_tokens"] - replies_made
        assert 0 < run["decode_calls"] < run["decode_rows"] + run["prefill_rows"]  # rows share decode steps
        # no batching steps fewer times than its longest chain of replies takes; each step's seconds are counted
        assert 0 < run["chain_decode_steps"] <= run["decode_calls"]
        assert 0 < run["decode_real_attended"] <= run["decode_attended"]
        assert 0 < run["decode_seconds"] < run["generate_seconds"]
    assert continuous["decode_real_attended"] == continuous["decode_attended"]  # each row attends to its own alone
    assert turns["chain_decode_steps"] == continuous["chain_decode_steps"]
    assert turns["decode_real_attended"] == continuous["decode_real_attended"]  # the same rows, padded otherwise
    # the floor: the prompts, then the fewest steps with every row at a fitted cost that is never below 0
    assert set(record["step_cost"]) == {"call", "row", "column"} and min(record["step_cost"].values()) >= 0
    assert record["floor_seconds"] >= min(turns["prefill_seconds"], continuous["prefill_seconds"]) > 0
    assert record["ceiling"] == pytest.approx(turns["seconds"] / record["floor_seconds"])


def test_the_step_cost_fit_recovers_a_known_cost_and_never_goes_below_zero(monkeypatch):
    bench = load_benchmark(monkeypatch, "continuous_batching")
    # steps costing 50 ms + 5 ms a row + 7 us an attended column, to the bit
    steps = [(r, r * w, r * w // 2, 0.05 + 0.005 * r + 7e-6 * r * w) for r in (1, 3, 8) for w in (100, 900, 2000)]
    cost = bench.step_cost(steps)
    assert cost == pytest.approx({"call": 0.05, "row": 0.005, "column": 7e-6})
    # seconds that fall with the rows: a negative per-row cost is refused, the closest fit without it is kept
    falling = [(r, r * 100, r * 100, 0.1 - 0.001 * r) for r in (1, 2, 4, 8)]
    assert min(bench.step_cost(falling).values()) >= 0


def test_a_prompt_without_a_recorded_reply_stops_the_run_naming_the_fix(monkeypatch):
    bench = load_benchmark(monkeypatch, "continuous_batching")
    replay = bench.Replay({bench.key([1, 2, 3]): [[7, 8]]})
    assert replay.next([1, 2, 3]) == [7, 8]
    for prompt in ([1, 2, 3], [4]):  # the one recorded reply is taken; another prompt was never recorded
        with pytest.raises(SystemExit, match="no recorded reply left.*record them again"):
            replay.next(prompt)
