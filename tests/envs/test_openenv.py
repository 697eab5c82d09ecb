"""The `openenv` client against real OpenEnv servers on 127.0.0.1: a number-guessing env written
with openenv-core's own server classes (Environment, Action, Observation, create_fastapi_app),
served by uvicorn in a thread of the test."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
from fastapi import FastAPI, WebSocket
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient
from pydantic import Field

from omrl.envs import EnvError, EpisodeFinishedError, UnknownTaskError, fork_support
from omrl.errors import ConfigError
from omrl.rollout.pool import EnvPool
from omrl.serve import background_server
from omrl_plugins.envs.engines.common import MissingExtraError
from omrl_plugins.envs.openenv import OpenEnvEnv, action_spec, render_observation, to_action
from omrl_plugins.envs.openenv.session import SERVERS
from tests.helpers import eval_report

FAST = {"retries": 1, "backoff": 0.01, "timeout": 10.0, "connect_timeout": 2.0}


# -- a real OpenEnv env: guess the number (task id = seed; the secret is seed % 20 + 1) ------------
class GuessAction(Action):
    guess: int = Field(..., description="your guess, a whole number from 1 to 20")


class GuessObservation(Observation):
    feedback: str = ""
    guesses_left: int = 0


class GuessEnvironment(Environment):
    """Five guesses at a number from 1 to 20; reward 1 for the right one. Guess 0 crashes the env."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    barrier: threading.Barrier | None = None  # set by a test: steps wait until that many run at once
    stepped_by: set[int] = set()  # ids of the env instances (one per session) that stepped

    def __init__(self):
        super().__init__()
        self.secret, self.left, self._state = 0, 0, State()

    def reset(self, seed=None, episode_id=None, explode=False):
        if explode:
            raise RuntimeError("the reset exploded")
        self.secret, self.left = (seed or 0) % 20 + 1, 5
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess a number from 1 to 20.", guesses_left=5)

    def step(self, action, timeout_s=None, **kwargs):
        if action.guess == 0:
            raise RuntimeError("guess 0 crashed the env")
        if GuessEnvironment.barrier is not None:
            GuessEnvironment.barrier.wait()  # breaks (an error answer) unless every session steps at once
        GuessEnvironment.stepped_by.add(id(self))
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.secret:
            return GuessObservation(feedback="Right!", guesses_left=self.left, done=True, reward=1.0)
        hint = "higher" if action.guess < self.secret else "lower"
        return GuessObservation(feedback=f"No: {hint}.", guesses_left=self.left, done=self.left == 0, reward=0.0)

    @property
    def state(self):
        return self._state


class SoloGuessEnvironment(GuessEnvironment):
    """The same env without SUPPORTS_CONCURRENT_SESSIONS: its server takes one session."""

    SUPPORTS_CONCURRENT_SESSIONS = False


def guess_app(env_class=GuessEnvironment, sessions: int = 8):
    return create_fastapi_app(env_class, GuessAction, GuessObservation, max_concurrent_envs=sessions)


@pytest.fixture(scope="module")
def guess_url():
    with background_server(guess_app()) as url:
        yield url


@contextmanager
def opened(*envs):
    try:
        yield envs
    finally:
        for env in envs:
            env.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- episodes -----------------------------------------------------------------------------------
def test_plays_whole_episodes_on_one_session(guess_url):
    with opened(OpenEnvEnv(base_url=guess_url, **FAST)) as (env,):
        first = env.reset(7)  # secret 8
        assert first.text == "feedback: Guess a number from 1 to 20.\nguesses_left: 5"
        assert first.info == {"task_id": 7, "server": guess_url}
        assert "your guess, a whole number from 1 to 20" in env.action_help and "'guess'" in env.action_help
        miss = env.step("3")
        assert (miss.observation, miss.reward, miss.done, miss.won, miss.score) == (
            "feedback: No: higher.\nguesses_left: 4",
            0.0,
            False,
            False,
            0.0,
        )
        hit = env.step(" 8 ")
        assert (hit.observation.splitlines()[0], hit.reward, hit.done, hit.won, hit.score) == (
            "feedback: Right!",
            1.0,
            True,
            True,
            1.0,
        )
        with pytest.raises(EpisodeFinishedError):
            env.step("8")
        session = env._session
        env.reset(12)  # secret 13: a new episode on the same session, all five guesses wrong
        results = [env.step("1") for _ in range(5)]
        assert env._session is session
        assert [r.done for r in results] == [False] * 4 + [True]
        assert not results[-1].won and results[-1].score == 0.0 and "guesses_left: 0" in results[-1].observation


