"""The `agentgym` client against real servers on 127.0.0.1: `omrl serve`'s app, and FastAPI apps
as strict as AgentGym's own servers (tests/envs/agentgym_apps.py): every known env is played
through a full episode and the requests it sent are compared, bodies included, with what that
server takes."""

from __future__ import annotations

import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.responses import PlainTextResponse, Response

from omrl.envs import (
    DemoTurn,
    Env,
    EnvError,
    EpisodeFinishedError,
    Observation,
    StepResult,
    UnknownTaskError,
    fork_support,
)
from omrl.errors import ConfigError
from omrl.rollout import EnvPool
from omrl.serve import background_server, create_app
from omrl_plugins.envs.agentgym import AgentGymEnv, parse_splits
from tests.envs.agentgym_apps import (
    Recorder,
    Restartable,
    agentgym_like_app,
    alfworld_app,
    falsy_textcraft_app,
    flaky_app,
    lmrlgym_app,
    running_score_app,
    served_app,
    sqlgym_app,
    textcraft_app,
    tool_app,
    webarena_app,
    webshop_app,
)
from tests.fakes import Registers

FAST = {"retries": 2, "backoff": 0.01, "timeout": 5.0}


class CounterEnv(Env):
    """Count up to a target, then submit."""

    action_help = "up or submit"
    max_turns = 9
    demonstration = (DemoTurn("The counter shows 0.", "Count to 1.", "up"),)

    def __init__(self, start: int = 0):
        self.start = start
        self.value = self.target = 0
        self.done = True

    def task_ids(self, split):
        return {"train": range(0, 8), "test": [8, 9, 10, 11]}[split]  # /tasks sends a range, a list

    def reset(self, task_id):
        if task_id not in range(12):
            raise UnknownTaskError(f"unknown task {task_id}")
        self.value, self.target, self.done = self.start, task_id % 4 + 2, False
        return Observation(f"The counter shows {self.value}.", f"Count to {self.target}, then submit.")

    def step(self, action):
        if self.done:
            raise EpisodeFinishedError("the episode is over")
        if action == "explode":
            raise RuntimeError("kaboom")
        if action == "up":
            self.value += 1
            return StepResult(f"The counter shows {self.value}.", 0.0, False, {"won": False, "score": 0.0})
        if action == "submit":
            self.done = True
            won = self.value == self.target
            return StepResult(
                "You submitted.", float(won), True, {"won": won, "score": min(self.value / self.target, 1.0)}
            )
        return StepResult(
            f"{action!r} is not an action; try up or submit.", 0.0, False, {"won": False, "score": 0.0, "invalid": True}
        )

    def admissible_actions(self):
        return ["up", "submit"]

    def expert_action(self):
        return "up" if self.value < self.target else "submit"


@pytest.fixture
def counter_app(register_plugin):
    register_plugin(Registers({"counter": CounterEnv}), name="test-counter")
    return create_app("counter")


@pytest.fixture
def counter_url(counter_app):
    with background_server(counter_app) as url:
        yield url


def play_with_expert(env: Env, task_id: int) -> StepResult:
    env.reset(task_id)
    for _ in range(env.max_turns):
        result = env.step(env.expert_action())
        if result.done:
            return result
    raise AssertionError("the expert did not finish")


def test_plays_served_env_to_a_win_with_its_expert(counter_url):
    env = AgentGymEnv(base_url=counter_url, env_name="counter", **FAST)
    try:
        assert env.splits == ("train", "test")
        assert env.split_of("train") == range(0, 8) and env.split_of("test") == [8, 9, 10, 11]
        assert env.action_help == "up or submit" and env.max_turns == 9
        assert env.demonstration == CounterEnv.demonstration  # the served env's worked example travels too
        first = env.reset(9)
        assert first.text == "The counter shows 0." and first.instruction == "Count to 3, then submit."
        assert env.admissible_actions() == ["up", "submit"]
        bad = env.step("jump")
        assert bad.info["invalid"] is True and "not an action" in bad.observation and not bad.done
        for task_id in env.split_of("test"):
            result = play_with_expert(env, task_id)
            assert result.won and result.score == 1.0 and result.reward == 1.0
        with pytest.raises(EpisodeFinishedError):
            env.step("up")
        with pytest.raises(UnknownTaskError, match=r"valid: train 0..7, test \(4 ids\)"):
            env.reset(99)
    finally:
        env.close()


