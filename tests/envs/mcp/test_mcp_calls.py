"""The mcp env's calls against real servers: a call that hangs the server ends the episode within its
deadline and stops that server (and close() stops a server whose session task is stuck); a call to a tool the
env lacks is a tool error, not the answer; a tool's one argument is text only when its schema says string;
and ``allowed_tools=[]`` says so."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from omrl.envs import EnvError
from omrl.errors import ConfigError
from omrl_plugins.envs.mcp import McpEnv, client
from omrl_plugins.envs.tooling import single_string_argument
from tests.envs.mcp.conftest import gone_soon, server_pid, stdio_options

SCHEMA_SERVER = Path(__file__).with_name("schema_server.py")
BLOCK = 'block[{"seconds": 300}]'  # holds the whole server: it reads nothing meanwhile, end-of-input included
linux = pytest.mark.skipif(sys.platform != "linux", reason="the server's pid and process group are read from /proc")


# -- a hung call ---------------------------------------------------------------------------------------
@linux
@pytest.mark.slow  # waits out a deadline, and the SDK's stop of the server
def test_a_call_that_hangs_the_server_ends_soon_after_its_deadline_and_the_server_is_gone(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, timeout_s=2))
    try:
        for episode in range(2):  # one server lost per hang, none left behind
            env.reset(0)
            server = server_pid(pid_file)
            started = time.monotonic()
            with pytest.raises(EnvError, match=r"no answer to tools/call block within 2 s \(timeout_s\)"):
                env.step(BLOCK)
            took = time.monotonic() - started
            assert took < 2 + 5, f"episode {episode}: the hung call returned after {took:.1f} s"
            assert gone_soon(server, within=3.0), f"episode {episode}: the hung server {server} is still running"
        env.reset(0)  # and the next episode plays on a new server
        assert env.step('add[{"a": 2, "b": 3}]').observation == "5"
    finally:
        env.close()


@linux
@pytest.mark.slow  # holds the session loop for seconds
def test_close_stops_the_server_itself_when_the_session_task_cannot_end(tasks, pid_file, monkeypatch):
    monkeypatch.setattr(client, "STOP_WAIT", 0.5)  # close() gives up on the task in 2 x 0.5 s
    env = McpEnv(**stdio_options(tasks, pid_file))
    env.reset(0)
    server = server_pid(pid_file)
    held, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:  # nothing on the session loop runs meanwhile: the SDK cannot stop the server
        held.set()
        release.wait(60)

    connection = env.client._connection
    client.session_loop().call_soon_threadsafe(hold_the_loop)
    try:
        assert held.wait(10)
        env.close()
        assert connection.alive  # the task could not end, so the SDK did not stop the server...
        assert gone_soon(server, within=1.0), "close() gave up and left the server running"  # ...close() did
    finally:
        release.set()
    connection.close()  # the loop runs again: the session ends too
    assert not connection.alive


# -- a tool the env lacks ---------------------------------------------------------------------------------
def test_a_call_to_a_tool_the_env_lacks_is_a_tool_error_and_the_episode_goes_on(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file))
    try:
        env.reset(1)
        misspelt = env.step('lookupp[{"key": "alice"}]')
        assert (misspelt.done, misspelt.reward, misspelt.info["tool_error"]) == (False, 0.0, True)
        assert misspelt.info["tool"] == "lookupp" and misspelt.info["invalid"] is True
        assert misspelt.observation.startswith("There is no tool lookupp; the tools are add, lookup, fail")
        assert "answer[your answer]" in misspelt.observation
        native = env.action_from_tool_call("get_value", {"key": "alice"})  # a native call naming no tool
        called = env.step(native)
        assert (called.done, called.info["tool_error"]) == (False, True)
        assert called.observation.startswith("There is no tool get_value;")
        with pytest.raises(ValueError, match="There is no tool 'get value'"):  # no action reads as that call
            env.action_from_tool_call("get value", {})
        assert env.step("lookup[alice]").observation == "42"  # the episode went on
        assert env.step("answer[42]").won
        # an answer holding brackets is still the answer
        env.reset(0)
        listed = env.step("answer[[5]]")
        assert listed.done and "tool" not in listed.info and listed.info["ground_truth"] == "5"
        env.reset(0)
        bare = env.step("[5]")  # text that names no tool goes to the scorer as it is
        assert bare.done and "tool" not in bare.info
    finally:
        env.close()


def test_allowed_tools_refuses_the_tools_left_out_and_an_empty_list(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, allowed_tools=["add"]))
    try:
        env.reset(1)
        left_out = env.step("lookup[alice]")  # the server has it; this env does not offer it
        assert not left_out.done and left_out.info["tool_error"] is True
        assert left_out.observation.startswith("There is no tool lookup; the tools are add, answer.")
        assert env.step("answer[42]").won
    finally:
        env.close()
    with pytest.raises(ConfigError, match=r"allowed_tools is empty.*its tools \(add, lookup, fail, slow, block"):
        McpEnv(**stdio_options(tasks, pid_file, allowed_tools=[]))
    assert gone_soon(server_pid(pid_file))  # the server it started is stopped


# -- one argument, not a string ---------------------------------------------------------------------------
@pytest.fixture
def schema_env(tasks):
    env = McpEnv(command=[sys.executable, str(SCHEMA_SERVER)], path=str(tasks))
    try:
        env.reset(0)
        yield env
    finally:
        env.close()


def test_a_tools_one_argument_is_text_only_where_its_schema_says_string(schema_env):
    parameters = {tool["name"]: tool["parameters"] for tool in schema_env.tools}
    assert "type" not in parameters["keys"]["properties"]["data"]  # Any: no type at all
    assert [single_string_argument({"parameters": parameters[name]}) for name in ("total", "keys", "echo")] == [
        None,
        None,
        "text",
    ]
    # the documented JSON form reaches the server
    assert schema_env.step('keys[{"data": {"b": 1, "a": 2}}]').observation == "a,b"
    assert schema_env.step('total[{"values": [1, 2, 3]}]').observation == "6"
    # a string or null is text as it is
    assert schema_env.step('echo[say "hi"]').observation == '"say \\"hi\\""'
    # native calls become the actions that make them
    for name, arguments, action, result in [
        ("keys", {"data": {"a": 1}}, 'keys[{"data": {"a": 1}}]', "a"),
        ("total", {"values": [4, 5]}, 'total[{"values": [4, 5]}]', "9"),
        ("echo", {"text": "x]y"}, "echo[x]y]", '"x]y"'),
    ]:
        assert schema_env.action_from_tool_call(name, arguments) == action
        step = schema_env.step(action)
        assert (step.observation, step.info["tool_error"]) == (result, False), (name, arguments)


def test_a_native_call_giving_a_string_argument_something_else_writes_it_as_json(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file))
    try:
        env.reset(1)
        action = env.action_from_tool_call("lookup", {"key": {"alice": 1}})  # lookup(key: str)
        assert action == 'lookup[{"alice": 1}]'  # not a Python repr, {'alice': 1}
        missing = env.step(action)
        assert missing.info["tool_error"] is True and """no key '{"alice": 1}'""" in missing.observation
    finally:
        env.close()


@pytest.mark.parametrize(
    "schema, text",
    [
        ({"type": "string"}, True),
        ({"type": "string", "maxLength": 8}, True),
        ({"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}, True),
        ({"type": ["string", "null"]}, True),
        ({}, False),  # Any
        ({"title": "Data"}, False),
        ({"type": "integer"}, False),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, False),
        ({"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]}, False),
        ({"type": ["string", "object"]}, False),
    ],
)
def test_single_string_argument_reads_the_schemas_type(schema, text):
    spec = {"name": "t", "parameters": {"type": "object", "properties": {"x": schema}}}
    assert single_string_argument(spec) == ("x" if text else None)
