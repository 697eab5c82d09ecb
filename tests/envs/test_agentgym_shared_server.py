"""A foreign AgentGym server shared by several processes: a restart that only another process saw
must never let this client play, score or close the env that process was handed.

The server is AgentGym's TextCraft server in a process of its own (tests/envs/agentgym_textcraft.py,
on the real game), killed and started again on its port; the other client is an omrl client in
another process. A restarted AgentGym server numbers its env ids from 0 again, so client A's id
from before the restart is the id the other process's client B is handed next.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from omrl.envs import EnvError
from omrl.errors import ConfigError
from omrl.serve import background_server
from omrl_plugins.envs.agentgym import AgentGymEnv
from tests.envs.agentgym_apps import (
    Recorder,
    Restartable,
    agentgym_like_app,
    falsy_textcraft_app,
    textcraft_app,
    tool_app,
)
from tests.envs.agentgym_textcraft import expert_plan

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.envs.agentgym_textcraft"
FAST = {"retries": 2, "backoff": 0.05, "timeout": 10.0}
A_TASK, B_TASK = 1, 2  # emerald block and glass pane, each crafted in two steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TextCraftProcess:
    """AgentGym's TextCraft server in its own process on a fixed port; :meth:`restart` kills it and
    starts a new process there (its envs gone, its ids from 0 again)."""

    def __init__(self, log: Path):
        self.port, self.log = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", MODULE, "serve", str(self.port)], cwd=ROOT, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url, timeout=1).json() == "This is environment TextCraft.":
                    return
            except httpx.TransportError:
                pass
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()


class OtherProcess:
    """Client B: an omrl client in another process, reset to ``task`` (see agentgym_textcraft.client)."""

    def __init__(self, url: str, task: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", MODULE, "client", url, str(task)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.first = self._answer()

    def _answer(self) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.process.kill()
            raise AssertionError(f"client B answered nothing: {self.process.stderr.read()}")
        return json.loads(line)

    def step(self, action: str) -> dict:
        self.process.stdin.write(action + "\n")
        self.process.stdin.flush()
        return self._answer()

    def finish(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0, self.process.stderr.read()


@pytest.fixture
def server(tmp_path):
    process = TextCraftProcess(tmp_path / "server.log")
    process.start()
    yield process
    process.stop()


@pytest.mark.slow  # several processes
def test_a_restart_seen_only_by_another_process_ends_the_stale_episode_as_an_env_error(server):
    """Issue 50: A is mid-episode when the server restarts; B, in another process, is handed env
    id 0, A's number. A's next steps would craft B's goal and record B's win as A's (won True,
    reward 1.0). A's process saw no create after the restart, so only the env itself can tell: its
    last observation on the server is not the one A saw. A's step is not sent, its episode is an
    env error, and B plays its own env untouched to the win."""
    a = AgentGymEnv(base_url=server.url, env_name="textcraft", **FAST)
    assert a.reset(A_TASK).text.endswith("\n\nGoal: craft emerald block.")
    assert a._env_id == 0 and not a.step("get 9 emerald").done
    server.restart()
    b = OtherProcess(server.url, B_TASK)
    assert b.first == {"env_id": 0, "goal": "Goal: craft glass pane."}  # A's number, on the new start
    plan = expert_plan(B_TASK)
    with pytest.raises(EnvError, match=r"POST /step failed: not sent: env id 0 may now be another client's env"):
        a.step(plan[0])  # before: stepped B's env, and the next step recorded won True, reward 1.0
    assert [b.step(action) for action in plan] == [
        {"won": False, "reward": 0.0, "done": False},
        {"won": True, "reward": 1.0, "done": True},
    ]  # B's own check before each step passed: A never touched its env
    b.finish()
    a.reset(A_TASK)  # A plays on with a new env of its own
    assert a._env_id == 1 and [a.step(action).info["won"] for action in expert_plan(A_TASK)] == [False, True]
    a.close()


@pytest.mark.slow  # several processes
def test_an_unfinished_episode_never_closes_the_env_another_process_was_handed(server):
    """A turn cap ends A's episode after a restart that only B's process saw: closing A's number
    would end B's env (before: B's next step answered "The id 0 is not valid.")."""
    a = AgentGymEnv(base_url=server.url, env_name="textcraft", **FAST)
    a.reset(A_TASK)
    server.restart()
    b = OtherProcess(server.url, B_TASK)
    assert b.first["env_id"] == 0 == a._env_id
    a.end_episode()  # what the rollout's pool does when the turn cap ends an episode
    assert [b.step(action)["won"] for action in expert_plan(B_TASK)] == [False, True]
    b.finish()
    a.close()


@pytest.mark.slow  # several processes
def test_one_process_sees_a_restart_through_any_spelling_of_the_servers_url(server):
    """Clients of one process that name the server as 127.0.0.1 and as localhost share what they
    see of its ids: B's create after the restart answers A's number, so A's episode is lost."""
    a = AgentGymEnv(base_url=server.url, env_name="textcraft", **FAST)
    b = AgentGymEnv(base_url=f"http://localhost:{server.port}/", env_name="textcraft", **FAST)
    a.reset(A_TASK)
    a.step("get 9 emerald")
    server.restart()
    b.reset(B_TASK)
    assert b._env_id == 0 == a._env_id
    with pytest.raises(EnvError, match=r"env id 0 may now be another client's env \(.*restarted"):
        a.step("get 6 glass")
    assert [b.step(action).info["won"] for action in expert_plan(B_TASK)] == [False, True]
    a.close()
    b.close()


