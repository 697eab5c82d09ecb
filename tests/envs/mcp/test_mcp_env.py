"""The `mcp` env against real MCP servers in processes of their own: the test server of ``server.py``
over stdio and over streamable HTTP, and omrl's own shop server behind ``mcp:sqlite``; its episodes,
whose failures are whose (tool_error, EnvError, or ConfigError before a model loads), reconnects, no
orphan servers, the rollout and the CLI."""

from __future__ import annotations

import doctest
import json
import logging
import os
import re
import shlex
import signal
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from omrl import registry
from omrl.data.trajectory import read_episodes
from omrl.envs import EnvError, EpisodeFinishedError, UnknownTaskError, create_env
from omrl.errors import ConfigError
from omrl.models import loading
from omrl.rollout.loop import RolloutLimits, collect
from omrl.rollout.pool import EnvPool
from omrl_plugins.envs.mcp import McpEnv, sqlite_demo
from tests.envs.mcp.conftest import (
    SERVER,
    free_port,
    gone_soon,
    http_server,
    running,
    server_pid,
    stdio_options,
)
from tests.fakes import ActionTemplate, ScriptedBackend
from tests.helpers import cli_exit, eval_report, fresh_python_json, play_expert

ADD = 'add[{"a": 2, "b": 3}]'
ONCE_SERVER = Path(__file__).with_name("once_server.py")
EXITS = [sys.executable, "-c", "import sys; sys.stderr.write('no database here\\n'); sys.exit(2)"]


@pytest.fixture
def stdio_env(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, timeout_s=5))
    try:
        yield env
    finally:
        env.close()


# -- episodes over stdio ------------------------------------------------------------------------------
def test_the_servers_tools_are_the_envs_and_a_call_is_a_turn(stdio_env, pid_file):
    started = server_pid(pid_file)  # the server started when the env was built
    first = stdio_env.reset(0)
    assert server_pid(pid_file) == started  # the reset plays on it
    assert first.text == "What is 2 + 3?"
    tools = {tool["name"]: tool for tool in stdio_env.tools}
    assert set(tools) == {
        "answer",
        "add",
        "lookup",
        "fail",
        "slow",
        "block",
        "chatter",
        "crash",
        "picture",
        "long_text",
    }
    assert tools["add"]["description"] == "Add two integers."
    assert tools["add"]["parameters"]["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert "add[...]" in stdio_env.action_help and "answer[your answer]" in stdio_env.action_help

    result = stdio_env.step(ADD)
    assert (result.observation, result.reward, result.done) == ("5", 0.0, False)
    assert result.info["tool"] == "add" and result.info["tool_error"] is False
    # a one-string tool takes its text as it is
    assert stdio_env.step("lookup[alice]").observation == "42"
    assert stdio_env.action_from_tool_call("lookup", {"key": "bob"}) == "lookup[bob]"
    assert stdio_env.step(stdio_env.action_from_tool_call("lookup", {"key": "bob"})).observation == "7"
    # non-text parts are named; a long result is cut and says so
    assert stdio_env.step("picture[]").observation == "a red pixel\n[image: image/png]"
    cut = stdio_env.step('long_text[{"count": 4100}]').observation
    assert cut == "x" * 4000 + "\n[result truncated: 100 more characters]"
    final = stdio_env.step("answer[5]")
    assert (final.reward, final.done, final.won) == (1.0, True, True)

    # the next episode plays on the same server process; a wrong answer scores 0
    pid = server_pid(pid_file)
    stdio_env.reset(1)
    assert server_pid(pid_file) == pid
    wrong = stdio_env.step("answer[41]")
    assert (wrong.reward, wrong.done, wrong.won, wrong.info["ground_truth"]) == (0.0, True, False, "42")
    with pytest.raises(EpisodeFinishedError):
        stdio_env.step(ADD)
    with pytest.raises(UnknownTaskError):
        stdio_env.reset(99)


def test_the_agents_mistakes_are_tool_errors_and_the_episode_goes_on(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, max_calls=5))
    try:
        env.reset(1)
        failed = env.step("fail[]")
        assert failed.info["tool_error"] is True and not failed.done
        assert "this tool always fails" in failed.observation
        missing = env.step("lookup[carol]")  # the tool raised: isError
        assert missing.info["tool_error"] is True and "no key 'carol'" in missing.observation
        bad_type = env.step('add[{"a": "two", "b": 3}]')  # the server's argument validation
        assert bad_type.info["tool_error"] is True and "valid integer" in bad_type.observation
        not_json = env.step("add[2 and 3]")  # never reaches the server
        assert not_json.info["tool_error"] is True and "must be a JSON object" in not_json.observation
        assert env.step(ADD).observation == "5"  # the session is fine after all that
        spent = env.step(ADD)  # the sixth call of an episode of five
        assert spent.info["invalid"] is True and "No tool calls left" in spent.observation
        assert env.step("answer[42]").won
    finally:
        env.close()


