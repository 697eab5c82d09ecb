"""No MCP server process outlives omrl (issue 50, point 5): a clean close takes along what the server started,
even a grandchild in a session of its own (``setsid``), and a SIGKILLed omrl takes along a server blocked in a
call (which reads no end-of-input) and its grandchildren."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from omrl_plugins.envs.mcp import McpEnv, client
from tests.envs.mcp.conftest import gone_soon, running, server_pid, stdio_options

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals and /proc are Linux's")


def wait_for(path: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} was not written within {within:g} s"
        time.sleep(0.05)


@pytest.mark.slow  # several processes: a server and its grandchild
def test_a_clean_close_takes_along_a_grandchild_in_its_own_session(tasks, tmp_path):
    pid_file, escapee_file = tmp_path / "server.pid", tmp_path / "escapee.pid"
    options = stdio_options(tasks, pid_file)
    options["env"]["MCP_TEST_ESCAPEE_PID_FILE"] = str(escapee_file)
    env = McpEnv(**options)
    try:
        env.reset(0)
        server, escapee = server_pid(pid_file), server_pid(escapee_file)
        assert running(server) and running(escapee)
        assert os.getsid(escapee) != os.getsid(server)  # out of the server's session and process group
    finally:
        env.close()
    assert gone_soon(server, within=1.0)
    assert gone_soon(escapee, within=5.0)


# an omrl process: an mcp env whose server is held in a tool call when the test kills this process
KILLED_RUN = """
import json, sys
from omrl_plugins.envs.mcp import McpEnv, client
env = McpEnv(**json.loads(sys.argv[1]))
env.reset(0)
env.step('block[{"seconds": 300}]')
"""


@pytest.mark.slow  # several processes: a run SIGKILLed, its server and grandchildren
def test_a_sigkilled_run_takes_along_a_server_blocked_in_a_call_and_its_grandchildren(tasks, tmp_path):
    pid_file, escapee_file, block_file = tmp_path / "server.pid", tmp_path / "escapee.pid", tmp_path / "blocking"
    options = stdio_options(tasks, pid_file, timeout_s=600)
    options["env"].update(MCP_TEST_ESCAPEE_PID_FILE=str(escapee_file), MCP_TEST_BLOCK_FILE=str(block_file))
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, json.dumps(options)], stderr=subprocess.PIPE)
    try:
        wait_for(block_file)  # the server is inside the call: it reads nothing, end-of-input included
        server, escapee = server_pid(pid_file), server_pid(escapee_file)
        assert running(server) and running(escapee)
    finally:
        run.send_signal(signal.SIGKILL)
        _, err = run.communicate(timeout=30)
    assert gone_soon(server, within=10.0), f"the server outlived the killed run ({err.decode()[-2000:]})"
    assert gone_soon(escapee, within=10.0), "the server's setsid grandchild outlived the killed run"


def blocked_envs(tasks, tmp_path, count: int) -> tuple[list[McpEnv], list[int]]:
    """``count`` mcp envs, each with its server held inside a tool call, and the servers' pids."""
    envs, pids = [], []
    for n in range(count):
        options = stdio_options(tasks, tmp_path / f"server{n}.pid", timeout_s=600)
        options["env"]["MCP_TEST_BLOCK_FILE"] = str(tmp_path / f"blocking{n}")
        envs.append(McpEnv(**options))
        envs[-1].reset(0)
        threading.Thread(target=_step_quietly, args=(envs[-1], 'block[{"seconds": 300}]'), daemon=True).start()
    for n in range(count):
        wait_for(tmp_path / f"blocking{n}")
        pids.append(server_pid(tmp_path / f"server{n}.pid"))
    return envs, pids


def _step_quietly(env: McpEnv, action: str) -> None:
    try:
        env.step(action)
    except Exception:  # noqa: BLE001 - the close under this call ends it
        pass


@pytest.mark.slow  # four server processes, each blocked in a call
def test_closing_with_calls_in_flight_takes_seconds_and_every_connection_at_once(tasks, tmp_path):
    envs, pids = blocked_envs(tasks, tmp_path, 4)
    try:
        started = time.monotonic()
        envs[0].close()  # a call in flight: cancelled at once, not waited for
        one = time.monotonic() - started
        started = time.monotonic()
        client._close_all()  # the other three, as at exit (after Ctrl-C): side by side
        rest = time.monotonic() - started
    finally:
        for env in envs:
            env.close()
    assert one < 8, f"closing one connection took {one:.1f} s"  # not STOP_WAIT (10 s) and more
    assert rest < 2 * max(one, 1.0), f"closing three took {rest:.1f} s (one took {one:.1f} s)"  # not 3 x one
    assert all(gone_soon(pid, within=5.0) for pid in pids)
