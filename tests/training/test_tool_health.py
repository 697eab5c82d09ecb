"""Tool-call health: every attempt of a reply classified in the episode, the rates logged, and a run
whose policy makes no valid call (or mostly unreadable ones) warned, then stopped."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.config.options import ToolHealthConfig
from omrl.errors import ConfigError
from omrl.rollout import RolloutLimits
from omrl.training.metrics import rollout_metrics
from omrl.training.rl import run_rl
from omrl.training.tool_health import ToolCallsFailing, ToolHealth
from tests.fakes import ScriptedBackend
from tests.helpers import gridworld_grpo_config, play_keys

OK = '<tool_call>{"name": "act", "arguments": {"action": "open"}}</tool_call>'
REPLIES = [
    OK,  # ok
    '<tool_call>{"name": "act", "arguments": {"action": "open"}}',  # unclosed
    "<tool_call>{name: act}</tool_call>",  # invalid_json
    '<tool_call>{"name": "fly", "arguments": {}}</tool_call>',  # unknown_tool
]


def test_each_attempt_is_classified_in_its_turn_and_the_rates_logged(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, index, prompt: REPLIES[index] if call == 0 else OK)
    episodes = play_keys(
        tiny_tokenizer,
        backend,
        [0, 1, 2, 3],
        template=registry.templates.get("tool_call")(),
        limits=RolloutLimits(max_new_tokens=48, max_context=2048, max_turns=1),
    )
    first = [[a["status"] for a in ep.turns[0].info["tool_calls"]] for ep in episodes]
    assert first == [["ok"], ["unclosed"], ["invalid_json"], ["unknown_tool"]]
    assert episodes[3].turns[0].info["tool_calls"][0]["name"] == "fly"
    metrics = rollout_metrics(episodes, 1.0, {})
    assert metrics["valid_call_turn_rate"] == 0.25 and metrics["tool_call_attempts"] == 1.0
    assert metrics["malformed_tool_call_rate"] == 0.5 and metrics["tool_call_unknown_tool_rate"] == 0.25


def test_an_env_without_offered_tools_logs_no_tool_call_rates(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, lambda call, index, prompt: "Action: open")
    episodes = play_keys(
        tiny_tokenizer,
        backend,
        template=registry.templates.get("react")(),
        limits=RolloutLimits(max_new_tokens=24, max_context=1024, max_turns=1),
    )
    assert "tool_calls" not in episodes[0].turns[0].info
    assert "valid_call_turn_rate" not in rollout_metrics(episodes, 1.0, {})


def step(valid: float, malformed: float = 0.0) -> dict[str, float]:
    return {
        "valid_call_turn_rate": valid,
        "malformed_tool_call_rate": malformed,
        "tool_call_invalid_json_rate": malformed,
    }


def test_no_valid_call_warns_at_half_the_steps_then_stops_with_the_rates():
    health, warned = ToolHealth(ToolHealthConfig(max_steps_without_valid_call=4)), []
    for number in (1, 2, 3):
        health.check(number, step(0.0), warned.append)
    assert len(warned) == 1 and "no well-formed tool call in 2 steps in a row" in warned[0]
    with pytest.raises(ToolCallsFailing, match=r"step 4: no reply of the last 4 steps .*valid call in 0% of turns"):
        health.check(4, step(0.0), warned.append)


def test_a_valid_call_or_a_step_without_tools_resets_nothing_it_should_not():
    health = ToolHealth(ToolHealthConfig(max_steps_without_valid_call=2))
    health.check(1, step(0.0), print)
    health.check(2, {"reward": 1.0}, print)  # no turn offered tools: counts for neither
    health.check(3, step(0.5), print)
    health.check(4, step(0.0), print)
    assert health.dry == 1


def test_mostly_unreadable_calls_stop_after_the_steps_in_a_row():
    health, warned = ToolHealth(ToolHealthConfig(max_malformed_rate=0.5, malformed_steps=2)), []
    health.check(1, step(0.5, malformed=0.8), warned.append)
    assert "80% of the tool-call attempts could not be read (valid call in 50% of turns" in warned[0]
    with pytest.raises(ToolCallsFailing, match="more than 0.5 of the tool-call attempts could not be read in 2 steps"):
        health.check(2, step(0.5, malformed=0.9), warned.append)


def test_meaningless_limits_are_refused():
    with pytest.raises(ConfigError, match=r"tool_health.max_malformed_rate must be in \[0, 1\]"):
        ToolHealth(ToolHealthConfig(max_malformed_rate=1.5))


def test_a_training_run_whose_policy_never_calls_a_tool_stops(tiny_model_dir, tmp_path):
    cfg = gridworld_grpo_config(
        tiny_model_dir,
        tmp_path / "run",
        "env.template=tool_call",
        "steps=5",
        "tasks_per_step=1",
        "group_size=2",
        "generation.max_new_tokens=6",
        "tool_health.max_steps_without_valid_call=2",
    )
    with pytest.raises(ToolCallsFailing, match="step 2: no reply of the last 2 steps made a well-formed call"):
        run_rl(cfg)