def test_several_clients_step_concurrently_against_one_server(counter_url):
    clients = [AgentGymEnv(base_url=counter_url, env_name="counter", **FAST) for _ in range(6)]
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(lambda pair: play_with_expert(pair[1], pair[0]), enumerate(clients)))
        assert all(r.won for r in results)
        assert len({c._env_id for c in clients}) == 6  # one server-side id each
        assert httpx.get(f"{counter_url}/list_envs").json() == sorted(c._env_id for c in clients)
    finally:
        for c in clients:
            c.close()
    assert httpx.get(f"{counter_url}/list_envs").json() == []  # close freed them


def test_server_answers_errors_with_a_body_and_a_status(counter_url):
    with httpx.Client(base_url=counter_url) as http:
        assert "counter" in http.get("/").json()
        env_id = http.post("/create").json()["id"]
        unknown = http.post("/step", json={"id": 999, "action": "up"})
        assert unknown.status_code == 404 and "999" in unknown.json()["error"]
        early = http.post("/step", json={"id": env_id, "action": "up"})
        assert early.status_code == 409 and "reset" in early.json()["error"]
        assert http.post("/step", json={"id": env_id}).status_code == 422
        assert "error" in http.post("/reset", content=b"not json").json()
        assert http.post("/reset", json={"id": env_id, "data_idx": 50}).status_code == 404
        reset = http.post("/reset", json={"id": env_id, "data_idx": 0}).json()
        assert reset["instruction"] == "Count to 2, then submit." and reset["available_actions"] == ["up", "submit"]
        assert http.get("/expert_action", params={"id": env_id}).json() == {"action": "up"}
        crash = http.post("/step", json={"id": env_id, "action": "explode"})
        assert crash.status_code == 500 and "kaboom" in crash.json()["error"]
        after = http.post("/step", json={"id": env_id, "action": "up"})
        assert after.status_code == 409 and "crashed" in after.json()["error"]
        http.post("/reset", json={"id": env_id, "data_idx": 0})
        for action in ("up", "up", "submit"):
            answer = http.post("/step", json={"id": env_id, "action": action}).json()
        assert answer["done"] and answer["won"] and answer["score"] == 1.0
        assert http.get("/observation", params={"id": env_id}).json() == "You submitted."
        assert http.post("/step", json={"id": env_id, "action": "up"}).status_code == 409
        assert http.get("/tasks").json()["splits"] == {"train": 8, "test": 4}
        assert http.get("/tasks", params={"split": "dev"}).status_code == 404


def test_server_killed_mid_episode_raises_and_next_reset_recreates(counter_app):
    with background_server(counter_app) as url:
        port = int(url.rsplit(":", 1)[1])
        env = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        idle = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        env.reset(8)
        idle.reset(9)
        env.step("up")
    with pytest.raises(EnvError, match=rf"{url}: POST /step failed: cannot connect.*gave up after 3 attempts"):
        env.step("up")
    with background_server(counter_app, port=port):  # the server comes back, knowing no ids
        assert play_with_expert(env, 8).won
        assert play_with_expert(idle, 9).won  # its old id is unknown there: reset made a new one
        assert idle._env_id != env._env_id
    env.close()
    idle.close()


def test_server_down_fails_fast_with_a_clear_message():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe closes
    env = AgentGymEnv(base_url=f"http://127.0.0.1:{port}", env_name="textcraft", **FAST)
    with pytest.raises(EnvError, match=r"POST /create failed: cannot connect .*gave up after 3 attempts.*running"):
        env.reset(0)
    env.close()


