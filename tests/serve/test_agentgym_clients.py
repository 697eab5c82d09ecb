"""AgentGym's own clients play `omrl env serve` envs to the end.

Each client class below makes the requests that the `agentenv` package's env client of that name
makes (TextCraft, BabyAI, SciWorld, ALFWorld, LMRL-Gym maze, WebShop, SQLGym) and reads exactly
the keys it reads, so a missing key fails here as a KeyError, as it would there. Their parsing of
a model's reply ("Thought: ... Action: ...") is left out: the actions are the served env's
expert's (`GET /expert_action`), and each test checks what the agent would see (the goal inside
the first observation) and what the client would score (reward, score and done at the end).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from omrl.serve import ENV_IDX_PREFIX, background_server, create_app, open_env


@dataclass
class StepOutput:
    """agentenv's StepOutput: what a client hands its agent after a step."""

    state: str
    reward: float
    done: bool


class Client:
    """What every agentenv client does around its calls: the env id goes into each body
    (`_post`) or query (`_get`), and any status but 200 fails."""

    id_key = "id"

    def __init__(self, http: httpx.Client, base: str):
        self.http, self.base = http, base

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data[self.id_key] = self.env_id
        res = self.http.post(f"{self.base}/{path}", json=data)
        assert res.status_code == 200, res.text
        return res.json()

    def _get(self, path: str) -> Any:
        res = self.http.get(f"{self.base}/{path}?{self.id_key}={self.env_id}")
        assert res.status_code == 200, res.text
        return res.json()

    def _create(self, body: dict[str, Any] | None = None) -> Any:
        """POST /create, as each client's constructor does; the answer."""
        ok = self.http.post(f"{self.base}/create", json=body)
        assert ok.status_code == 200, ok.text
        return ok.json()

    def observe(self) -> str:
        return self.info["observation"]

    def expert(self) -> str:
        """Not a client call: the action an agent would reply with, from the served env's expert."""
        return self._get("expert_action")["action"]


