"""`omrl env serve` and envs that hang, raise in close, or are closed under a call: one stuck env costs
only its own id, shutdown is bounded and closes every env, and a closed id is never played."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from omrl.serve import background_server, create_app, store
from omrl.serve.store import Rejected, ServedEnvs
from omrl_plugins.envs.gridworld import GridWorld


def within(seconds: float, call):
    """``call()``'s result (or what it raised); fails the test when it runs past ``seconds`` (it would hang)."""
    box: dict = {}

    def run():
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds:g} s"
    if "error" in box:
        raise box["error"]
    return box["result"]


def refused(call, within_s: float = 5.0) -> Rejected:
    with pytest.raises(Rejected) as caught:
        within(within_s, call)
    return caught.value


class Hang:
    """A step on "hang" that never returns until the test lets it go (an engine that stopped answering)."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.original = GridWorld.step

    def step(self, env, action):
        if action == "hang":
            self.entered.set()
            self.release.wait(60)
        return self.original(env, action)


@pytest.fixture
def hang(monkeypatch):
    hang = Hang()
    monkeypatch.setattr(GridWorld, "step", lambda env, action: hang.step(env, action))
    yield hang
    hang.release.set()


def in_background(call) -> dict:
    """Run ``call()`` in a daemon thread; the dict gets its "result" or "error" when it ends."""
    box: dict = {}

    def run():
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    threading.Thread(target=run, daemon=True).start()
    return box


def test_a_hung_env_costs_only_its_own_id_and_stopping_answers_its_call(hang, monkeypatch):
    monkeypatch.setattr(store, "BUSY_WAIT", 0.2, raising=False)
    served = ServedEnvs("gridworld", GridWorld, idle_timeout=None)
    stuck, other = served.create(), served.create()
    served.reset(stuck, 0)
    served.reset(other, 0)
    hung = in_background(lambda: served.step(stuck, "hang"))
    assert hang.entered.wait(5)

    busy = refused(lambda: served.observation(stuck))
    assert busy.status == 503 and f"env id {stuck} is busy" in str(busy) and "its step has run for" in str(busy)
    assert within(5, lambda: served.step(other, "up")).observation  # other ids play on
    assert within(5, served.create) not in (stuck, other)

    served.stop()  # shutdown: the hung call answers at once instead of holding the server
    deadline = time.monotonic() + 5
    while not hung and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(hung.get("error"), Rejected) and hung["error"].status == 503, hung
    assert "shutting down" in str(hung["error"])
    assert within(10, served.close_all) == []
    assert served.ids() == []


def test_a_call_past_the_call_timeout_answers_504_and_the_id_is_busy_until_closed(hang):
    served = ServedEnvs("gridworld", GridWorld, idle_timeout=None, call_timeout=0.3)
    env_id = served.create()
    served.reset(env_id, 0)
    late = refused(lambda: served.step(env_id, "hang"))
    assert late.status == 504, late
    assert f"env id {env_id}: the env did not return from step within 0.3 s (--call-timeout)" in str(late)
    busy = refused(lambda: served.reset(env_id, 1))
    assert busy.status == 503 and f"env id {env_id} is busy" in str(busy)
    within(5, lambda: served.close(env_id))  # closing a stuck env frees its id
    assert served.ids() == []
    assert refused(lambda: served.observation(env_id)).status == 404


def test_a_server_with_a_hung_call_stops_when_asked_and_closes_its_envs(hang, monkeypatch):
    closed = []
    original_close = GridWorld.close
    monkeypatch.setattr(GridWorld, "close", lambda env: closed.append(env) or original_close(env))
    app = create_app("gridworld")
    answers: dict = {}

    def serve_and_stop():
        with background_server(app) as url:
            env_id = httpx.post(f"{url}/create").json()["id"]
            httpx.post(f"{url}/reset", json={"id": env_id, "data_idx": 0})
            step = in_background(lambda: httpx.post(f"{url}/step", json={"id": env_id, "action": "hang"}, timeout=30))
            assert hang.entered.wait(5)
            answers["step"] = step
        # leaving the block stops the server, as Ctrl-C does

    within(20, serve_and_stop)
    deadline = time.monotonic() + 5
    while not answers["step"] and time.monotonic() < deadline:
        time.sleep(0.01)
    response = answers["step"]["result"]
    assert response.status_code == 503 and "shutting down" in response.json()["error"]
    assert len(closed) == 2  # the env and the catalog


def test_shutdown_closes_every_env_and_the_catalog_when_a_close_raises(monkeypatch, capsys):
    closed = []

    def close(env):
        closed.append(env)
        if len(closed) == 1:
            raise RuntimeError("engine already gone")

    monkeypatch.setattr(GridWorld, "close", close)
    with TestClient(create_app("gridworld")) as http:
        ids = [http.post("/create").json()["id"] for _ in range(3)]
    err = capsys.readouterr().err
    assert len(closed) == 4  # three envs and the catalog
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "engine already gone" in line]
    assert len(lines) == 1 and "close() raised RuntimeError: engine already gone" in lines[0], err
    assert any(f"env id {env_id}" in lines[0] for env_id in ids)


def test_a_call_that_looked_up_its_id_before_a_close_answers_404(monkeypatch):
    served = ServedEnvs("gridworld", GridWorld, idle_timeout=None)
    env_id = served.create()
    looked_up = served.get(env_id)  # a call paused between its lookup and the id's lock...
    served.close(env_id)  # ...while another closes the id
    monkeypatch.setattr(served, "get", lambda *args, **kwargs: looked_up)
    late = refused(lambda: served.reset(env_id, 1))
    assert late.status == 404 and f"the id {env_id} is not valid" in str(late)


SERVE_A_HANGING_ENV = """
import sys, threading
from omrl_plugins.envs.gridworld import GridWorld
def step(self, action):
    print("stepping", file=sys.stderr, flush=True)
    threading.Event().wait()
def close(self):
    print("closed an env", file=sys.stderr, flush=True)
GridWorld.step, GridWorld.close = step, close
from omrl.cli import main
main(sys.argv[1:])
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a server process of its own, stopped with Ctrl-C
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_stops_a_server_whose_env_hangs(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE_A_HANGING_ENV, "env", "serve", "gridworld", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                env_id = httpx.post(f"{url}/create").json()["id"]
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        httpx.post(f"{url}/reset", json={"id": env_id, "data_idx": 0})
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/step", json={"id": env_id, "action": "up"}, timeout=1)
        server.send_signal(signal.SIGINT)
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    text = log.read_text()
    assert server.returncode in (0, 130), text  # 130: the shell's code for Ctrl-C
    assert "Traceback" not in text and "closed an env" in text, text


def test_serve_takes_the_call_timeout_and_refuses_a_negative_one(monkeypatch):
    from typer.testing import CliRunner

    import omrl.serve
    from omrl.cli import build_app
    from omrl.errors import OmrlError

    served = {}
    monkeypatch.setattr(omrl.serve, "run_server", lambda app, host, port, **_: served.update(envs=app.state.envs))
    result = CliRunner().invoke(build_app(), ["env", "serve", "gridworld", "--call-timeout", "7.5"])
    assert result.exit_code == 0, result.output
    assert served["envs"].call_timeout == 7.5
    assert create_app("gridworld", call_timeout=0).state.envs.call_timeout is None  # 0: never
    with pytest.raises(OmrlError, match=r"call_timeout must be a number of seconds >= 0 \(0: never\), got -1"):
        create_app("gridworld", call_timeout=-1)
