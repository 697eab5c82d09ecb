"""The `agentgym` client against real servers on 127.0.0.1: `omrl serve`'s app, and small
FastAPI apps that answer like AgentGym's WebShop, SciWorld and LMRL-Gym servers."""

from __future__ import annotations

import itertools
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import Body, FastAPI, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from omrl.envs import DemoTurn, Env, EnvError, EpisodeFinishedError, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl.serve import background_server, create_app
from omrl_plugins.envs.agentgym import AgentGymEnv, parse_splits

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
            return StepResult("You submitted.", float(won), True,
                              {"won": won, "score": min(self.value / self.target, 1.0)})
        return StepResult(f"{action!r} is not an action; try up or submit.", 0.0, False,
                          {"won": False, "score": 0.0, "invalid": True})

    def admissible_actions(self):
        return ["up", "submit"]

    def expert_action(self):
        return "up" if self.value < self.target else "submit"


class CounterPlugin:
    @hookimpl
    def register_envs(self, register):
        register("counter", CounterEnv)


@pytest.fixture
def counter_app(register_plugin):
    register_plugin(CounterPlugin(), name="test-counter")
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


def flaky_app(calls: dict, create_answer=None, step_answer=None):
    """An `id`-dialect app whose answers the test chooses; counts calls per route."""
    app = FastAPI()

    @app.post("/create")
    def create():
        calls["create"] = calls.get("create", 0) + 1
        return create_answer if create_answer is not None else {"id": 7}

    @app.post("/reset")
    def reset(body: dict = Body(...)):
        return {"observation": "Crafting commands: ... Goal: craft stick."}

    @app.post("/step")
    def step(body: dict = Body(...)):
        calls["step"] = calls.get("step", 0) + 1
        if step_answer is not None:
            return step_answer(calls["step"])
        return {"observation": "Crafted 1 minecraft:stick", "reward": 1.0, "done": True}

    return app


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