def test_a_server_that_answers_but_fails_is_not_asked_whether_it_runs():
    """A full server's 503 ended "...; is the server running?", though it had just answered."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    full = FastAPI()

    @full.post("/create")
    def create():
        return JSONResponse({"error": "this server holds its limit of 2 live envs"}, status_code=503)

    with background_server(full) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        with pytest.raises(
            EnvError, match=r"HTTP 503: .*limit of 2 live envs.*attempts\); the server answers, but fails"
        ):
            env.reset(0)
        env.close()


def test_error_body_with_status_200_becomes_env_error():
    calls: dict = {}
    with background_server(flaky_app(calls, create_answer={"error": "out of environments"})) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        with pytest.raises(EnvError, match=rf"agentgym server {url}: POST /create failed: out of environments"):
            env.reset(0)
        assert calls["create"] == 1  # an answered error is not retried
        env.close()


def test_garbage_bodies_become_env_errors():
    calls: dict = {}
    with background_server(flaky_app(calls, create_answer=PlainTextResponse("<html>busy</html>"))) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        with pytest.raises(EnvError, match="POST /create failed: the answer is not JSON: '<html>busy</html>'"):
            env.reset(0)
        env.close()
    with background_server(flaky_app(calls, step_answer=lambda n: {"observation": "no done here"})) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(0)
        with pytest.raises(EnvError, match=r"POST /step failed: malformed answer \(KeyError: 'done'\)"):
            env.step("craft 1 stick using 2 planks")
        env.close()


def test_a_5xx_on_create_or_reset_is_retried():
    calls: dict = {}

    def fails_once(answer):
        return lambda n: PlainTextResponse("Internal Server Error", status_code=500) if n == 1 else answer

    app = flaky_app(
        calls,
        create_answer=fails_once({"id": 7, "observation": "Goal: craft stick.", "done": False, "reward": 0}),
        reset_answer=fails_once({"id": 7, "observation": "Goal: craft stick.", "done": False, "reward": 0}),
    )
    with background_server(app) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        assert env.reset(3).text == "Goal: craft stick."
        assert (calls["create"], calls["reset"]) == (2, 2)  # each failed once, then was sent again
        assert env.step("craft 1 stick using 2 planks").won
        env.close()


def test_a_step_that_may_have_reached_the_server_is_never_sent_twice():
    """A 5xx or a read timeout may come after the server played the action: resending it could play
    it twice, so that episode fails instead (and the next reset starts on a new env)."""
    calls: dict = {}

    def step_answer(n):
        if n == 1:
            return PlainTextResponse("Internal Server Error", status_code=500)
        if n == 2:
            time.sleep(1.5)  # past the client's timeout
        return {"observation": "Crafted 1 minecraft:stick", "reward": 1, "done": True}

    with background_server(flaky_app(calls, step_answer=step_answer)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", retries=3, backoff=0.01, timeout=0.75)
        env.reset(3)
        with pytest.raises(EnvError, match=r"POST /step failed: HTTP 500: 'Internal Server Error'; not resent"):
            env.step("craft 1 stick using 2 planks")
        assert calls["step"] == 1
        with pytest.raises(EnvError, match="call reset"):  # that episode is over for the client
            env.step("craft 1 stick using 2 planks")
        env.reset(3)
        with pytest.raises(EnvError, match=r"POST /step failed: ReadTimeout.*not resent"):
            env.step("craft 1 stick using 2 planks")
        env.reset(3)
        assert env.step("craft 1 stick using 2 planks").won
        assert calls["step"] == 3 and calls["create"] == 3  # each failed step's env was given up
        env.close()


def test_env_idx_dialect_with_webshop_shapes():
    app = Recorder(webshop_app())
    with background_server(app) as url:
        env = AgentGymEnv(base_url=url, env_name="webshop", **FAST)
        assert len(env.split_of("test")) == 500
        first = env.reset(3)
        assert first.text.startswith("WebShop [SEP] Instruction: [SEP] goal 3")
        assert first.instruction == "i need red shoes, price lower than 40.00 dollars"
        assert env.admissible_actions() == ["search[<keywords>]", "click[search]"]
        assert env.step("search[red shoes]").observation == "page after search[red shoes]"
        assert env.admissible_actions() == ["click[back to search]", "click[b01]"]
        env.step("click[b01]")
        result = env.step("click[buy now]")
        assert result.done and result.won and result.score == 1.0
        env.close()
    assert "/close" not in [c.path for c in app.calls]  # the WebShop server has no /close
    assert app.sent("/tasks") == [("GET", "/tasks", None)]  # asked once whether it lists its own splits: 404
    assert {c.query["env_idx"] for c in app.calls if c.method == "GET" and c.path != "/tasks"} == {"48000000"}


def test_running_score_envs_and_route_prefixes():
    """SciWorld reports a running 0-100 `score`; LMRL-Gym routes sit under /maze/."""
    with background_server(running_score_app("sciworld")) as url:
        env = AgentGymEnv(base_url=url, env_name="sciworld", **FAST)
        first = env.reset(10)
        assert first.instruction == "Your task is to boil water."
        assert first.info == {"task_id": 10, "task_name": "boil", "var_num": 10}
        half, full = env.step("focus on water"), env.step("heat water")
        assert (half.reward, half.score, half.won) == (0.5, 0.5, False)
        assert (full.reward, full.score, full.won) == (0.5, 1.0, True)
        env.close()
    with background_server(lmrlgym_app()) as url:
        maze = AgentGymEnv(base_url=url, env_name="maze", **FAST)
        assert maze.reset(2).text.startswith("The goal is at position 8, 6.")
        maze.close()


def test_options_are_validated_and_splits_parsed():
    assert parse_splits({"test": 100, "train": 444}) == {"test": range(0, 100), "train": range(100, 544)}
    assert parse_splits({"test": [0, 10, 2]}) == {"test": range(0, 10, 2)}
    with pytest.raises(ConfigError, match=r"splits.test must be a task count"):
        parse_splits({"test": "all"})
    with pytest.raises(ConfigError, match="dialect must be one of id, env_idx"):
        AgentGymEnv(dialect="rest")
    with pytest.raises(ConfigError, match="base_url must be an http"):
        AgentGymEnv(base_url="localhost:8000")
    with pytest.raises(ConfigError, match="retries must be a number >= 0, got 1.5"):
        AgentGymEnv(retries=1.5)
    sciworld = AgentGymEnv(env_name="sciworld", **FAST)  # no server there: its table
    assert (len(sciworld.split_of("test")), len(sciworld.split_of("train"))) == (464, 2319)
    custom = AgentGymEnv(env_name="textcraft", splits={"test": [0, 3]})
    assert custom.splits == ("test",) and list(custom.split_of("test")) == [0, 1, 2]
    with pytest.raises(UnknownTaskError, match="valid: test"):
        custom.split_of("train")


def test_env_without_default_splits_on_a_server_that_lists_none_asks_for_them():
    with background_server(flaky_app({})) as url:
        for name in ("mystery", "sqlgym"):
            env = AgentGymEnv(base_url=url, env_name=name, **FAST)
            with pytest.raises(
                ConfigError,
                match=rf"does not list its tasks .*HTTP 404.* env_name '{name}' "
                r"has no default splits; set plugins.agentgym.splits",
            ):
                env.split_of("test")
            env.close()
        assert AgentGymEnv(base_url=url, env_name="sqlgym", splits={"test": 5}, **FAST).split_of("test") == range(5)


# -- ids after a server restart ---------------------------------------------------------------


def test_restarted_omrl_server_never_lets_a_stale_id_reach_another_clients_env(register_plugin):
    """A restarted server never hands out an earlier start's ids, and refuses them to omrl's client
    (410): client A's id from before the restart cannot reset the env client B was just handed."""
    register_plugin(Registers({"counter": CounterEnv}), name="test-counter")
    with background_server(create_app("counter")) as url:
        a = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        b = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        assert play_with_expert(a, 8).won
        before = a._env_id
    with background_server(create_app("counter"), port=int(url.rsplit(":", 1)[1])):  # a new process
        assert b.reset(9).instruction == "Count to 3, then submit."
        assert b._env_id > before  # a new start numbers its ids above every earlier start's
        assert a.reset(10).instruction == "Count to 4, then submit."  # its old id got 410: a new env
        assert a._env_id not in (before, b._env_id)
        for action in ("up", "up", "up"):
            b.step(action)
        assert b.step("submit").won  # B's env still counts to 3: A never touched it
        assert httpx.get(f"{url}/list_envs").json() == sorted([a._env_id, b._env_id])
        a.close()
        b.close()