def test_an_action_the_env_refuses_is_an_invalid_step_and_play_goes_on(guess_url):
    with opened(OpenEnvEnv(base_url=guess_url, **FAST)) as (env,):
        env.reset(0)  # secret 1
        refused = env.step("seven")
        assert refused.info["invalid"] is True and not refused.done and refused.reward == 0.0
        assert "guess: Input should be a valid integer" in refused.observation
        assert env.action_help in refused.observation
        assert env.step("1").won


def test_eight_episodes_on_one_server_run_side_by_side_with_their_own_state(guess_url):
    """Through the rollout's own EnvPool: each step waits at a barrier of 8 inside the server, so
    the steps pass only when all eight sessions step at the same time."""
    GuessEnvironment.stepped_by = set()
    pool = EnvPool(OpenEnvEnv, {"base_url": guess_url, **FAST}, name="openenv", num_workers=8)
    try:
        envs = [pool.acquire() for _ in range(8)]
        firsts = pool.reset_many([(env, task) for env, task in zip(envs, range(20, 28))])  # secrets 1..8
        assert all(first.text.startswith("feedback: Guess") for first in firsts)
        assert len({id(env._session) for env in envs}) == 8 and SERVERS.open_sessions(guess_url) >= 8
        GuessEnvironment.barrier = threading.Barrier(8, timeout=20)
        started = time.monotonic()
        probes = pool.step_many([(env, "4") for env in envs])
        GuessEnvironment.barrier = None
        assert not [p for p in probes if isinstance(p, BaseException)], probes
        assert time.monotonic() - started < 20
        assert [p.observation.splitlines()[0] for p in probes] == ["feedback: No: lower."] * 3 + [
            "feedback: Right!"
        ] + ["feedback: No: higher."] * 4
        assert len(GuessEnvironment.stepped_by) == 8  # eight env instances on the server
        rest = pool.step_many([(env, str(secret)) for env, secret in zip(envs, range(1, 9)) if secret != 4])
        assert all(r.won and "guesses_left: 3" in r.observation for r in rest)
    finally:
        GuessEnvironment.barrier = None
        pool.close()
    assert SERVERS.open_sessions(guess_url) == 0  # closing the pool closed every session


def test_sessions_spread_over_single_session_servers_and_a_full_set_fails_at_once():
    with (
        background_server(guess_app(SoloGuessEnvironment, 1)) as one,
        background_server(guess_app(SoloGuessEnvironment, 1)) as two,
    ):
        options = {"base_url": [one, two], **FAST}
        first, second, third = OpenEnvEnv(**options), OpenEnvEnv(**options), OpenEnvEnv(**options)
        with opened(first, second, third):
            servers = {first.reset(1).info["server"], second.reset(2).info["server"]}
            assert servers == {one, two}  # one session on each
            assert first.step("2").won and second.step("3").won
            started = time.monotonic()
            with pytest.raises(
                EnvError,
                match="this process already holds every session the servers take "
                r"\(1 on .+, 1 on .+\).*max_concurrent_envs",
            ):
                third.reset(3)  # each server refuses, says it takes 1, and both hold this process's
            assert time.monotonic() - started < 5
            second.close()  # frees a server: the third env takes its place
            assert third.reset(3).info["server"] in servers and third.step("4").won


def test_a_server_full_of_another_clients_sessions_is_an_env_error_naming_it():
    with background_server(guess_app(SoloGuessEnvironment, 1)) as url:
        other = GenericEnvClient(base_url=url).sync()  # openenv's own client holds the one session
        try:
            other.connect()
            other.reset(seed=1)
            with pytest.raises(
                EnvError,
                match=rf"openenv server {url}: opening a session and reset\(seed=2\) "
                r"failed: it is full \(Server at capacity: 1/1 .*gave up after 2 "
                "attempts.*start the server with a larger max_concurrent_envs",
            ):
                OpenEnvEnv(base_url=url, **FAST).reset(2)
        finally:
            other.close()
        assert SERVERS.open_sessions(url) == 0


