"""`omrl env serve`'s guards: errors in one shape, no echoed bodies, a token, caps, restarts."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from omrl.envs import StepResult
from omrl.serve import INSTANCE_HEADER, background_server, create_app, exposure_warning, is_loopback


@pytest.fixture(scope="module")
def grid_app():
    return create_app("gridworld")


@pytest.fixture
def http(grid_app):
    with TestClient(grid_app, raise_server_exceptions=False) as client:
        yield client


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    """The answer is ``{"error": message}`` with ``status``; returns the message."""
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    for fragment in fragments:
        assert fragment in body["error"]
    return body["error"]


def test_unknown_routes_and_methods_answer_in_the_protocols_shape(http):
    assert_error(http.get("/no/such/route"), 404, "no route '/no/such/route'")
    assert_error(http.post("/tasks"), 405, "POST is not allowed on '/tasks'")
    assert_error(http.get("/step"), 405)
    assert_error(http.get("/observation", params={"id": "seven"}), 422, "query.id")
    assert_error(http.get("/observation"), 422, "query.id")


def test_a_bad_body_is_never_echoed_back(http):
    env_id = http.post("/create").json()["id"]
    marker = "ECHO" * 200_000  # 800 kB, under the 1 MiB cap
    for body in (
        {"id": env_id, "action": {"a": marker}},
        {"id": marker, "data_idx": 0},
        [marker],
        {"id": env_id, "data_idx": marker},
    ):
        route = "/step" if "action" in body else "/reset"
        response = http.post(route, json=body)
        message = assert_error(response, 422)
        assert "ECHO" not in response.text and len(response.content) < 1000, message
    plain = http.post("/step", content=marker.encode(), headers={"content-type": "text/plain"})
    assert_error(plain, 422)
    assert "ECHO" not in plain.text
    broken = http.post(
        "/step", content=b'{"id": 0, "action": "' + marker.encode(), headers={"content-type": "application/json"}
    )
    assert_error(broken, 422, "JSON decode error")
    assert "ECHO" not in broken.text
    deep = http.post("/step", content=b"[" * 200_000 + b"]" * 200_000)  # deeper than json parses
    assert deep.status_code in (400, 422) and list(deep.json()) == ["error"]


def test_bodies_over_the_cap_get_413_unread(grid_app):
    with background_server(grid_app) as url:
        big = b'{"id": 0, "action": "' + b"x" * (5 << 20) + b'"}'
        assert_error(httpx.post(f"{url}/step", content=big), 413, "limit of 1048576 bytes")

        def chunks():  # no Content-Length: the server counts what arrives
            for _ in range(40):
                yield b"y" * 65536

        assert_error(httpx.post(f"{url}/step", content=chunks()), 413)
        assert httpx.post(f"{url}/create").status_code == 200  # and it goes on serving


def test_live_envs_are_capped_with_a_clear_503():
    app = create_app("gridworld", max_envs=2)
    with TestClient(app) as http:
        first, _ = http.post("/create").json()["id"], http.post("/create").json()["id"]
        assert_error(http.post("/create"), 503, "limit of 2 live envs", "POST /close", "--max-envs")
        assert http.post("/close", json={"id": first}).json()["closed"]
        assert http.post("/create").status_code == 200


def test_envs_idle_past_the_timeout_are_reclaimed_and_their_ids_say_so():
    """Envs of killed clients must not fill the server for good: an env no call touched for
    idle_timeout seconds is closed (the next create finds room), and its id answers 410 saying why."""
    import time

    app = create_app("gridworld", max_envs=2, idle_timeout=0.5)
    with TestClient(app) as http:
        created = http.post("/create").json()
        assert created["idle_timeout"] == 0.5
        dead, alive = created["id"], http.post("/create").json()["id"]
        assert_error(http.post("/create"), 503, "limit of 2 live envs", "idle for 0.5 s are closed")
        time.sleep(0.7)
        http.post("/reset", json={"id": alive, "data_idx": 0})  # a live client's call: its env stays
        fresh = http.post("/create")
        assert fresh.status_code == 200
        assert http.get("/list_envs").json() == sorted([alive, fresh.json()["id"]])
        assert_error(
            http.post("/step", json={"id": dead, "action": "up"}),
            410,
            f"env id {dead} was closed after no call touched it for 0.5 s",
            "--idle-timeout",
            "create a new env",
        )
        assert_error(http.post("/close", json={"id": dead}), 410)
        assert http.post("/step", json={"id": alive, "action": "up"}).status_code == 200
    with TestClient(create_app("gridworld", idle_timeout=0)) as http:
        assert http.post("/create").json()["idle_timeout"] is None  # never reclaimed


def test_token_is_required_on_every_request():
    app = create_app("gridworld", token="s3cret")
    with TestClient(app) as http:
        for method, path in (("GET", "/"), ("POST", "/create"), ("GET", "/tasks"), ("GET", "/nowhere")):
            refused = http.request(method, path)
            assert_error(refused, 401, "Authorization: Bearer")
            assert refused.headers["www-authenticate"] == "Bearer"
            assert_error(http.request(method, path, headers={"Authorization": "Bearer wrong"}), 401)
            assert_error(http.request(method, path, headers={"Authorization": "s3cret"}), 401)
        good = {"Authorization": "Bearer s3cret"}
        assert http.get("/tasks", headers=good).status_code == 200
        assert isinstance(http.post("/create", headers=good).json()["id"], int)
    with pytest.raises(Exception, match="non-empty"):
        create_app("gridworld", token=" ")


def test_a_restarted_server_refuses_ids_of_its_previous_instance(grid_app):
    with background_server(grid_app) as url:
        created = httpx.post(f"{url}/create").json()
        before = created["instance"]
        assert httpx.get(f"{url}/list_envs").headers[INSTANCE_HEADER] == before  # every answer names it
        same = {INSTANCE_HEADER: before}
        reset = httpx.post(f"{url}/reset", json={"id": created["id"], "data_idx": 0}, headers=same)
        assert reset.status_code == 200
    with background_server(grid_app, port=int(url.rsplit(":", 1)[1])):
        again = httpx.post(f"{url}/create").json()
        after = again["instance"]
        assert after != before and again["id"] > created["id"]
        stale = httpx.post(f"{url}/reset", json={"id": again["id"], "data_idx": 0}, headers=same)
        assert_error(stale, 410, "this server restarted", "create a new env")
        assert (
            httpx.post(
                f"{url}/reset", json={"id": again["id"], "data_idx": 0}, headers={INSTANCE_HEADER: after}
            ).status_code
            == 200
        )


def test_an_env_returning_a_non_finite_reward_is_a_500_in_the_protocols_shape(grid_app, http, monkeypatch):
    from omrl_plugins.envs.gridworld import GridWorld

    env_id = http.post("/create").json()["id"]
    http.post("/reset", json={"id": env_id, "data_idx": 0})
    original = GridWorld.step

    def nan_step(self, action):
        result = original(self, action)
        result.reward = float("nan")
        result.info["extra"] = float("inf")
        return result

    monkeypatch.setattr(GridWorld, "step", nan_step)
    assert_error(http.post("/step", json={"id": env_id, "action": "up"}), 500, "returned reward nan", "finite number")


@pytest.mark.parametrize(
    "result, problem",
    [
        (
            StepResult("obs", 0.0, "false", {"won": False, "score": 0.0}),
            "returned done 'false'; it must be True or False",
        ),
        (StepResult("obs", 0.0, True, {"won": "no", "score": 0.0}), "returned won 'no'; it must be True or False"),
        (StepResult("obs", 0.0, True, {"won": False, "score": 37}), "returned score 37; it must be in [0, 1]"),
        (StepResult("obs", 10**400, True, {}), "it must be a finite number"),
    ],
)
def test_a_step_answer_that_breaks_the_protocol_is_the_envs_crash(http, monkeypatch, result, problem):
    from omrl_plugins.envs.gridworld import GridWorld

    env_id = http.post("/create").json()["id"]
    http.post("/reset", json={"id": env_id, "data_idx": 0})
    monkeypatch.setattr(GridWorld, "step", lambda self, action: result)
    assert_error(http.post("/step", json={"id": env_id, "action": "up"}), 500, "the env raised in step", problem)
    assert_error(http.post("/step", json={"id": env_id, "action": "up"}), 409, "is over")


def test_loopback_hosts_and_the_warning_for_others():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.5.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")
    assert exposure_warning("127.0.0.1", None) is None
    assert "set --token or OMRL_SERVE_TOKEN" in exposure_warning("0.0.0.0", None)
    assert "needs the token" in exposure_warning("0.0.0.0", "s3cret")
    assert exposure_warning("::", None).startswith("warning: :: is not a loopback address")  # IPv6's any


def test_create_shows_the_first_task_with_its_goal_and_says_whether_the_env_is_deterministic(http):
    from omrl_plugins.envs.gridworld import GridWorld

    local = GridWorld()
    first_task = local.split_of(local.splits[0])[0]
    first = local.reset(first_task)
    created = http.post("/create").json()
    assert created == {
        "id": created["id"],
        "instance": created["instance"],
        "deterministic": True,
        "idle_timeout": 1800.0,
        "observation": f"{first.instruction}\n\n{first.text}",
        "task_id": first_task,
        "done": False,
        "reward": 0.0,
    }
    # it shows a task but starts no episode: every AgentGym client resets first
    assert_error(http.post("/step", json={"id": created["id"], "action": "up"}), 409, "reset it first")


def test_create_says_false_for_an_env_that_is_not_deterministic(monkeypatch):
    from omrl_plugins.envs.gridworld import GridWorld

    monkeypatch.setattr(GridWorld, "deterministic", False)
    with TestClient(create_app("gridworld")) as http:
        assert http.post("/create").json()["deterministic"] is False


def test_create_naming_a_task_starts_its_episode_and_leaves_nothing_behind_when_refused(http):
    from omrl_plugins.envs.gridworld import GridWorld

    task = GridWorld().split_of("test")[3]
    first = GridWorld().reset(task)
    created = http.post("/create", json={"data_idx": task}).json()
    assert created["task_id"] == task and created["observation"] == f"{first.instruction}\n\n{first.text}"
    assert http.post("/step", json={"id": created["id"], "action": "up"}).status_code == 200
    live = http.get("/list_envs").json()
    assert_error(http.post("/create", json={"game": -1}), 404, "-1")
    assert_error(http.post("/create", json={"data_idx": 1, "seed": 1}), 422, "names the task twice")
    # TextCraft's client posts these; a goal or recipes of its own cannot be played here
    assert http.post("/create", json={"minecraft_dir": "x/", "commands": None, "goal": None}).status_code == 200
    assert_error(http.post("/create", json={"goal": "craft 1 stick"}), 422, "takes no 'goal'", "data_idx")
    assert_error(http.post("/create", json=[1, 2]), 422)
    assert set(live) <= set(http.get("/list_envs").json()) and len(http.get("/list_envs").json()) == len(live) + 1


@pytest.mark.parametrize("field", ["data_idx", "game", "seed", "item_id", "session_id", "task_id"])
def test_reset_takes_the_task_fields_agentgym_clients_send(http, field):
    env_id = http.post("/create").json()["id"]
    reset = http.post("/reset", json={"id": env_id, field: 1_000_002, "world_type": "Text"}).json()
    assert reset["task_id"] == 1_000_002 and reset["done"] is False
    assert reset["reward"] == 0.0 and reset["score"] == 0.0 and reset["task_description"] == ""
    assert isinstance(reset["available_actions"], list) and reset["available_actions"]


def test_reset_and_step_refuse_bodies_that_name_the_env_or_task_ambiguously(http):
    env_id = http.post("/create").json()["id"]
    assert_error(http.post("/reset", json={"id": env_id}), 422, "data_idx, game, seed")
    assert_error(http.post("/reset", json={"id": env_id, "data_idx": 0, "game": 0}), 422, "twice")
    assert_error(http.post("/reset", json={"id": env_id, "env_idx": env_id, "data_idx": 0}), 422, "got both")
    assert_error(http.post("/step", json={"action": "up"}), 422, "'id' or 'env_idx'", "got neither")
    assert_error(http.get("/observation", params={"id": env_id, "env_idx": env_id}), 422, "got both")


def test_the_goal_is_in_the_first_observation_unless_the_client_is_omrls_own(http):
    from omrl_plugins.envs.gridworld import GridWorld

    first = GridWorld().reset(1_000_001)
    created = http.post("/create").json()
    env_id, omrl_client = created["id"], {INSTANCE_HEADER: created["instance"]}
    with_goal = f"{first.instruction}\n\n{first.text}"
    assert http.post("/reset", json={"id": env_id, "data_idx": 1_000_001}).json()["observation"] == with_goal
    assert http.get("/observation", params={"id": env_id}).json() == with_goal
    # omrl's agentgym client reads the instruction apart and names the instance: the env's own text
    own = http.post("/reset", json={"id": env_id, "data_idx": 1_000_001}, headers=omrl_client).json()
    assert own["observation"] == first.text and own["instruction"] == first.instruction
    assert http.get("/observation", params={"id": env_id}, headers=omrl_client).json() == first.text
    action = http.get("/expert_action", params={"id": env_id}).json()["action"]
    step = http.post("/step", json={"id": env_id, "action": action}).json()
    assert step["state"] == step["observation"] == http.get("/observation", params={"id": env_id}).json()


def test_the_env_idx_dialect_answers_create_with_the_bare_id(http):
    env_idx = http.post("/env_idx/create").json()
    assert isinstance(env_idx, int) and env_idx in http.get("/env_idx/list_envs").json()
    assert http.post("/env_idx/reset", json={"env_idx": env_idx, "session_id": 1_000_000}).status_code == 200
    while True:
        action = http.get("/env_idx/expert_action", params={"env_idx": env_idx}).json()["action"]
        assert action in http.get("/env_idx/available_actions", params={"env_idx": env_idx}).json()
        step = http.post("/env_idx/step", json={"env_idx": env_idx, "action": action}).json()
        if step["done"]:
            break
    assert step["reward"] == 1.0 and step["available_actions"] == []
    assert http.get("/available_actions", params={"env_idx": env_idx}).json() == []
    assert http.get("/observation", params={"env_idx": env_idx}).json() == step["state"]
    assert http.post("/env_idx/close", json={"env_idx": env_idx}).json()["closed"] is True
    assert "env_idx dialect under /env_idx" in http.get("/env_idx/").json()


def test_a_create_whose_env_crashes_showing_its_first_task_leaves_no_env(monkeypatch):
    from omrl_plugins.envs.gridworld import GridWorld

    with TestClient(create_app("gridworld"), raise_server_exceptions=False) as http:
        original = GridWorld.reset
        monkeypatch.setattr(GridWorld, "reset", lambda self, task_id: 1 / 0)
        assert_error(http.post("/create"), 500, "showing its first task", "ZeroDivisionError")
        assert_error(http.post("/create", json={"data_idx": 5}), 500, "the env raised in reset")
        assert http.get("/list_envs").json() == []
        monkeypatch.setattr(GridWorld, "reset", original)  # the env recovers: the next create shows its task
        assert http.post("/create").json()["observation"]


def test_run_server_on_port_0_binds_a_free_port_and_announces_that_one(grid_app, monkeypatch):
    """`omrl env serve --port 0` was refused: the URL it printed would have named port 0. The port is now
    bound before the banner, which is told the port bound, and the server answers there."""
    import threading
    import time

    import omrl.serve.app as served

    made = []
    real = served._server
    monkeypatch.setattr(served, "_server", lambda app, **config: made.append(real(app, **config)) or made[-1])
    bound: list[int] = []
    thread = threading.Thread(
        target=served.run_server,
        args=(grid_app, "127.0.0.1", 0),
        kwargs={"log_level": "warning", "announce": bound.append},
        daemon=True,
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (made and made[0].started):
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        assert len(bound) == 1 and bound[0] > 0
        assert "omrl env server for 'gridworld'" in httpx.get(f"http://127.0.0.1:{bound[0]}/", timeout=5).json()
    finally:
        if made:
            made[0].should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_an_unknown_id_names_no_other_clients_ids_and_a_refused_reset_says_why_there_is_no_episode(http):
    """Other clients' live ids were listed to anyone; a reset refused for its task left "not reset" unexplained."""
    env_id = http.post("/create").json()["id"]
    message = assert_error(http.post("/step", json={"id": env_id + 1, "action": "up"}), 404, "is not valid")
    assert str(env_id) not in message
    http.post("/reset", json={"id": env_id, "data_idx": 1_000_002})
    assert_error(http.post("/reset", json={"id": env_id, "data_idx": 99_999_999}), 404)
    assert_error(http.post("/step", json={"id": env_id, "action": "up"}), 409, "its last reset named an unknown task")