def test_5xx_is_retried_then_succeeds():
    calls: dict = {}

    def step_answer(n):
        if n == 1:
            return PlainTextResponse("Internal Server Error", status_code=500)
        return {"observation": "Crafted 1 minecraft:stick", "reward": 1.0, "done": True}

    with background_server(flaky_app(calls, step_answer=step_answer)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(3)
        result = env.step("craft 1 stick using 2 planks")
        assert calls["step"] == 2 and result.won and result.score == 1.0
        env.close()


def webshop_app(requests: list[str]):
    """Answers like AgentGym's WebShop server (`env_idx` dialect, [obs, null] resets, no /close)."""
    app = FastAPI()
    state: dict[int, str] = {}

    @app.middleware("http")
    async def record(request, call_next):
        requests.append(request.url.path)
        return await call_next(request)

    @app.post("/create")
    def create():
        state[len(state)] = "search"
        return len(state) - 1

    @app.post("/reset")
    def reset(body: dict = Body(...)):
        state[body["env_idx"]] = "search"
        return [f"WebShop [SEP] Instruction: [SEP] goal {body['session_id']} [SEP] Search", None]

    @app.get("/instruction_text")
    def instruction(env_idx: int = Query(...)):
        return "i need red shoes, price lower than 40.00 dollars"

    @app.get("/available_actions")
    def available(env_idx: int = Query(...)):
        page = state[env_idx]
        clickables = {"search": [], "results": ["back to search", "b01"], "item": ["back to search", "buy now"]}
        return {"has_search_bar": page == "search", "clickables": clickables[page]}

    @app.post("/step")
    def step(body: dict = Body(...)):
        env_idx, action = body["env_idx"], body["action"]
        state[env_idx] = {"search": "results", "results": "item"}.get(state[env_idx], "item")
        if action == "click[buy now]":
            return {"state": "Thank you for shopping with us!", "reward": 1.0, "done": True, "info": None}
        return {"state": f"page after {action}", "reward": 0.0, "done": False, "info": {"page": state[env_idx]}}

    return app


def test_env_idx_dialect_with_webshop_shapes():
    requests: list[str] = []
    with background_server(webshop_app(requests)) as url:
        env = AgentGymEnv(base_url=url, env_name="webshop", **FAST)
        assert len(env.split_of("test")) == 500
        first = env.reset(3)
        assert first.text.startswith("WebShop [SEP] Instruction: [SEP] goal 3")
        assert first.instruction == "i need red shoes, price lower than 40.00 dollars"
        assert env.admissible_actions() == ["search[<keywords>]"]
        assert env.step("search[red shoes]").info["page"] == "results"
        assert env.admissible_actions() == ["click[back to search]", "click[b01]"]
        env.step("click[b01]")
        result = env.step("click[buy now]")
        assert result.done and result.won and result.score == 1.0
        env.close()
    assert "/close" not in requests  # the WebShop server has no /close


def test_running_score_envs_and_route_prefixes():
    """SciWorld reports a running 0-100 `score`; LMRL-Gym routes sit under /maze/."""
    app = FastAPI()
    scores = iter([50, 100])

    @app.post("/create")
    def create():
        return {"id": 0}

    @app.post("/reset")
    def reset(body: dict = Body(...)):
        return {"task_name": "boil", "var_num": body["data_idx"], "task_description": "Boil water.",
                "observation": "You are in the kitchen."}

    @app.post("/step")
    def step(body: dict = Body(...)):
        score = next(scores)
        return {"observation": "ok", "reward": 99, "score": score, "done": score == 100}

    @app.post("/maze/create")
    def maze_create():
        return {"id": 4}

    @app.post("/maze/reset")
    def maze_reset(body: dict = Body(...)):
        assert body == {"id": 4, "game": 2}
        return {"observation": "The goal is at position 8, 6."}

    with background_server(app) as url:
        env = AgentGymEnv(base_url=url, env_name="sciworld", **FAST)
        first = env.reset(10)
        assert first.instruction == "Boil water." and first.info["task_name"] == "boil"
        half, full = env.step("heat water"), env.step("wait")
        assert (half.reward, half.score, half.won) == (0.5, 0.5, False)
        assert (full.reward, full.score, full.won) == (0.5, 1.0, True)
        maze = AgentGymEnv(base_url=url, env_name="maze", **FAST)
        assert maze.reset(2).text == "The goal is at position 8, 6."
        env.close()
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
    sciworld = AgentGymEnv(env_name="sciworld")
    assert (len(sciworld.split_of("test")), len(sciworld.split_of("train"))) == (464, 2319)
    custom = AgentGymEnv(env_name="textcraft", splits={"test": [0, 3]})
    assert custom.splits == ("test",) and list(custom.split_of("test")) == [0, 1, 2]
    with pytest.raises(UnknownTaskError, match="valid: test"):
        custom.split_of("train")


def test_env_without_default_splits_on_a_server_that_lists_none_asks_for_them():
    with background_server(flaky_app({})) as url:
        for name in ("mystery", "sqlgym"):
            env = AgentGymEnv(base_url=url, env_name=name, **FAST)
            with pytest.raises(ConfigError, match=rf"does not list its tasks .*HTTP 404.* env_name '{name}' "
                                                  r"has no default splits; set plugins.agentgym.splits"):
                env.split_of("test")
            env.close()
        assert AgentGymEnv(base_url=url, env_name="sqlgym", splits={"test": 5}, **FAST).split_of("test") == range(5)


# -- ids after a server restart ---------------------------------------------------------------


def test_restarted_omrl_server_never_lets_a_stale_id_reach_another_clients_env(register_plugin):
    """A restarted server numbers ids from 0 again: client A's id 0 from before the restart must
    not reset the env that client B was just handed under the same number."""
    register_plugin(CounterPlugin(), name="test-counter")
    with background_server(create_app("counter")) as url:
        a = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        b = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        assert play_with_expert(a, 8).won and a._env_id == 0
    with background_server(create_app("counter"), port=int(url.rsplit(":", 1)[1])):  # a new process
        assert b.reset(9).instruction == "Count to 3, then submit."
        assert b._env_id == 0  # the new server's first id: the number A still holds
        assert a.reset(10).instruction == "Count to 4, then submit."
        assert a._env_id != b._env_id
        for action in ("up", "up", "up"):
            b.step(action)
        assert b.step("submit").won  # B's env still counts to 3: A never touched it
        assert httpx.get(f"{url}/list_envs").json() == [0, 1]
        a.close()
        b.close()


def agentgym_like_app(log: list[tuple[str, int, int | None]], close_status: int | None = None):
    """A foreign `id`-dialect server (no omrl extensions): ids from 0, 404 for unknown ids.

    ``log`` gets (route, id, task) per call; ``close_status`` makes every /close answer that status.
    """
    app = FastAPI()
    tasks: dict[int, int | None] = {}
    steps: dict[int, int] = {}
    ids = itertools.count()

    def known(env_id: int) -> JSONResponse | None:
        return None if env_id in tasks else JSONResponse({"error": f"env {env_id} not found"}, status_code=404)

    @app.post("/create")
    def create():
        env_id = next(ids)
        tasks[env_id] = None
        return {"id": env_id}

    @app.post("/reset")
    def reset(body: dict = Body(...)):
        env_id = body["id"]
        log.append(("reset", env_id, body["data_idx"]))
        if (gone := known(env_id)) is not None:
            return gone
        tasks[env_id], steps[env_id] = body["data_idx"], 0
        return {"observation": f"task {body['data_idx']}: craft a stick."}

    @app.post("/step")
    def step(body: dict = Body(...)):
        env_id = body["id"]
        log.append(("step", env_id, tasks.get(env_id)))
        if (gone := known(env_id)) is not None:
            return gone
        steps[env_id] += 1
        done = steps[env_id] >= 2
        return {"observation": f"task {tasks[env_id]}, step {steps[env_id]}", "reward": float(done), "done": done}

    @app.post("/close")
    def close(body: dict = Body(...)):
        env_id = body["id"]
        log.append(("close", env_id, tasks.get(env_id)))
        if close_status is not None:
            return JSONResponse({"error": "closing failed"}, status_code=close_status)
        if (gone := known(env_id)) is not None:
            return gone
        tasks.pop(env_id)
        return {"closed": True}

    return app


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
        with pytest.raises(EnvError, match=r"POST /step failed: HTTP 404: env 0 not found .*no longer knows env id 0"):
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


@pytest.mark.parametrize("body, problem", [
    ('{"observation": "x", "reward": NaN, "done": true}', "'reward' must be a finite number, got nan"),
    ('{"observation": "x", "reward": Infinity, "done": false}', "'reward' must be a finite number, got inf"),
    ('{"observation": "x", "reward": 1e999, "done": false}', "'reward' must be a finite number, got inf"),
    ('{"observation": "x", "reward": "1", "done": false}', "'reward' must be a finite number, got '1'"),
    ('{"observation": "x", "reward": 0, "done": "no"}', "'done' must be true or false, got 'no'"),
    ('{"observation": "x", "reward": 0, "done": 1}', "'done' must be true or false, got 1"),
    ('{"observation": "x", "reward": 0, "done": true, "score": -Infinity, "won": true}',
     "'score' must be a finite number, got -inf"),
    ('{"observation": "x", "reward": 0, "done": true, "score": 1, "won": "yes"}',
     "'won' must be true or false, got 'yes'"),
    ('[1, 2]', "expected an object"),
])
def test_non_finite_or_mistyped_step_values_are_env_errors(body, problem):
    answer = lambda n: Response(body, media_type="application/json")  # noqa: E731 - raw text keeps NaN
    with background_server(flaky_app({}, step_answer=answer)) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(0)
        with pytest.raises(EnvError, match=re.escape(problem)):
            env.step("craft 1 stick using 2 planks")
        env.close()


def test_token_protected_server_is_played_with_the_token(register_plugin, monkeypatch):
    register_plugin(CounterPlugin(), name="test-counter")
    with background_server(create_app("counter", token="s3cret")) as url:
        refused = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        with pytest.raises(EnvError, match=r"GET /tasks failed: HTTP 401: this server needs the header "
                                           r"`Authorization: Bearer <token>`"):
            refused.split_of("test")
        refused.close()
        played = AgentGymEnv(base_url=url, env_name="counter", token="s3cret", **FAST)
        assert play_with_expert(played, 8).won
        played.close()
        monkeypatch.setenv("OMRL_SERVE_TOKEN", "s3cret")  # the token need not sit in a config file
        from_env = AgentGymEnv(base_url=url, env_name="counter", **FAST)
        assert play_with_expert(from_env, 9).won
        from_env.close()