def test_a_server_printing_other_lines_on_stdout_costs_one_line_each_naming_it(tasks, pid_file, caplog):
    env = McpEnv(**stdio_options(tasks, pid_file))
    try:
        env.reset(0)
        with caplog.at_level(logging.WARNING, logger="mcp.client.stdio"):
            step = env.step("chatter[debug: " + "x" * 5000 + "]")
    finally:
        env.close()
    assert step.observation == "said 5007 characters"  # the session went on
    records = [record for record in caplog.records if record.name == "mcp.client.stdio"]
    assert len(records) == 1 and records[0].exc_info is None, [record.getMessage()[:200] for record in records]
    message = records[0].getMessage()
    assert message.startswith(f"MCP server `{shlex.join([sys.executable, str(SERVER)])}` printed a line")
    assert "'debug: xxx" in message and "\n" not in message and len(message) < 600, message


@pytest.mark.slow  # waits out a deadline
def test_a_tool_that_does_not_answer_in_time_is_an_env_error(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, timeout_s=1))
    try:
        env.reset(0)
        first = server_pid(pid_file)
        started = time.monotonic()
        with pytest.raises(EnvError, match=r"no answer to tools/call slow within 1 s \(timeout_s\)"):
            env.step('slow[{"seconds": 30}]')
        assert time.monotonic() - started < 10
        assert gone_soon(first)  # the stuck server is stopped, not left behind
        # the next reset starts a new server and plays on
        env.reset(0)
        assert server_pid(pid_file) != first
        assert env.step(ADD).observation == "5"
    finally:
        env.close()


@pytest.mark.slow  # a server killed, then a second one started
def test_a_server_killed_mid_episode_is_an_env_error_and_the_next_reset_restarts_it(stdio_env, pid_file):
    stdio_env.reset(0)
    assert stdio_env.step(ADD).observation == "5"
    pid = server_pid(pid_file)
    os.kill(pid, signal.SIGKILL)
    assert gone_soon(pid)
    with pytest.raises(EnvError, match="tools/call add failed: the connection (closed|is gone)"):
        stdio_env.step(ADD)
    with pytest.raises(EnvError, match="not connected"):  # until the next reset
        stdio_env.step(ADD)
    stdio_env.reset(0)
    assert server_pid(pid_file) != pid and stdio_env.step(ADD).observation == "5"
    # a server that dies between episodes is replaced by the reset (it pings the one it holds)
    pid = server_pid(pid_file)
    os.kill(pid, signal.SIGKILL)
    assert gone_soon(pid)
    stdio_env.reset(2)
    assert stdio_env.step('add[{"a": 20, "b": 22}]').observation == "42"
    # and a server that exits in the middle of a call (the crash tool) is one as well
    with pytest.raises(EnvError, match="tools/call crash failed"):
        stdio_env.step("crash[]")


