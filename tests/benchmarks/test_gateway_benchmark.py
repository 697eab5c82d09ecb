"""benchmarks/gateway.py runs end to end and records both arms with the same token counts."""

import json
import subprocess
import sys

import pytest

from tests.benchmarks.helpers import BENCHMARKS


@pytest.mark.slow  # a benchmark run end to end, in its own process
def test_the_gateway_benchmark_plays_the_same_tokens_both_ways(tmp_path):
    out = tmp_path / "gateway.json"
    args = ["--episodes", "2", "--turns", "2", "--tokens", "32", "--rounds", "1", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gateway.py"), *args], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["model_arms"]["native"]["generated_tokens"] == record["model_arms"]["gateway"]["generated_tokens"] > 0
    assert record["throughput_ratio"] > 0 and "overhead_ms_per_call" in record
    assert "gateway / native throughput" in run.stdout