# -- failures of the world ----------------------------------------------------------------------
def test_a_dead_server_is_an_env_error_naming_the_server_and_the_call():
    url = f"http://127.0.0.1:{free_port()}"
    env = OpenEnvEnv(base_url=url, **FAST)
    started = time.monotonic()
    with pytest.raises(
        EnvError,
        match=rf"openenv server {url}: opening a session and reset\(seed=3\) failed: "
        r"ConnectionError: .*gave up after 2 attempts\); is the server running\?",
    ):
        env.reset(3)
    assert time.monotonic() - started < 5
    assert SERVERS.open_sessions(url) == 0


def test_a_server_that_dies_mid_episode_and_comes_back():
    port = free_port()
    env = OpenEnvEnv(base_url=f"http://127.0.0.1:{port}", **FAST)
    with opened(env):
        with background_server(guess_app(), port=port):
            env.reset(4)  # secret 5
        with pytest.raises(
            EnvError,
            match=rf"openenv server http://127.0.0.1:{port}: step\(\{{'guess': '5'\}}\) "
            "failed: .*the session is gone",
        ):
            env.step("5")
        with pytest.raises(EpisodeFinishedError):
            env.step("5")  # the episode ended with its session
        with background_server(guess_app(), port=port):
            env.reset(4)  # a new session on the restarted server
            assert env.step("5").won


def test_a_server_that_never_answers_times_out():
    with socket.socket() as silent:  # accepts connections (the backlog) but never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = OpenEnvEnv(base_url=url, retries=0, connect_timeout=0.5, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(EnvError, match=rf"openenv server {url}: opening a session.*timed out"):
            env.reset(1)
        assert time.monotonic() - started < 5


def test_errors_of_the_env_itself_name_the_call_and_the_session_survives(guess_url):
    with opened(OpenEnvEnv(base_url=guess_url, **FAST)) as (env,):
        env.reset(9)
        with pytest.raises(
            EnvError,
            match=rf"openenv server {guess_url}: step\(\{{'guess': '0'\}}\) failed: "
            r"the server answered: guess 0 crashed the env \(EXECUTION_ERROR\)",
        ):
            env.step("0")
        with pytest.raises(EpisodeFinishedError):
            env.step("10")
        env.reset(9)
        assert env.step("10").won
    exploding = OpenEnvEnv(base_url=guess_url, reset_fields={"explode": True}, **FAST)
    with pytest.raises(
        EnvError,
        match=r"reset\(explode=True, seed=1\) failed: the server answered: the reset "
        r"exploded \(EXECUTION_ERROR\)",
    ):
        exploding.reset(1)
    assert SERVERS.open_sessions(guess_url) == 0


def malformed_app(answer: str) -> FastAPI:
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        while True:
            await websocket.receive_text()
            await websocket.send_text(answer)

    return app


@pytest.mark.parametrize(
    "answer, problem",
    [
        ("<html>oops</html>", "the answer is not JSON"),
        ('["observation"]', "expected {'type': ..., 'data': {...}}"),
        ('{"type": "state", "data": {}}', "expected a 'observation' answer"),
        ('{"type": "observation", "data": {"observation": "text", "done": false}}', "'observation' must be an object"),
        ('{"type": "observation", "data": {"observation": {}, "reward": NaN}}', "'reward' must be a finite number"),
        ('{"type": "observation", "data": {"observation": {}, "reward": "1"}}', "'reward' must be a finite number"),
        ('{"type": "observation", "data": {"observation": {}, "reward": true}}', "'reward' must be a finite number"),
        (
            '{"type": "observation", "data": {"observation": {}, "reward": 1%s}}' % ("0" * 400),
            "'reward' must be a finite number",
        ),
        ('{"type": "observation", "data": {"observation": {}, "done": "no"}}', "'done' must be true or false"),
    ],
)
def test_a_malformed_answer_is_an_env_error(answer, problem):
    with background_server(malformed_app(answer)) as url:
        env = OpenEnvEnv(base_url=url, **FAST)
        with pytest.raises(EnvError, match=rf"openenv server {url}: opening a session") as error:
            env.reset(1)
        assert problem in str(error.value)
        assert SERVERS.open_sessions(url) == 0


