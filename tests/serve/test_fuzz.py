"""Property tests of the env server's request handling: whatever arrives, the answer is a 4xx
``{"error": ...}`` or a valid answer, never a 500, and the server keeps serving."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omrl.serve import create_app

MAX_BODY = 4096  # a small cap, so bodies on both sides of it are cheap to send
ROUTES = [
    ("POST", "/create"),
    ("POST", "/reset"),
    ("POST", "/step"),
    ("POST", "/close"),
    ("GET", "/observation"),
    ("GET", "/available_actions"),
    ("GET", "/expert_action"),
    ("GET", "/tasks"),
    ("GET", "/list_envs"),
    ("GET", "/"),
]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# JSON the protocol might see: its own keys with values of every kind, including ids that are live
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 8)
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(["up", "down", "left", "right", "train", "test"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["id", "data_idx", "action", "env_idx", "split"]) | st.text(max_size=8)
bodies = st.dictionaries(keys, json_values, max_size=4) | json_values


@pytest.fixture(scope="module")
def http():
    app = create_app("gridworld", max_body=MAX_BODY, max_envs=64)
    with TestClient(app, raise_server_exceptions=False) as client:
        for task in (0, 1, 2):  # live ids 0..2, some mid-episode, so valid paths get exercised too
            env_id = client.post("/create").json()["id"]
            client.post("/reset", json={"id": env_id, "data_idx": task})
        yield client


def check_answer(response, path: str, http: TestClient) -> None:
    """A 4xx with only ``{"error": str}``, or a 2xx whose body fits the route."""
    assert response.status_code < 500, (path, response.status_code, response.text[:300])
    body = response.json()
    if response.status_code >= 400:
        assert isinstance(body, dict) and list(body) == ["error"] and isinstance(body["error"], str), body
        assert len(response.content) < 2000  # the request never comes back in the answer
        return
    assert response.status_code == 200
    if path == "/create":
        assert isinstance(body["id"], int) and isinstance(body["instance"], str)
        http.post("/close", json={"id": body["id"]})  # stay under max_envs
    elif path == "/reset":
        assert isinstance(body["observation"], str) and isinstance(body["instruction"], str)
    elif path == "/step":
        assert isinstance(body["done"], bool) and isinstance(body["won"], bool)
        assert math.isfinite(body["reward"]) and math.isfinite(body["score"])
    elif path == "/close":
        assert body["closed"] is True


def raw_json(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN and Infinity travel as Python writes them


@pytest.mark.slow
@FUZZ
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_random_json_bodies(http, route, body):
    method, path = route
    response = http.request(method, path, content=raw_json(body), headers={"content-type": "application/json"})
    check_answer(response, path, http)


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    content=st.binary(max_size=300),
    content_type=st.sampled_from(
        [
            "application/json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "application/json; charset=latin-1",
            "",
        ]
    ),
)
def test_random_bytes(http, route, content, content_type):
    method, path = route
    headers = {"content-type": content_type} if content_type else {}
    check_answer(http.request(method, path, content=content, headers=headers), path, http)


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    params=st.dictionaries(keys, st.text(max_size=20) | st.integers().map(str), max_size=3),
)
def test_random_query_strings(http, route, params):
    method, path = route
    check_answer(http.request(method, path, params=params), path, http)


@FUZZ
@given(
    route=st.sampled_from([r for r in ROUTES if r[0] == "POST"]),
    size=st.integers(MAX_BODY - 64, MAX_BODY + 64),
    fill=st.sampled_from([b" ", b"[", b"x", b'"']),
)
def test_bodies_around_the_cap(http, route, size, fill):
    method, path = route
    content = b'{"id": 0, "action": "' + fill * size + b'"}'
    response = http.request(method, path, content=content[:size], headers={"content-type": "application/json"})
    check_answer(response, path, http)
    assert (response.status_code == 413) == (len(content[:size]) > MAX_BODY)


@FUZZ
@given(
    path=st.text(
        alphabet=st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"), exclude_characters="?#%\\"), max_size=40
    ),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
)
def test_random_routes_and_methods(http, path, method):
    path = "/" + path.lstrip("/")
    check_answer(http.request(method, path), path, http)


def test_huge_bodies_and_deep_nesting_then_a_whole_episode(http):
    for content in (b"x" * (5 << 20), b"[" * MAX_BODY, b'{"id":' * 500 + b"0" + b"}" * 500):
        response = http.post("/step", content=content, headers={"content-type": "application/json"})
        check_answer(response, "/step", http)
    env_id = http.post("/create").json()["id"]  # the server still plays: an expert episode to its end
    http.post("/reset", json={"id": env_id, "data_idx": 7})
    for _ in range(30):
        action = http.get("/expert_action", params={"id": env_id}).json()["action"]
        answer = http.post("/step", json={"id": env_id, "action": action}).json()
        if answer["done"]:
            break
    assert answer["done"] and answer["won"]