@pytest.mark.slow  # several server processes
def test_each_instance_has_its_own_server_and_close_stops_it(tasks, tmp_path):
    envs = [McpEnv(**stdio_options(tasks, tmp_path / f"pid{i}")) for i in range(3)]
    try:
        for env in envs:
            env.reset(0)
        pids = [server_pid(tmp_path / f"pid{i}") for i in range(3)]
        assert len(set(pids)) == 3 and all(running(pid) for pid in pids)
    finally:
        for env in envs:
            env.close()
    assert all(gone_soon(pid, within=1.0) for pid in pids)  # close waited for each to stop
    envs[0].close()  # a second close does nothing


@pytest.mark.slow  # waits for a server
def test_a_server_that_cannot_start_is_refused_when_the_env_is_built(tasks):
    with pytest.raises(
        ConfigError, match=r"could not start: .*its stderr ends: no database here\. Check plugins.mcp.command: run it"
    ):
        McpEnv(command=EXITS, path=str(tasks))
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(ConfigError, match=r"could not start: .*no answer within 1 s \(start_timeout_s\)"):
        McpEnv(command=silent, path=str(tasks), start_timeout_s=1)
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nobody listens there
    with pytest.raises(ConfigError, match=rf"MCP server {url}: could not start: .*Is an MCP server listening at"):
        McpEnv(url=url, path=str(tasks), start_timeout_s=10)


def test_a_server_that_started_once_and_cannot_start_again_is_an_env_error(tasks, tmp_path):
    options = {"command": [sys.executable, str(ONCE_SERVER)], "env": {"MCP_TEST_ONCE_FILE": str(tmp_path / "ran")}}
    env = McpEnv(**options, path=str(tasks))  # it starts, lists its tools and exits
    other = McpEnv(**options, path=str(tasks))  # it cannot start now: not the setup's fault, it started before
    try:
        assert [tool["name"] for tool in env.tools] == ["answer", "noop"]
        for instance in (env, env, other):  # each reset tries again
            with pytest.raises(EnvError, match="could not start: .*its stderr ends: no database here"):
                instance.reset(0)
    finally:
        env.close()
        other.close()


# -- over streamable HTTP -----------------------------------------------------------------------------
@pytest.mark.slow  # an HTTP server killed, then a second one started
def test_a_streamable_http_server_its_death_and_its_return(tasks):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    env = None
    try:
        with http_server(port) as server:
            env = McpEnv(url=url, path=str(tasks), timeout_s=5, start_timeout_s=10)
            env.reset(1)
            assert {tool["name"] for tool in env.tools} >= {"add", "lookup", "slow"}
            assert env.step("lookup[alice]").observation == "42"
            assert env.step("fail[]").info["tool_error"] is True
            assert env.step("answer[42]").won
            env.reset(0)
            server.kill()
            server.wait()
            with pytest.raises(EnvError, match=f"MCP server {url}: tools/call add failed"):
                env.step(ADD)
            with pytest.raises(EnvError, match="could not start: ConnectError"):
                env.reset(0)  # nobody listens there now
        with http_server(port):  # back on the same port: the next reset connects again
            env.reset(0)
            assert env.step(ADD).observation == "5"
    finally:
        if env is not None:
            env.close()


# -- bad options ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        ({}, r"plugins.mcp.command and plugins.mcp.url are unset; set one of them"),
        ({"command": "x", "url": "http://h/mcp"}, r"both name a server; set one of them"),
        ({"url": "ftp://h/mcp"}, r"url must be an http:// or https:// URL"),
        ({"url": "http://h/mcp", "env": {"A": "1"}}, r"env sets a stdio server's environment"),
        (
            {"command": "no-such-mcp-server --x"},
            r"'no-such-mcp-server' is not an executable file nor a program on PATH",
        ),
        ({"command": "server 'unclosed"}, r"does not split into words"),
        ({"command": [sys.executable], "env": ["A=1"]}, r"env must map variable names to values"),
        ({"command": [sys.executable], "timeout_s": 0}, r"timeout_s must be a number >= 0.001"),
        ({"command": [sys.executable], "max_calls": 0}, r"max_calls must be a number >= 1"),
        ({"command": [sys.executable], "allowed_tools": "add"}, r"allowed_tools must be a list of tool names"),
    ],
)
def test_bad_server_options_are_config_errors(tasks, options, message):
    with pytest.raises(ConfigError, match=message):
        McpEnv(**{"path": str(tasks), **options})


