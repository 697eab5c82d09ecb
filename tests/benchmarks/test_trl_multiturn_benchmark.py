"""benchmarks/trl_multiturn.py: both sides score a reply alike, omrl's env plays the task, and the quick
mode runs end to end against the real TRL (skipped, with the reason shown, where trl is not installed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks.helpers import BENCHMARKS, load_benchmark


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/trl_multiturn.py as a module."""
    return load_benchmark(monkeypatch, "trl_multiturn")


def test_both_sides_score_the_final_reply_alike(bench):
    assert bench.answer_reward("The product is 2,491.", 2491) == 1.021
    assert bench.answer_reward("2490", 2491) == 0.004
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 47, "b": 53}}}
    episodes = [
        [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "2491"}],
        [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "assistant", "content": "2491"}],
    ]
    # TRL: an episode that ended on a tool call (the turn cap) answered nothing
    assert bench.trl_reward(episodes, product=[2491, 2491]) == [0.0, bench.answer_reward("2491", 2491)]


def test_omrl_env_offers_the_trl_environments_tool_and_plays_an_episode(bench):
    from transformers.utils import get_json_schema

    from omrl.plugins import pm

    plugin = bench.omrl_plugin(4)
    envs, templates = {}, {}
    plugin.register_envs(lambda name, cls: envs.__setitem__(name, cls))
    plugin.register_templates(lambda name, cls: templates.__setitem__(name, cls))
    env, template = envs[bench.ENV_NAME](), templates[bench.TEMPLATE_NAME]()
    assert env.tools == [get_json_schema(bench.Calculator().multiply)["function"]]
    assert template.system_prompt(env) == bench.SYSTEM
    assert pm.get_plugin("benchmark.trl_multiturn") is None  # nothing registered behind the test's back

    a, b = bench.make_tasks(4, seed=0)[1]
    assert env.reset(1).text == f"What is {a} times {b}?"
    parsed = template.parse(
        f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>', env
    )
    tool = env.step(parsed.action)
    assert (tool.observation, tool.done) == (str(a * b), False)
    answer = template.parse(f"It is {a * b}.", env)  # no tool call: the final answer
    final = env.step(answer.action)
    assert final.done and final.won and final.reward == bench.answer_reward(f"It is {a * b}.", a * b)


@pytest.mark.slow
def test_the_quick_mode_runs_both_sides_on_the_tiny_model(tmp_path):
    pytest.importorskip("trl", reason="the TRL side needs trl (benchmarks/requirements-trl.txt)")
    out = tmp_path / "trl_multiturn.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "trl_multiturn.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["machine"]["cpus"] >= 1 and record["args"]["model"] == "tiny"
    trl, omrl = record["runs"]["trl"][0], record["runs"]["omrl"][0]
    assert trl["same_prompt_ids"]  # TRL generated from the very ids omrl played
    assert len(trl["steps"]) == len(omrl["steps"]) == 2
    assert all(s["sampled_tokens"] > 0 for s in trl["steps"] + omrl["steps"])
    assert all(0.0 <= s["prefill_reused_share"] <= 1.0 for s in omrl["steps"])
    assert record["ratios"][0] > 0 and record["per_token_ratios"][0] > 0 and record["memory_ratios"][0] > 0
    assert "omrl/TRL s/step" in done.stdout and "settings:" in done.stdout