class TextCraftClient(Client):
    def __init__(self, http, base):
        super().__init__(http, base)
        ok = self._create({"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None})
        self.env_id = ok["id"]
        self.info = {"observation": ok["observation"], "reward": 0, "done": False}

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        self.info = {"observation": response["observation"], "reward": response["reward"], "done": response["done"]}
        return StepOutput(response["observation"], response["reward"], response["done"])

    def reset(self, idx: int = 0) -> dict:
        response = self._post("reset", {"data_idx": idx})
        self.info.update({"observation": response["observation"], "reward": 0, "done": False})
        return response

    def close(self):
        return self._post("close", {})


class BabyAIClient(Client):
    def __init__(self, http, base):
        super().__init__(http, base)
        self.env_id = self._create()["id"]

    def _keep(self, response: dict[str, Any]) -> None:
        """What the client keeps of a step's or a reset's answer."""
        self.info = {key: response[key] for key in ("observation", "reward", "score", "done")}

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        self._keep(response)
        return StepOutput(response["observation"], response["score"], response["done"])  # the score is its reward

    def reset(self, data_idx: int = 0) -> dict:
        response = self._post("reset", {"data_idx": data_idx})
        self._keep(response)
        return response


class SciWorldClient(BabyAIClient):
    def reset(self, data_idx: int = 0) -> dict:
        response = self._post("reset", {"data_idx": data_idx})
        self.info = {
            "observation": response["task_description"] + "\n" + response["observation"],
            "reward": 0,
            "score": 0,
            "done": False,
        }
        return response


class ALFWorldClient(Client):
    def __init__(self, http, base):
        super().__init__(http, base)
        self.env_id = self._create()["id"]
        self.info = None

    def observe(self) -> str:
        return f"{self.info['observation']}\nAVAILABLE ACTIONS: {','.join(self.info['available_actions'])}"

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        if "observation" not in response:
            raise KeyError(f"AlfWorld step response missing 'observation': {response}")
        self.info = {
            "observation": response["observation"],
            "available_actions": response.get("available_actions", []),
            "reward": response.get("reward", 0.0),
            "done": response.get("done", False),
        }
        return StepOutput(response["observation"], response.get("reward", 0.0), response.get("done", False))

    def reset(self, game: int, world_type: str = "Text") -> dict:
        response = self._post("reset", {"game": game, "world_type": world_type})
        self.info = {
            "observation": response["observation"],
            "available_actions": response.get("available_actions", []),
            "reward": 0,
            "done": False,
        }
        return response

    def close(self):
        return self._post("close", {})


class MazeClient(Client):
    first_observation = "Your objective is to reach the goal in as few steps as possible."

    def __init__(self, http, base):
        super().__init__(http, base)
        self.env_id = self._create()["id"]
        self.info = {"reward": 0, "done": False}

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        if "error" in response:
            self.info.update({"observation": response["error"], "done": True})
            return StepOutput(response["error"], 0.0, True)
        self.info.update(
            {
                "observation": response["observation"],
                "reward": self.info["reward"] + response["reward"],
                "done": response["done"],
            }
        )
        return StepOutput(response["observation"], response["reward"], response["done"])

    def reset(self, idx: int = 0) -> dict:
        response = self._post("reset", {"game": idx})
        response["observation"] = self.first_observation + "\n" + response["observation"]
        self.info.update({"observation": response["observation"], "reward": 0, "done": False})
        return response


class WebShopClient(Client):
    """The `env_idx` dialect: /create answers the bare id; the observation comes from a GET."""

    id_key = "env_idx"
    task_field = "session_id"

    def __init__(self, http, base):
        super().__init__(http, base)
        self.env_id = self._create()

    def observe(self) -> str:
        return self._get("observation")

    def step(self, action: str) -> StepOutput:
        response = self._post("step", {"action": action})
        return StepOutput(response["state"], response["reward"], response["done"])

    def reset(self, idx: int) -> Any:
        response = self._post("reset", {self.task_field: idx})
        response[0] = self.observe()  # WebShop's own server answers [observation, None]
        return response


class SQLGymClient(WebShopClient):
    task_field = "item_id"

    def reset(self, idx: int) -> Any:
        return self._post("reset", {self.task_field: idx})


def play(client: Client, turns: int) -> list[StepOutput]:
    """Step ``client`` with the expert's actions until done; every step's output."""
    outputs = []
    for _ in range(turns):
        outputs.append(client.step(client.expert()))
        if outputs[-1].done:
            return outputs
    raise AssertionError(f"the expert did not finish in {turns} turns")


def split(name: str, split_name: str):
    """The task ids of a split of env ``name``."""
    with contextlib.closing(open_env(name)) as env:
        return env.split_of(split_name)


def opening(name: str, task_id: int):
    """The env's own first observation of ``task_id``, played locally."""
    with contextlib.closing(open_env(name)) as env:
        return env.reset(task_id)


@pytest.fixture(scope="module")
def served():
    """Base URLs of real servers on 127.0.0.1 for gridworld, webshop and textcraft."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(background_server(create_app(name)))
            for name in ("gridworld", "webshop", "textcraft")
        }


@pytest.fixture
def http():
    with httpx.Client(timeout=30) as client:
        yield client


GRID_TASKS = list(split("gridworld", "test")[:3])


def test_textcraft_client_sees_the_goal_and_crafts_it(served, http):
    client = TextCraftClient(http, served["textcraft"])
    first_task = split("textcraft", "train")[0]  # the env's first task, shown by /create
    assert client.observe().startswith(opening("textcraft", first_task).instruction + "\n\nCrafting commands:")
    task = split("textcraft", "test")[1]
    expected = opening("textcraft", task)
    client.reset(task)
    assert expected.instruction.startswith("Goal: craft ")
    assert client.observe() == f"{expected.instruction}\n\n{expected.text}"  # the goal, then the recipes
    outputs = play(client, 50)
    assert [o.reward for o in outputs[:-1]] == [0.0] * (len(outputs) - 1)
    assert outputs[-1].reward == 1.0 and outputs[-1].done is True and client.info["done"] is True
    assert client.close()["closed"] is True


@pytest.mark.parametrize("client_class", [BabyAIClient, SciWorldClient])
def test_babyai_and_sciworld_clients_score_a_win(served, http, client_class):
    client = client_class(http, served["gridworld"])
    for task in GRID_TASKS:
        expected = opening("gridworld", task)
        client.reset(task)
        shown = client.observe()
        assert expected.instruction in shown and expected.text in shown
        assert shown.count(expected.instruction) == 1  # SciWorld's client adds task_description: it is ""
        assert client.info["score"] == 0 and client.info["done"] is False and client.info["reward"] == 0
        outputs = play(client, 12)
        assert all(isinstance(o.reward, float) and 0.0 <= o.reward <= 1.0 for o in outputs)
        assert outputs[-1].reward == 1.0 and outputs[-1].done is True  # the score, read as the reward
        assert client.info["score"] == 1.0 and client.info["reward"] == 1.0


def test_alfworld_client_reads_the_available_actions(served, http):
    client = ALFWorldClient(http, served["gridworld"])
    task = GRID_TASKS[1]
    expected = opening("gridworld", task)
    client.reset(task)
    assert client.observe().startswith(f"{expected.instruction}\n\n{expected.text}\nAVAILABLE ACTIONS: ")
    turns = 0
    while not client.info["done"]:
        actions = client.info["available_actions"]
        assert isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions)
        action = client.expert()
        assert action in actions
        result = client.step(action)
        turns += 1
        assert turns <= 12
    assert result.reward == 1.0 and result.done is True
    assert client.info["available_actions"] == [] and client.observe().endswith("AVAILABLE ACTIONS: ")
    assert client.close()["closed"] is True


def test_lmrl_gym_maze_client_sums_its_rewards_to_the_goal(served, http):
    client = MazeClient(http, served["gridworld"])
    task = GRID_TASKS[2]
    expected = opening("gridworld", task)
    client.reset(task)
    assert client.observe() == f"{MazeClient.first_observation}\n{expected.instruction}\n\n{expected.text}"
    outputs = play(client, 12)
    assert client.info["reward"] == sum(o.reward for o in outputs) == 1.0 and client.info["done"] is True


def test_webshop_client_buys_the_product_in_the_env_idx_dialect(served, http):
    base = served["webshop"] + ENV_IDX_PREFIX
    client = WebShopClient(http, base)
    assert isinstance(client.env_id, int)  # /create answered the bare id, as WebShop's server does
    task = split("webshop", "test")[0]
    expected = opening("webshop", task)
    response = client.reset(task)
    shown = response[0]
    assert shown == expected.text and shown.count(expected.instruction) == 1  # its page shows the goal once
    outputs = play(client, 15)
    assert outputs[-1].reward == 1.0 and outputs[-1].done is True
    assert all(isinstance(o.state, str) for o in outputs) and outputs[0].state != expected.text  # it searched
    assert client.observe() == outputs[-1].state


def test_sqlgym_client_reads_state_and_the_observation_route(served, http):
    client = SQLGymClient(http, served["gridworld"] + ENV_IDX_PREFIX)
    task = GRID_TASKS[0]
    expected = opening("gridworld", task)
    answer = client.reset(task)
    assert answer["observation"] == client.observe() == f"{expected.instruction}\n\n{expected.text}"
    outputs = play(client, 12)
    assert outputs[-1].reward == 1.0 and outputs[-1].done is True
    assert client.observe() == outputs[-1].state  # after the first step: the step's own observation


def test_agentgym_clients_stale_ids_never_reach_another_clients_env_after_a_restart(http):
    """AgentGym's clients send no instance header and keep their id: after `omrl env serve`
    restarts, client A's id must not step the env client B was just handed, for any number of
    restarts (a start never hands out an id an earlier start handed out)."""
    with background_server(create_app("gridworld")) as url:
        a = BabyAIClient(http, url)
        a.reset(GRID_TASKS[0])
        port = int(url.rsplit(":", 1)[1])
    stale = [a.env_id]
    for task in GRID_TASKS[1:3]:
        with background_server(create_app("gridworld"), port=port):  # a new process on the same port
            b = BabyAIClient(http, url)
            assert b.env_id not in stale
            b.reset(task)
            shown = b.observe()
            for env_id in stale:  # an AgentGym client whose server restarted under it
                a.env_id = env_id
                with pytest.raises(AssertionError, match="is not valid"):
                    a.step("move forward")
                with pytest.raises(AssertionError, match="is not valid"):
                    a.reset(GRID_TASKS[0])
            assert b.observe() == shown and b._get("observation") == shown  # B's env is untouched
            assert play(b, 12)[-1].reward == 1.0
            stale.append(b.env_id)


def test_omrls_agentgym_client_prompts_a_served_env_with_its_example_action():
    """The served env's example action was not sent: the remote prompt lacked the local one's Example."""
    from omrl import registry
    from omrl_plugins.envs.agentgym.env import AgentGymEnv

    pytest.importorskip("minigrid")
    react = registry.templates.get("react")()
    with background_server(create_app("babyai")) as url, contextlib.closing(open_env("babyai")) as local:
        remote = AgentGymEnv(base_url=url, env_name="babyai", timeout=30)
        assert remote.action_example == local.action_example == "go to red ball 1"
        assert "go to red ball 1" in react.system_prompt(remote)
        remote.close()


def test_a_served_env_whose_example_is_a_call_of_its_first_tool_prompts_as_it_does_in_process():
    """gridworld sets no action_example: its example is made from its first tool, which the server did not send,
    so a served gridworld's prompt had no Example where the in-process one had."""
    from omrl import registry
    from omrl_plugins.envs.agentgym.env import AgentGymEnv

    chosen = registry.templates.get("react")()
    with background_server(create_app("gridworld")) as url, contextlib.closing(open_env("gridworld")) as local:
        remote = AgentGymEnv(base_url=url, env_name="gridworld", timeout=30)
        assert local.action_example == "" and "Example:" in chosen.system_prompt(local)
        assert remote.action_example == "up"
        assert chosen.system_prompt(remote).split("Example:")[1] == chosen.system_prompt(local).split("Example:")[1]
        remote.close()
