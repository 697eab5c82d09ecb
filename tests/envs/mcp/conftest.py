"""Fixtures of the mcp env's tests: real MCP servers as processes of their own (the test server of
``server.py`` over stdio and over streamable HTTP) and a file of tasks."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

SERVER = Path(__file__).with_name("server.py")
TASKS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is stored under alice?", "answer": "42"},
    {"question": "What is 20 + 22?", "answer": "42"},
]


@pytest.fixture
def tasks(tmp_path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in TASKS), encoding="utf-8")
    return path


@pytest.fixture
def pid_file(tmp_path) -> Path:
    return tmp_path / "server.pid"


def stdio_options(tasks: Path, pid_file: Path, **more) -> dict:
    """The options of an mcp env on the test server over stdio, which writes its pid to ``pid_file``."""
    return {
        "command": [sys.executable, str(SERVER)],
        "env": {"MCP_TEST_PID_FILE": str(pid_file)},
        "path": str(tasks),
        **more,
    }


def server_pid(pid_file: Path) -> int:
    return int(pid_file.read_text())


def running(pid: int) -> bool:
    """Whether process ``pid`` is alive (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_soon(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def http_server(port: int) -> Iterator[subprocess.Popen]:
    """The test server over streamable HTTP on ``port``, once it accepts connections."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"the test server on port {port} exited with {process.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"the test server on port {port} did not open it in 30 s"
                time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