def test_any_failure_frees_the_session_slot_and_closes_the_connection(guess_url, monkeypatch):
    """An unforeseen failure (a bug in the client library, a check that raises) must not leak a session:
    after max_sessions of them every reset in the process would fail."""
    from omrl_plugins.envs.openenv import session

    def surprise(data):
        raise LookupError("a surprise")

    env = OpenEnvEnv(base_url=guess_url, max_sessions=1, **FAST)
    with opened(env):
        env.reset(3)
        monkeypatch.setattr(session, "check_observation", surprise)
        with pytest.raises(LookupError):
            env.step("4")  # inside a session
        assert SERVERS.open_sessions(guess_url) == 0
        with pytest.raises(LookupError):
            env.reset(3)  # opening one
        assert SERVERS.open_sessions(guess_url) == 0
        monkeypatch.undo()
        assert env.reset(3).text  # the one slot is free again


# -- options and the pieces -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        ({"base_url": "localhost:8000"}, "plugins.openenv.base_url must be a server URL"),
        ({"base_url": ["http://a:1", "http://a:1/"]}, "lists a server twice"),
        ({"base_url": "http://[::1"}, "plugins.openenv.base_url 'http://.::1' is not a valid URL"),
        ({"score": "max"}, "plugins.openenv.score must be one of sum, last"),
        ({"timeout": 0}, "plugins.openenv.timeout must be a number >= 0.001"),
        ({"max_sessions": 0}, "plugins.openenv.max_sessions must be a number >= 1"),
        ({"win_score": 0}, "plugins.openenv.win_score must be a number in (0, 1]"),
        ({"splits": {"test": "all"}}, "plugins.openenv.splits.test must be a task count"),
        ({"reset_fields": ["seed"]}, "plugins.openenv.reset_fields must map"),
    ],
)
def test_bad_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OpenEnvEnv(**options)


def test_a_run_asks_whether_any_listed_server_takes_a_connection(guess_url, monkeypatch):
    """Asked before the model loads (omrl.envs.check_env_reachable): none up is refused, some down are warned of."""
    from omrl_plugins.envs.openenv import servers

    down = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(EnvError, match=r"none of the 2 openenv servers listed takes a connection \(http://127"):
        OpenEnvEnv(base_url=down).check_reachable()
    with pytest.raises(EnvError, match=r"GET /health failed: cannot connect \(ConnectError: .*is the server running"):
        OpenEnvEnv(base_url=down[0]).check_reachable()
    with pytest.warns(UserWarning, match=f"openenv servers that take no connection: {down[0]}; playing on the others"):
        OpenEnvEnv(base_url=[down[0], guess_url]).check_reachable()
    monkeypatch.setattr(servers, "PROBE_SECONDS", 0.2)
    with socket.socket() as silent:  # takes the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.warns(UserWarning, match=f"did not answer GET /health within 0.2 s: {url}"):
            OpenEnvEnv(base_url=url).check_reachable()


def test_splits_urls_and_task_ids():
    env = OpenEnvEnv(
        base_url=["ws://127.0.0.1:1/ws", "https://example.org/"],
        splits={"test": 3, "train": 5},
        deterministic=True,
        max_turns=4,
    )
    assert env.urls == ["http://127.0.0.1:1", "https://example.org"]
    assert env.splits == ("test", "train") and list(env.split_of("train")) == [3, 4, 5, 6, 7]
    assert env.max_turns == 4 and fork_support(env) == "replay"
    with pytest.raises(UnknownTaskError, match="unknown task id 8; valid: test 0..2, train 3..7"):
        env.reset(8)
    assert list(OpenEnvEnv().task_ids("test")) == list(range(100))


