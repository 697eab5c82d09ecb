"""Tool calls read from a reply, every attempt classified (omrl.chat.tool_calls)."""

import pytest

from omrl.chat.tool_calls import (
    STATUSES,
    call_text,
    one_call_only,
    parse_tool_calls,
    result_text,
    tools_system_text,
)
from tests.gateway.agents import MULTIPLY


def statuses(text: str) -> list[str]:
    return [attempt.status for attempt in parse_tool_calls(text, [MULTIPLY]).attempts]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>', ["ok"]),
        ('<tool_call>\n{"name": "multiply", "arguments": "{\\"a\\": 6, \\"b\\": 7}"}\n</tool_call>', ["ok"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}</tool_call>', ["invalid_json"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}', ["unclosed"]),
        ('<tool_call>{"arguments": {"a": 6, "b": 7}}</tool_call>', ["missing_name"]),
        ('<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 7}}</tool_call>', ["unknown_tool"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": "6", "b": 7}}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7, "c": 1}}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7, "unit": "kg"}}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "multiply", "arguments": [6, 7]}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "multiply", "arguments": {"a": true, "b": 7}}</tool_call>', ["bad_arguments"]),
        ("<tool_call>" + "[" * 5000 + "</tool_call>", ["invalid_json"]),
        ("The answer is 42.", []),
    ],
)
def test_each_attempt_gets_its_status(text, expected):
    assert statuses(text) == expected
    assert set(expected) <= set(STATUSES)


def test_several_calls_each_classified_and_the_parsed_ones_reach_the_agent():
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>\n'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n'
        "<tool_call>not json</tool_call>"
    )
    reply = parse_tool_calls(text, [MULTIPLY])
    assert [a.status for a in reply.attempts] == ["ok", "unknown_tool", "invalid_json"]
    assert [(c.name, c.arguments) for c in reply.calls] == [("multiply", {"a": 6, "b": 7}), ("nope", {})]
    assert reply.content == "Let me compute."
    assert "valid: multiply" in reply.attempts[1].error


def test_a_reply_whose_calls_all_fail_keeps_its_whole_text():
    text = 'Thinking <tool_call>{"name": "multiply", "arguments": {"a": 6'
    reply = parse_tool_calls(text, [MULTIPLY])
    assert reply.calls == [] and reply.content == text


def test_the_text_format_round_trips():
    written = call_text("multiply", {"a": 6, "b": 7})
    assert parse_tool_calls(written, [MULTIPLY]).calls[0].arguments == {"a": 6, "b": 7}
    assert "multiply" in tools_system_text([MULTIPLY]) and "<tool_call>" in tools_system_text([MULTIPLY])
    assert result_text("42") == "<tool_response>\n42\n</tool_response>"


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"name": "multiply", "parameters": {"a": 6, "b": 7}}', ["ok"]),
        (
            '{"name": "multiply", "parameters": {"a": 6, "b": 7}}; {"name": "nope", "parameters": {}}',
            ["ok", "unknown_tool"],
        ),
        ('{"name": "multiply", "parameters": {"a": 6', ["invalid_json"]),
        ('{"parameters": {"a": 6, "b": 7}}', ["missing_name"]),
        ("The answer is 42.", []),
    ],
)
def test_the_json_format_as_llama_3_writes_it(text, expected):
    reply = parse_tool_calls(text, [MULTIPLY], "json")
    assert [a.status for a in reply.attempts] == expected
    assert reply.content == ("" if reply.calls else text)


def test_one_call_only_loses_the_parsed_calls_past_the_first():
    text = '{"name": "nope", "parameters": {}}; {"name": "multiply", "parameters": {"a": 6, "b": 7}}; {"a"'
    reply = one_call_only(parse_tool_calls(text, [MULTIPLY], "json"))
    assert [a.status for a in reply.attempts] == ["unknown_tool", "unsupported_parallel", "invalid_json"]
    assert [c.name for c in reply.calls] == ["nope"] and "unsupported_parallel" in STATUSES