def test_foreign_server_gets_a_fresh_env_per_episode_so_a_restart_cannot_alias():
    log: list = []
    with background_server(agentgym_like_app(log)) as url:
        a = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        b = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        a.reset(1)
        assert a.step("craft").done is False and a.step("craft").won
        assert ("close", 0, 1) in log  # an episode's env is closed as soon as it is done
    with background_server(agentgym_like_app(log), port=int(url.rsplit(":", 1)[1])):  # restarted: ids from 0
        log.clear()
        b.reset(2)
        a.reset(3)  # A must not reset id 0 (now B's env) with its old number
        assert [entry for entry in log if entry[0] == "reset"] == [("reset", 0, 2), ("reset", 1, 3)]
        assert b.step("craft").observation == "task 2, step 1"
        a.close()
        b.close()
    assert ("close", 1, 3) in log and ("close", 0, 2) in log


def test_env_gone_on_step_or_close_is_an_env_error_with_a_reason():
    log: list = []
    with background_server(agentgym_like_app(log)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(4)
        httpx.post(f"{url}/close", json={"id": env._env_id})  # another client closes it behind its back
        with pytest.raises(
            EnvError, match=r"POST /step failed: not sent: .*HTTP 404: env 0 not found.*no longer knows env id 0"
        ):
            env.step("craft")
        env.reset(4)  # a new episode gets a new env
        assert env._env_id == 1 and [e for e in log if e[0] == "reset"][-1] == ("reset", 1, 4)
        env.close()
    with background_server(agentgym_like_app(log, close_status=404)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(5)
        env.step("craft")
        with pytest.raises(EnvError, match=r"closing env id 0 .* refused .*another client may have shared"):
            env.step("craft")  # done, but the server no longer knew the env: the result is not trusted
        env.close()


def test_an_agentgym_like_server_restarted_mid_episode_ends_the_stale_episode_as_an_env_error():
    """The server restarts between two of A's steps and hands B the number A holds: A's next step
    would craft B's goal and count as A's win. The create answer showed the restart (an id not
    above one handed out before), so A's step is refused before it is sent, and B's env is untouched."""
    server = Restartable(falsy_textcraft_app)
    with background_server(server) as url:
        a = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        b = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        a.reset(5)
        assert not a.step("craft stick3").done  # A's goal is stick5
        server.restart()
        b.reset(3)
        assert b._env_id == 0 == a._env_id
        with pytest.raises(
            EnvError,
            match=r"POST /step failed: env id 0 may now be another client's env "
            r"\(.*restarted.*\); this episode is not trusted",
        ):
            a.step("craft stick3")
        assert b.step("craft stick3").won  # B's env was neither stepped nor closed by A
        a.reset(5)  # A plays on with a new env
        assert a._env_id == 1 and a.step("craft stick5").won
        a.close()
        b.close()


def test_false_under_200_for_a_known_id_is_a_refusal_and_a_refused_close_untrusts_the_win():
    server = Restartable(falsy_textcraft_app)
    with background_server(server) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(2)
        server.restart()  # nobody holds id 0 on the new start
        with pytest.raises(EnvError, match=r"POST /step failed: not sent: .*the server answered false"):
            env.step("craft stick2")
        env.close()
    with background_server(falsy_textcraft_app(refuse_close=True)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(4)
        with pytest.raises(EnvError, match=r"closing env id 0 was refused .*answered false.*not trusted"):
            env.step("craft stick4")  # a win, but the server denied holding the env when it was closed
        env.close()


def test_an_unfinished_episodes_env_is_closed_the_moment_the_episode_ends():
    """A turn cap ends an episode without ``done``: its env is closed when the rollout gives the
    instance back, not at the next reset, by when a restarted server may have handed its number
    to another client (whose env that late close would end)."""
    log: list = []
    server = Restartable(lambda: agentgym_like_app(log))
    with background_server(server) as url:
        pool = EnvPool(AgentGymEnv, {"base_url": url, "env_name": "textcraft", **FAST})
        env = pool.acquire()
        env.reset(1)
        assert not env.step("look").done  # the turn cap ends the episode here
        pool.release(env)
        assert log[-1] == ("close", 0, 1)
        server.restart()
        other = httpx.post(f"{url}/create", json={}).json()["id"]  # another process's client gets id 0
        httpx.post(f"{url}/reset", json={"id": other, "data_idx": 7})
        log.clear()
        again = pool.acquire()
        again.reset(2)
        assert again._env_id == 1 and ("close", 0, 7) not in log
        assert (
            httpx.post(f"{url}/step", json={"id": other, "action": "look"}).json()["observation"] == "task 7, step 1"
        )  # the other client's env lives on
        pool.close()


@pytest.mark.parametrize(
    "body, problem",
    [
        ('{"observation": "x", "reward": NaN, "done": true}', "'reward' must be a finite number, got nan"),
        ('{"observation": "x", "reward": Infinity, "done": false}', "'reward' must be a finite number, got inf"),
        ('{"observation": "x", "reward": 1e999, "done": false}', "'reward' must be a finite number, got inf"),
        ('{"observation": "x", "reward": "1", "done": false}', "'reward' must be a finite number, got '1'"),
        ('{"observation": "x", "reward": 0, "done": "no"}', "'done' must be true or false, got 'no'"),
        ('{"observation": "x", "reward": 0, "done": 1}', "'done' must be true or false, got 1"),
        (
            '{"observation": "x", "reward": 0, "done": true, "score": -Infinity, "won": true}',
            "'score' must be a finite number, got -inf",
        ),
        (
            '{"observation": "x", "reward": 0, "done": true, "score": 1, "won": "yes"}',
            "'won' must be true or false, got 'yes'",
        ),
        ("[1, 2]", "expected an object"),
    ],
)
def test_non_finite_or_mistyped_step_values_are_env_errors(body, problem):
    answer = lambda n: Response(body, media_type="application/json")  # noqa: E731 - raw text keeps NaN
    with background_server(flaky_app({}, step_answer=answer)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(0)
        with pytest.raises(EnvError, match=re.escape(problem)):
            env.step("craft 1 stick using 2 planks")
        env.close()


def test_token_protected_server_is_played_with_the_token(register_plugin, monkeypatch):
    register_plugin(Registers({"counter": CounterEnv}), name="test-counter")
    with background_server(create_app("counter", token="s3cret")) as url:
        refused = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        needs_token = "GET /tasks failed: HTTP 401: this server needs the header `Authorization: Bearer <token>`"
        with pytest.raises(EnvError, match=re.escape(needs_token)):
            refused.split_of("test")
        refused.close()
        played = AgentGymEnv(base_url=url, env_name="counter", token="s3cret", **FAST)
        assert play_with_expert(played, 8).won
        played.close()
        monkeypatch.setenv("OMRL_SERVE_TOKEN", "s3cret")  # the token need not sit in a config file
        from_env = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        assert play_with_expert(from_env, 9).won
        from_env.close()


# -- every known env, as its real server speaks ------------------------------------------------


def episode(name, make_app, task, actions, reset, rewards, score, first="", instruction="", **options):
    """One known env's episode: the client is to post ``/create``, ``/reset`` with ``reset``, a ``/step`` per
    action and ``/close``, with the env's id under ``id``. What differs, by the keys: ``create`` (``/create``'s
    body, default none), ``key`` (the id's name), ``env_id`` (the id the app hands out), ``close`` (False: no
    ``/close`` route), ``prefix`` (the routes' own, as LMRL-Gym's ``/maze``); the other keys are the env's options.
    """
    create, key, env_id = options.pop("create", None), options.pop("key", "id"), options.pop("env_id", 0)
    close, prefix = options.pop("close", True), options.pop("prefix", "")
    steps = [("POST", f"{prefix}/step", {key: env_id, "action": a}) for a in actions]
    closing = [("POST", f"{prefix}/close", {key: env_id})] if close else []
    sent = [("POST", f"{prefix}/create", create), ("POST", f"{prefix}/reset", reset), *steps, *closing]
    return pytest.param(name, make_app, task, actions, sent, rewards, score, first, instruction, options, id=name)


SHARED_RISK = {"accept_shared_server_risk": True}  # no route shows an env's state: a restart elsewhere is unseen
TWO_ACTIONS = ([0.0, 1.0], 1.0)  # the rewards and score of an episode won at its second step

# fmt: off
EPISODES = [  # a row a line or two, so the table reads as one
    # TextCraft's /create needs a JSON body ({} is valid); its finished env is closed at once
    episode("textcraft", textcraft_app, 3, ["get 2 planks", "craft 1 stick3 using 2 planks"],
            {"id": 0, "data_idx": 3}, *TWO_ACTIONS, first="Goal: craft stick3.", create={}),
    episode("babyai", lambda: running_score_app("babyai"), 41, ["turn left", "go to red ball"],
            {"id": 0, "data_idx": 41}, [0.0, 0.8], 0.8, first="Your goal: go to the red ball"),
    episode("sciworld", lambda: running_score_app("sciworld"), 10, ["focus on water", "heat water"],
            {"id": 0, "data_idx": 10}, [0.5, 0.5], 1.0, first="the kitchen",
            instruction="Your task is to boil water."),
    episode("alfworld", alfworld_app, 2500, ["look", "put mug in cabinet 1"],
            {"id": 0, "game": 2500, "world_type": "Text"}, *TWO_ACTIONS, first="put a mug 2500 in the cabinet",
            close=False),
    episode("maze", lmrlgym_app, 2, ["move up", "move down"], {"id": 0, "game": 2}, *TWO_ACTIONS,
            first="Your current position is at position 1, 2.", prefix="/maze", close=False),
    episode("wordle", lmrlgym_app, 5, ["c r a n e", "s h i r e"], {"id": 0, "seed": 5}, *TWO_ACTIONS,
            first="Let's start Wordle!", prefix="/wordle", close=False),
    episode("webshop", webshop_app, 3, ["search[red shoes]", "click[b01]", "click[buy now]"],
            {"env_idx": 48_000_000, "session_id": 3}, [0.0, 0.0, 1.0], 1.0, first="goal 3",
            instruction="i need red shoes, price lower than 40.00 dollars", key="env_idx", env_id=48_000_000,
            close=False),
    episode("sqlgym", sqlgym_app, 4, ["SELECT * FROM x", "SELECT COUNT(*) FROM t4"],
            {"env_idx": 300_000, "item_id": 4}, *TWO_ACTIONS, first="CREATE TABLE t4", splits={"test": 10},
            key="env_idx", env_id=300_000, close=False),
    # SearchQA and the tools create with the task's id; SearchQA closes, the tools have no /close
    episode("searchqa", lambda: tool_app(with_close=True), 2, ["look", "finish"], {"env_idx": 0, "id": 2},
            [0.5, 1.0], 1.0, first="goal 2", splits={"test": 5}, create={"id": 2}, key="env_idx", **SHARED_RISK),
    episode("todo", lambda: tool_app(with_close=False), 1, ["look", "look", "finish"],  # reward: a progress rate
            {"env_idx": 0, "id": 1}, [0.5, 0.0, 0.5], 1.0, first="goal 1", splits={"test": 5}, create={"id": 1},
            key="env_idx", close=False, **SHARED_RISK),
    # WebArena (Flask): {"env_idx"} creates, terminated/truncated, a plain-text close answer
    episode("webarena", webarena_app, 7, ["```click [1]```", "```stop [done]```"],
            {"env_idx": 0, "seed": 0, "idx": 7}, *TWO_ACTIONS, first="OBJECTIVE: task 7", splits={"test": 812},
            key="env_idx", **SHARED_RISK),
]
# fmt: on


@pytest.mark.parametrize("name, make_app, task, actions, sent, rewards, score, first, instruction, options", EPISODES)
def test_each_known_env_plays_a_full_episode_speaking_exactly_its_servers_protocol(
    name, make_app, task, actions, sent, rewards, score, first, instruction, options
):
    app = Recorder(make_app())
    with background_server(app) as url:
        env = AgentGymEnv(base_url=url, env_name=name, **FAST, **options)
        start = env.reset(task)
        results = [env.step(action) for action in actions]
        env.close()
    assert first in start.text and start.instruction == instruction
    assert [r.reward for r in results] == pytest.approx(rewards)
    assert [r.done for r in results] == [False] * (len(actions) - 1) + [True]
    assert results[-1].score == pytest.approx(score) and results[-1].won
    assert app.sent(*{path for _, path, _ in sent}) == sent  # these bodies exactly, nothing else posted
    assert all(c.method == "GET" for c in app.calls if c.path not in {path for _, path, _ in sent})
    key = "env_idx" if "env_idx" in sent[1][2] else "id"
    assert all(set(c.query) == {key} for c in app.calls if c.method == "GET")  # reads name the env id


def test_the_test_apps_are_as_strict_as_the_real_servers():
    """TextCraft's /create needs a body (the failure users met); answers hold only the real keys."""
    with background_server(textcraft_app()) as url, httpx.Client(base_url=url) as http:
        assert http.post("/create").status_code == 422  # no body
        created = http.post("/create", json={"minecraft_dir": "x", "goal": None})  # extra keys pass
        assert created.status_code == 200 and set(created.json()) == {"id", "observation", "done", "reward"}
        assert http.post("/reset", json={"data_idx": 1}).status_code == 422  # no id
        unknown = http.post("/step", json={"id": 99, "action": "look"})
        assert unknown.status_code == 200 and unknown.json() == {"error": "The id 99 is not valid."}
    with background_server(webarena_app()) as url, httpx.Client(base_url=url) as http:
        assert http.post("/reset").status_code == 415  # Flask's request.json without a JSON body
        assert http.post("/reset", json={"env_idx": 0, "idx": 1}).status_code == 500  # no seed: a KeyError
    with background_server(webshop_app()) as url, httpx.Client(base_url=url) as http:
        assert http.post("/step", json={"env_idx": 1, "action": "x"}).status_code == 500  # unknown index


def test_a_finished_babyai_env_refuses_steps_and_the_client_stops_before_it():
    with background_server(running_score_app("babyai")) as url:
        env = AgentGymEnv(base_url=url, env_name="babyai", reuse_ids=True, **FAST)  # keeps its env open
        env.reset(0)
        assert env.step("go to red ball").won
        with pytest.raises(EpisodeFinishedError):
            env.step("turn left")
        refused = httpx.post(f"{url}/step", json={"id": env._env_id, "action": "turn left"})
        assert refused.json() == {"error": "The task with environment 0 has finished."}
        env.close()


# -- replay forks: a served env says whether it is deterministic --------------------------------


@pytest.mark.parametrize("says, fork", [(True, "replay"), (False, None), (None, None)])
def test_a_served_env_that_says_it_is_deterministic_can_be_forked_by_replay(says, fork):
    with background_server(served_app(says)) as url:
        env = AgentGymEnv(base_url=url, env_name="echo", **FAST)
        assert env.deterministic is (says is True)  # GET /tasks tells before any /create
        first = env.reset(1)
        assert first.instruction == "Task 1." and first.info == {"task_id": 1, "level": 1}
        assert env.deterministic is (says is True) and fork_support(env) == fork
        assert env.step("1").won
        foreign = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        assert foreign.deterministic is False  # per instance: a foreign server's client never replays
        env.close()


def test_foreign_servers_are_never_deterministic_and_a_mistyped_claim_is_an_env_error():
    with background_server(textcraft_app()) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(0)
        assert env.deterministic is False and fork_support(env) is None
        env.close()
    claim = {"id": 7, "observation": "", "done": False, "reward": 0, "deterministic": "yes"}
    with background_server(flaky_app({}, create_answer=claim)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        with pytest.raises(EnvError, match=r"POST /create failed: 'deterministic' must be true or false, got 'yes'"):
            env.reset(0)
        env.close()


class ReplayableCounter(CounterEnv):
    """The counter, declared deterministic (it is: its episodes follow from the task and the actions)."""

    deterministic = True


def test_omrl_serve_tells_the_client_whether_its_env_replays(register_plugin):
    register_plugin(Registers({"counter": CounterEnv, "replayable-counter": ReplayableCounter}), name="test-counters")
    for name, fork in (("replayable-counter", "replay"), ("counter", None)):
        with background_server(create_app(name)) as url:
            env = AgentGymEnv(base_url=url, env_name=name, **FAST)
            assert fork_support(env) == fork, name  # known from GET /tasks before any episode
            assert play_with_expert(env, 8).won
            assert fork_support(env) == fork, name
            env.close()


def test_sqlgym_clients_keep_their_env_since_the_server_hands_out_live_ids_again():
    app = Recorder(sqlgym_app())
    with background_server(app) as url:
        a, b = (AgentGymEnv(base_url=url, env_name="sqlgym", splits={"test": 10}, **FAST) for _ in range(2))
        for task in range(5):
            for env in (a, b):
                env.reset(task)
                assert env.step(f"SELECT COUNT(*) FROM t{task}").won
        assert app.sent("/create") == [("POST", "/create", None)] * 2 and a._env_id != b._env_id
        per_episode = AgentGymEnv(base_url=url, env_name="sqlgym", splits={"test": 10}, reuse_ids=False, **FAST)
        handed = set()
        for task in range(8):
            per_episode.reset(task)
            handed.add(per_episode._env_id)
        assert a._env_id in handed  # what a new env per episode would do: the server gave A's live env away
        for env in (a, b, per_episode):
            env.close()


@pytest.mark.parametrize("name", ["webshop", "sqlgym", "textcraft", "babyai"])
def test_an_omrl_server_of_an_env_named_like_a_known_one_is_read_the_omrl_way(counter_url, name):
    """`omrl env serve webshop` is played with env_name=webshop: the requests are WebShop's (the
    server takes them), the answers the omrl server's own."""
    env = AgentGymEnv(base_url=counter_url, env_name=name, splits={"test": [8, 12]}, **FAST)
    first = env.reset(9)
    assert first.text == "The counter shows 0." and first.instruction == "Count to 3, then submit."
    result = play_with_expert(env, 9)  # the served env's expert answers too
    assert result.won and result.score == 1.0
    env.close()
    # its id is closed on the server: WebShop's own has no /close, and the ids were left until the server filled
    assert httpx.get(f"{counter_url}/list_envs").json() == []


@pytest.mark.parametrize(
    "described, wrong",
    [
        ({"max_turns": "three"}, "max_turns must be a whole number of turns, 1 or more; got 'three'"),
        ({"max_turns": 0.5}, "max_turns must be a whole number of turns, 1 or more; got 0.5"),
        (
            {"demonstration": [["only an observation"]]},
            "demonstration must be a list of [observation, thought, action]",
        ),
        ({"action_help": 42}, "action_help must be text; got 42"),
    ],
)
def test_a_self_description_the_client_cannot_use_is_an_env_error_naming_it(described, wrong):
    """A server answering garbage: never a TypeError reported as an omrl bug, never a turn cap of 0."""
    with background_server(served_app(None, **described)) as url:
        env = AgentGymEnv(base_url=url, env_name="echo", **FAST)
        with pytest.raises(EnvError, match=re.escape(f"GET /tasks failed: {wrong}")):
            print(env.max_turns, env.demonstration, env.action_help)
        env.close()


def test_a_server_that_takes_the_connection_but_never_answers_is_warned_of_not_waited_on(monkeypatch):
    """A run's first question (asked before the model loads) waited the whole client timeout, then said nothing."""
    from omrl_plugins.envs.agentgym import transport

    monkeypatch.setattr(transport, "PROBE_SECONDS", 0.2)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = AgentGymEnv(base_url=url, env_name="textcraft", timeout=30)
        with pytest.warns(
            UserWarning, match=f"agentgym server {url} took the connection but did not answer GET / within 0.2 s"
        ):
            env.check_reachable()
        env.close()