def test_score_last_and_reward_scale(guess_url):
    with opened(OpenEnvEnv(base_url=guess_url, score="last", reward_scale=2.0, win_score=0.5, **FAST)) as (env,):
        env.reset(2)
        assert env.step("1").score == 0.0
        result = env.step("3")
        assert (result.reward, result.score, result.won) == (1.0, 0.5, True)


def test_observation_and_action_fields(guess_url):
    options = {"base_url": guess_url, "action_field": "guess", "action_help": "Guess.", **FAST}
    with opened(OpenEnvEnv(observation_field="feedback", **options)) as (env,):
        assert env.reset(1).text == "Guess a number from 1 to 20."
        assert env.step("1").observation == "No: higher." and env.action_help == "Guess."
    with opened(OpenEnvEnv(observation_field="board", **options)) as (env,):
        with pytest.raises(
            ConfigError, match="the observation has no field 'board'.*its fields: feedback, guesses_left"
        ):
            env.reset(1)
    with opened(OpenEnvEnv(base_url=guess_url, action_field="number", **FAST)) as (env,):
        with pytest.raises(
            ConfigError,
            match="action_field is 'number', but the action of the env at .* has no such field; its fields: guess",
        ):
            env.reset(1)


def test_action_spec_and_to_action():
    two = {
        "title": "MoveAction",
        "required": ["x", "y"],
        "properties": {
            "metadata": {"type": "object"},
            "x": {"type": "integer", "description": "column"},
            "y": {"type": "integer"},
        },
    }
    spec = action_spec(two, None, None, "http://s")
    assert spec.field is None
    assert spec.help == (
        "Reply with one action as a JSON object, the MoveAction with fields: x (integer, required): "
        "column; y (integer, required)."
    )
    assert to_action('{"x": 1, "y": 2}', None) == ({"x": 1, "y": 2}, "")
    assert to_action("[1, 2]", None) == (None, "the action must be a JSON object, not list")
    assert to_action("x=1", None)[1].startswith("the action must be a JSON object (")
    one_required = {**two, "required": ["x"]}
    assert action_spec(one_required, None, None, "http://s").field == "x"
    assert action_spec(None, "cmd", "Type a command.", "http://s").help == "Type a command."
    assert to_action(" look \n", "cmd") == ({"cmd": "look"}, "")


def test_render_observation():
    assert render_observation({"text": "You see a door."}) == "You see a door."
    assert render_observation({"board": [[1, 0]], "note": None, "turn": "x"}) == "board: [[1, 0]]\nturn: x"
    assert render_observation({"a": 1, "b": "two"}, "b") == "two"
    with pytest.raises(KeyError, match="no field 'c'.*its fields: a, b"):
        render_observation({"a": 1, "b": 2}, "c")


def test_registering_imports_no_openenv():
    code = (
        "import sys, omrl_plugins.envs.openenv as m; "
        "assert not [n for n in sys.modules if n.split('.')[0] == 'openenv'], 'openenv imported'; "
        "assert m.OpenEnvEnv.package == 'openenv-core' and m.OpenEnvEnv.extra == 'openenv'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    from omrl.registry import envs

    assert envs.get("openenv") is OpenEnvEnv and OpenEnvEnv.io_bound


def test_a_missing_openenv_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.generic_client", None)  # makes the import fail
    with pytest.raises(MissingExtraError, match=r"the openenv env needs .*pip install 'omrl\[openenv\]'"):
        OpenEnvEnv()


# -- the CLI ----------------------------------------------------------------------------------------
def test_omrl_eval_plays_an_openenv_server(guess_url, tmp_path):
    _, written = eval_report(
        tmp_path,
        "eval",
        "--model",
        "tiny",
        "--env",
        "openenv",
        f"plugins.openenv.base_url={guess_url}",
        "plugins.openenv.retries=1",
        "--num-tasks",
        "3",
        "generation.max_new_tokens=4",
        "env.max_turns=2",
    )
    assert written["metrics"]["episodes"] == 3 and written["metrics"]["env_errors"] == 0
    assert [ep["task_id"] for ep in written["episodes"]] == [0, 1, 2]  # the default test split
    assert SERVERS.open_sessions(guess_url) == 0