def test_an_env_that_cannot_write_its_own_worked_example_is_not_served(register_plugin):
    """Its prompt's example is a call of its first tool: served, every GET /tasks answered 500 instead."""
    from omrl.errors import OmrlError
    from tests.fakes import KeyEnv, Registers, tool

    closed = []

    class BrokenToolEnv(KeyEnv):
        tools = [tool("open", "Open the box.", [])]

        def action_from_tool_call(self, name, arguments):
            raise KeyError(name)

        def close(self):
            closed.append(self)

    register_plugin(Registers({"broken-tool": BrokenToolEnv}), name="test-broken-tool")
    with pytest.raises(OmrlError, match=r"BrokenToolEnv.action_from_tool_call failed on its own first tool 'open'"):
        create_app("broken-tool")
    assert len(closed) == 1  # the env built to answer /tasks is closed


@pytest.mark.parametrize(
    "body, said",
    [
        ({"id": "0", "data_idx": 1}, "the body needs 'id' (an integer), got a string"),
        ({"id": 0, "data_idx": None}, "the body needs 'data_idx' (an integer), got null"),
        ({"id": 0, "data_idx": 1.5}, "the body needs 'data_idx' (an integer), got a number"),
    ],
)
def test_a_body_field_of_another_kind_is_named_in_json_words(body, said):
    """It said "got a str" and "got a NoneType": Python's names, to a client that sent JSON."""
    with TestClient(create_app("gridworld")) as client:
        answer = client.post("/reset", json=body)
    assert answer.status_code == 422 and answer.json() == {"error": said}
