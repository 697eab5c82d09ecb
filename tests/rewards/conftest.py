"""The loopback judge the judge reward's tests share (:mod:`tests.rewards.judge_server`)."""

from __future__ import annotations

import pytest

from omrl_plugins.rewards import judge_calls
from tests.rewards.judge_server import KEY, ScriptedJudge


@pytest.fixture(scope="module")
def server():
    judge = ScriptedJudge()
    yield judge
    judge.stop()


@pytest.fixture
def judge(server, monkeypatch):
    """The loopback judge, its script and requests reset and the reply cache empty; ``judge.options(**more)``
    are plugin options that point at it, its key in $JUDGE_KEY."""
    server.script, server.requests, server.most_in_flight = (lambda prompt: "SCORE: 5"), [], 0
    server.test += 1
    judge_calls.clear_cache()
    monkeypatch.setenv("JUDGE_KEY", KEY)
    server.options = lambda **more: {
        "base_url": server.base_url,
        "model": "judge-model",
        "api_key_env": "JUDGE_KEY",
        "retries": 0,
        **more,
    }
    yield server
    judge_calls.clear_cache()