def test_bad_task_options_and_unknown_options_name_what_is_valid(tasks, tmp_path):
    with pytest.raises(ConfigError, match=r"the mcp env needs plugins.mcp.path=FILE"):
        McpEnv(command=[sys.executable])
    with pytest.raises(ConfigError, match=r"mcp env, its tasks .*no such file"):
        McpEnv(command=[sys.executable], path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(
        ConfigError, match=r"does not take options .*'bogus'.*its options: command, url, env, timeout_s"
    ):
        create_env(McpEnv, {"command": "x", "bogus": 1}, name="mcp")
    variant = registry.envs.get("mcp:sqlite")
    with pytest.raises(
        ConfigError, match=r"does not take options \['command'\].*its options: timeout_s, start_timeout_s"
    ):
        create_env(variant, {"command": "x"}, name="mcp:sqlite")


def test_allowed_tools_picks_the_servers_tools_and_names_the_ones_it_lacks(tasks, pid_file):
    env = McpEnv(**stdio_options(tasks, pid_file, allowed_tools=["add"]))
    try:
        env.reset(0)
        assert [tool["name"] for tool in env.tools] == ["answer", "add"]
        not_offered = env.step("lookup[alice]")  # not a tool here: refused, not taken for the answer
        assert not_offered.info["tool_error"] is True and not not_offered.done
    finally:
        env.close()
    with pytest.raises(ConfigError, match=r"allowed_tools names \['multiply'\].*its tools: add, lookup, fail"):
        McpEnv(**stdio_options(tasks, pid_file, allowed_tools=["add", "multiply"]))  # known when it is built
    assert gone_soon(server_pid(pid_file))  # and the server it started is stopped


def test_registering_imports_no_mcp():
    loaded = fresh_python_json(
        "import sys, json; from omrl.registry import envs; envs.get('mcp:sqlite'); "
        "print(json.dumps([n for n in sys.modules if n.split('.')[0] in ('mcp', 'mcp_types')]))"
    )
    assert loaded == []


# -- mcp:sqlite, on omrl's own shop server --------------------------------------------------------------
def test_every_shipped_answer_is_what_its_sql_computes():
    rows = [json.loads(line) for path in (sqlite_demo.TASKS, sqlite_demo.TEST_TASKS) for line in path.open()]
    assert len(rows) == 42
    with closing(sqlite3.connect(sqlite_demo.shop_database())) as db:
        for row in rows:
            (value,) = db.execute(row["sql"]).fetchone()
            assert str(value) == row["answer"], row["question"]


@pytest.fixture
def shop():
    env = create_env(registry.envs.get("mcp:sqlite"), {}, name="mcp:sqlite")
    try:
        yield env
    finally:
        env.close()


def test_mcp_sqlite_answers_a_shipped_question_with_the_servers_read_only_tools(shop):
    assert shop.client.spec.argv[-4:-2] == ("-m", "omrl_plugins.envs.mcp.shop_server")  # this Python, no uv
    assert (len(shop.task_ids("train")), len(shop.task_ids("test"))) == (32, 10)
    first = shop.reset(0)
    assert "How many orders did Alice place?" in first.text and "SQLite database" in first.text
    assert {tool["name"] for tool in shop.tools} == {"answer", *sqlite_demo.READ_ONLY_TOOLS}
    assert json.loads(shop.step("list_tables[]").observation) == ["customers", "order_items", "orders", "products"]
    columns = json.loads(shop.step("describe_table[customers]").observation)
    assert [column["name"] for column in columns] == ["id", "name", "city", "joined"]
    count = shop.step(
        "read_query[SELECT COUNT(*) AS n FROM orders JOIN customers ON customers.id = orders.customer_id "
        "WHERE customers.name = 'Alice']"
    )
    assert json.loads(count.observation) == [{"n": 3}] and not count.info["tool_error"]
    # read-only: the server refuses what is not a SELECT, and the database refuses a write behind a WITH
    refused = shop.step("read_query[DELETE FROM orders]")
    assert refused.info["tool_error"] and "Only SELECT queries are allowed" in refused.observation
    hidden = shop.step("read_query[WITH x AS (SELECT 1) DELETE FROM orders]")
    assert hidden.info["tool_error"] and "readonly database" in hidden.observation
    missing = shop.step("describe_table[refunds]")
    assert missing.info["tool_error"] and "no table 'refunds'; the tables: customers" in missing.observation
    assert shop.step("answer[3]").won


def test_the_expert_helpers_do_what_their_examples_say():
    assert doctest.testmod(sqlite_demo).failed == 0


def test_the_expert_finds_every_answer_with_the_tools(shop):
    for task in [*shop.task_ids("train"), *shop.task_ids("test")]:
        results = play_expert(shop, task)
        actions = [turn.info.get("tool") for turn in results]
        assert actions[0] == "list_tables" and actions[-2] == "read_query" and actions[-1] is None, actions
        assert "describe_table" in actions and not any(turn.info.get("tool_error") for turn in results)
        assert results[-1].won, task
        row = json.loads(results[-2].observation)[0]  # the answer is what the query returned
        assert [str(value) for value in row.values()] == [results[-1].info["ground_truth"]], task


# -- through the rollout and the CLI ---------------------------------------------------------------------
@pytest.mark.slow  # MCP servers
@pytest.mark.parametrize("template", [[], ["--template", "tool_call"]], ids=["default", "tool_call"])
def test_the_documented_expert_rollout_plays_the_tools(template, tmp_path, capsys):
    out = tmp_path / "expert.parquet"
    words = ["rollout", "--env", "mcp:sqlite", "--expert", "--num-tasks", "4", *template, "-o", str(out)]
    code, _, err = cli_exit(capsys, *words)
    assert code in (0, None), err
    episodes = read_episodes(out)
    assert [ep.task_id for ep in episodes] == [0, 1, 2, 3]
    for episode in episodes:
        tools = [turn.info.get("tool") for turn in episode.turns]
        assert tools[0] == "list_tables" and set(tools[1:-2]) == {"describe_table"}, tools
        assert tools[-2:] == ["read_query", None], tools
        assert episode.end_reason != "env_error" and episode.turns[-1].info["won"]
        # each call's result is the next turn's observation: the tables, ..., the rows the answer is read from
        assert "order_items" in episode.turns[1].observation
        (row,) = json.loads(episode.turns[-1].observation)
        assert episode.turns[-1].action == f"answer[{next(iter(row.values()))}]"
    assert episodes[0].turns[-1].observation == '[{"COUNT(*)": 3}]'  # How many orders did Alice place?


@pytest.mark.slow  # an MCP server and a model
def test_omrl_eval_plays_mcp_sqlite_with_the_tiny_model(tmp_path):
    _, report = eval_report(
        tmp_path,
        "eval",
        "--model",
        "tiny",
        "--env",
        "mcp:sqlite",
        "--num-tasks",
        "4",
        "generation.max_new_tokens=8",
        "generation.max_context=1024",
    )
    metrics = report["metrics"]
    assert metrics["episodes"] == 4 and metrics["env_errors"] == 0
    assert [ep["task_id"] for ep in report["episodes"]] == [1_000_000 + i for i in range(4)]  # the test split
    assert "env_error" not in metrics["end_reasons"]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model fails the test: what it lists is every load tried."""
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise RuntimeError("a model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    return tried


@pytest.mark.parametrize(
    "env, says",
    [
        (
            ["mcp", "plugins.mcp.command=no-such-mcp-server --db-path shop.db", "plugins.mcp.path={tasks}"],
            r"plugins.mcp.command: 'no-such-mcp-server' is not an executable file nor a program on PATH; give the "
            r"server's path or install it",
        ),
        (
            ["mcp", f"plugins.mcp.command={shlex.join(EXITS)}", "plugins.mcp.path={tasks}"],
            r"MCP server `[^`]*sys.exit\(2\)'`: could not start: .*its stderr ends: no database here\. Check "
            r"plugins.mcp.command: run it yourself",
        ),
        (
            ["mcp:sqlite"],  # its server's module gone
            r"MCP server `.* -m omrl_plugins.envs.mcp.no_such_module --db-path .*`: could not start: .*No module "
            r"named omrl_plugins.envs.mcp.no_such_module.*: pip install 'omrl\[mcp\]'",
        ),
    ],
    ids=["no-such-command", "exits-at-once", "mcp-sqlite-broken"],
)
def test_a_server_that_cannot_start_stops_the_run_before_a_model_loads(
    env, says, tasks, tmp_path, capsys, monkeypatch, no_model_loads
):
    monkeypatch.setattr(sqlite_demo, "SERVER_MODULE", "omrl_plugins.envs.mcp.no_such_module")
    options = [word.format(tasks=tasks) for word in env[1:]]
    out = tmp_path / "out.parquet"
    code, _, err = cli_exit(capsys, "rollout", "--env", env[0], *options, "--model", "tiny", "-o", str(out))
    assert code == 2 and no_model_loads == [], err
    assert re.search(says, " ".join(err.split())), err
    assert not out.exists()


@pytest.mark.slow  # a server killed mid-rollout
def test_a_server_killed_mid_episode_ends_it_as_env_error_in_the_rollout(tasks, pid_file, tiny_tokenizer):
    def reply(call: int, index: int, prompt: list[int]) -> str:
        if call == 1:  # the server dies while the model thinks about its second turn
            os.kill(server_pid(pid_file), signal.SIGKILL)
            assert gone_soon(server_pid(pid_file))
        return "Action: " + ('add[{"a": 1, "b": 2}]' if call < 2 else "answer[5]")

    pool = EnvPool(McpEnv, stdio_options(tasks, pid_file), name="mcp")
    try:
        backend = ScriptedBackend(tiny_tokenizer, reply)
        limits = RolloutLimits(max_new_tokens=24, max_context=1024)
        (killed,) = collect(pool, ActionTemplate(), tiny_tokenizer, [0], backend=backend, limits=limits)
        assert killed.end_reason == "env_error"
        # the reader sees the end of output, or the write fails first: either way the connection is named
        assert re.search(r"tools/call add failed: the connection (closed|is gone)", killed.error), killed.error
        assert killed.turns[1].observation == "3"  # the first call's result, answered before the kill
        # the pool closed the broken instance; a new one starts its own server and plays to the end
        backend = ScriptedBackend(
            tiny_tokenizer, lambda call, index, prompt: ["Action: " + ADD, "Action: answer[5]"][min(call, 1)]
        )
        (played,) = collect(pool, ActionTemplate(), tiny_tokenizer, [0], backend=backend, limits=limits)
        assert (
            played.end_reason != "env_error" and played.turns[1].observation == "5" and played.turns[-1].reward == 1.0
        )
        pid = server_pid(pid_file)
    finally:
        pool.close()
    assert gone_soon(pid, within=1.0)


def test_the_http_transport_is_the_sdks_current_one_where_it_has_it():
    """mcp 2 (and late 1.x) name it ``streamable_http_client``; the old ``streamablehttp_client`` is deprecated
    there (its own timeouts, a warning a connection) and only used where the new name is missing."""
    import mcp.client.streamable_http as http

    from omrl_plugins.envs.mcp.sdk import http_client

    assert http_client() is (getattr(http, "streamable_http_client", None) or http.streamablehttp_client)