def test_the_check_is_one_read_after_the_reset_and_one_before_each_step():
    app = Recorder(textcraft_app())
    with background_server(app) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(3)
        env.step("get 2 planks")
        assert env.step("craft 1 stick3 using 2 planks").won
        env.close()
    observe = ("GET", "/observation", None)
    assert app.sent() == [
        ("POST", "/create", {}),
        ("POST", "/reset", {"id": 0, "data_idx": 3}),
        observe,  # the route answers the reset's observation: the server can be checked
        observe,
        ("POST", "/step", {"id": 0, "action": "get 2 planks"}),
        observe,
        ("POST", "/step", {"id": 0, "action": "craft 1 stick3 using 2 planks"}),
        ("POST", "/close", {"id": 0}),  # at once, after the check that preceded the winning step
    ]


def test_server_key_spells_each_server_one_way():
    from omrl_plugins.envs.agentgym.ids import server_key

    spellings = ["http://127.0.0.1:36001", "http://localhost:36001/", "http://LOCALHOST:36001", "http://[::1]:36001"]
    spellings.append("http://0.0.0.0:36001")
    try:
        socket.getaddrinfo(socket.gethostname(), None)
        spellings.append(f"http://{socket.gethostname()}:36001")  # this machine's own name
    except OSError:
        pass  # a host name that does not resolve names no server
    assert len({server_key(url) for url in spellings}) == 1
    assert server_key("http://127.0.0.1") == server_key("http://localhost:80")
    assert server_key("http://127.0.0.1:36001") != server_key("http://127.0.0.1:36002")
    assert server_key("http://127.0.0.1:36001") != server_key("https://127.0.0.1:36001")
    assert (
        server_key("http://10.1.2.3:36001")
        == server_key("http://10.1.2.3:36001/")
        != server_key("http://10.1.2.4:36001")
    )
    assert server_key("http://127.0.0.1:36001/env/") == server_key("http://localhost:36001/env")


# -- servers the client cannot check: refused unless the risk is accepted by name -----------------


def test_a_server_that_cannot_show_an_envs_state_is_refused_unless_the_risk_is_accepted():
    """SearchQA's server hands out ids from a counter and has no route that answers an env's last
    observation: a restart seen from another process could not be told, so it is refused."""
    with background_server(tool_app(with_close=True)) as url:
        env = AgentGymEnv(base_url=url, env_name="searchqa", splits={"test": 5}, **FAST)
        with pytest.raises(ConfigError, match=r"accept_shared_server_risk: true") as refused:
            env.reset(2)
        assert "restart" in str(refused.value) and "another process" in str(refused.value)
        assert httpx.post(f"{url}/step", json={"env_idx": 0, "action": "look"}).status_code == 500  # closed
        risky = AgentGymEnv(base_url=url, env_name="searchqa", splits={"test": 5}, accept_shared_server_risk=True)
        risky.reset(2)
        assert risky.step("finish").won
        risky.close()
    with pytest.raises(ConfigError, match="accept_shared_server_risk must be true or false"):
        AgentGymEnv(env_name="searchqa", accept_shared_server_risk="yes")


def test_a_textcraft_server_without_a_truthful_observation_route_is_refused_unless_accepted():
    """The check needs GET /observation to answer the env's last observation: a server without the
    route (HTTP 404), or whose route answers something else, cannot be checked."""

    def without_observation():
        app = textcraft_app()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/observation"]
        return app

    def lying():
        app = textcraft_app()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/observation"]
        app.get("/observation")(lambda id: "Crafting commands: none")
        return app

    for make, problem in ((without_observation, "HTTP 404"), (lying, "answered 'Crafting commands: none'")):
        with background_server(make()) as url:
            env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
            with pytest.raises(ConfigError, match=rf"GET /observation .*{problem}.*accept_shared_server_risk"):
                env.reset(3)
            risky = AgentGymEnv(base_url=url, env_name="textcraft", accept_shared_server_risk=True, **FAST)
            risky.reset(3)
            assert risky.step("craft 1 stick3 using 2 planks").won
            risky.close()


def test_an_in_process_restart_is_still_told_by_the_ids_and_a_vanished_env_by_the_check():
    """The checks add to what one process sees: a restart whose new ids went to this process
    names the restart; an env the new server does not hold is a refusal naming the id."""
    server = Restartable(falsy_textcraft_app)
    with background_server(server) as url:
        a = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        a.reset(5)
        server.restart()
        with pytest.raises(EnvError, match=r"POST /step failed: .*answered false.*no longer knows env id 0"):
            a.step("craft stick5")
        a.reset(5)
        assert a.step("craft stick5").won
        a.close()
    log: list = []
    with background_server(agentgym_like_app(log)) as url:
        a = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        a.reset(1)
        httpx.post(f"{url}/reset", json={"id": 0, "data_idx": 9})  # another client resets A's env
        with pytest.raises(EnvError, match=r"observation on the server is 'task 9: craft a stick\.'"):
            a.step("craft")
        assert ("step", 0, 9) not in log
        a.close()
