"""An action an AgentGym server refused (answered as an ordinary step, the reason as the observation)
is marked ``info["invalid"]``, so ``invalid_action_rate`` counts it."""

from __future__ import annotations

import pytest

from omrl.data.trajectory import Episode, Turn
from omrl.evaluation import evaluate
from omrl.serve import background_server
from omrl_plugins.envs.agentgym import AgentGymEnv
from omrl_plugins.envs.agentgym.dialects import GENERIC_SERVER, KNOWN_SERVERS, as_omrl_server, read_step
from tests.envs.agentgym_apps import textcraft_app

FAST = {"retries": 2, "backoff": 0.01, "timeout": 5.0}


def test_a_textcraft_refusal_is_an_invalid_action_and_the_rate_counts_it():
    with background_server(textcraft_app()) as url:
        env = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        env.reset(3)
        actions = ["get 2 planks", "craft 1 stick3 using 2 planks"]
        results = [env.step(action) for action in actions]
    assert [r.info["invalid"] for r in results] == [True, False] and results[-1].info["won"]
    turns = [Turn(r.observation, a, a, True, r.reward, r.done, r.info) for a, r in zip(actions, results)]
    episode = Episode(env="agentgym", task_id=3, split="test", instruction="", won=True, score=1.0, turns=turns)
    assert evaluate([episode])["invalid_action_rate"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "name, refusal, played",
    [
        (
            "babyai",
            'The action is not recognized. Please check valid actions.\nAvailable actions: ["turn left"]',
            "In front of you in this room, you can see several objects",
        ),
        ("sciworld", "No known action matches that input.", "You move to the kitchen."),
        ("alfworld", "Nothing happens.", "You arrive at loc 5. On the countertop 1, you see a apple 1."),
    ],
)
def test_each_known_servers_refusal_is_recognised(name, refusal, played):
    spec = KNOWN_SERVERS[name]
    answer = {"observation": "", "reward": 0, "score": 0, "done": False}
    assert read_step(spec, {**answer, "observation": refusal}, 0.0).info["invalid"] is True
    assert read_step(spec, {**answer, "observation": played}, 0.0).info["invalid"] is False


def test_an_omrl_server_says_invalid_itself_and_is_never_read_from_its_text():
    answer = {
        "observation": "Could not find it",
        "reward": 0.0,
        "score": 0.0,
        "won": False,
        "done": False,
        "info": {"invalid": False},
    }
    assert read_step(as_omrl_server(KNOWN_SERVERS["textcraft"]), answer, 0.0).info["invalid"] is False
    assert "invalid" not in read_step(GENERIC_SERVER, {**answer, "info": {}}, 0.0).info
