"""Only replies an agent received are trained: an episode's end waits until each reply was delivered or
undone, and a client that times out and retries is told apart from agents that share one client."""

from __future__ import annotations

import json
import re
import threading
import time

import openai
import pytest

from omrl import registry
from omrl.data.trajectory import Episode
from omrl.gateway.play import AgentSpec, play_agents
from omrl.gateway.protocol import ChatRequest
from omrl.rollout.pool import EnvPool
from tests.fakes import ScriptedBackend
from tests.gateway.conftest import make_gateway

CHAT = [{"role": "user", "content": "What is 6 times 7?"}]


def episode(task: int = 0) -> Episode:
    return Episode(env="agent", task_id=task, split="train", instruction="")


def wait_until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the state waited for never came"
        time.sleep(0.02)


def ended_in_thread(gateway, key: str) -> threading.Thread:
    """``gateway.end(key)`` on a thread of its own, as an agent's thread ends its episode."""
    thread = threading.Thread(target=gateway.end, args=(key,), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fate, turns", [("undo", 0), ("delivered", 1)])
def test_an_episode_ended_while_its_reply_is_undelivered_waits_for_the_replys_fate(tiny_tokenizer, fate, turns):
    """The handler learns that the client hung up only after the agent returned and the episode began to end:
    the reply is still undone. A reply delivered meanwhile stays."""
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "42"))
    try:
        ep = episode()
        key, recorder = gateway.open(ep)
        _, _, call = gateway.complete(recorder, ChatRequest.from_json({"messages": CHAT}))
        ending = ended_in_thread(gateway, key)
        wait_until(lambda: recorder.ended)  # end() holds the episode, its reply still in flight
        getattr(gateway, fate)(recorder, call)
        ending.join(30)
        assert not ending.is_alive()
        assert len(ep.turns) == turns and (sum(ep.loss_mask) > 0) == bool(turns) and recorder.in_flight == []
    finally:
        gateway.close()


def test_a_reply_never_delivered_is_undone_once_the_end_stops_waiting(tiny_tokenizer):
    """A handler stuck writing its reply cannot hold the episode's end for ever, nor leave its reply trained."""
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "42"))
    gateway.delivery_wait_s = 0.5
    try:
        ep = episode()
        key, recorder = gateway.open(ep)
        _, _, call = gateway.complete(recorder, ChatRequest.from_json({"messages": CHAT}))
        began = time.monotonic()
        gateway.end(key)
        assert time.monotonic() - began < 20
        assert ep.turns == [] and ep.token_ids == [] and recorder.in_flight == []
        gateway.delivered(recorder, call)  # the stuck handler, at last: too late to count
        assert ep.turns == []
    finally:
        gateway.close()


def test_agents_that_return_right_after_their_clients_timed_out_train_no_reply(tiny_tokenizer):
    """Each agent's client gives up on its call and the agent returns at once: its episode ends while the
    reply is generated, and that reply, which the agent never received, is no turn. (Which of the episode's
    end and the call's handler goes first is the threads' race: eight agents race at once.)"""
    keys: list[str] = []

    def reply(*_):
        wait_until(lambda: all(gateway.recorder(key) is None for key in keys))  # every agent returned
        return "a reply nobody got"

    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, reply))
    outcomes: dict[str, str] = {}

    def agent(key: str) -> None:
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=0.5)
        try:
            client.chat.completions.create(model="m", messages=CHAT)
            outcomes[key] = "answered"
        except openai.APITimeoutError:
            outcomes[key] = "timed out"
        gateway.end(key)  # what play_agents does as soon as the agent returns

    try:
        opened = [gateway.open(episode(task)) for task in range(8)]
        keys += [key for key, _ in opened]
        agents = [threading.Thread(target=agent, args=(key,), daemon=True) for key in keys]
        for thread in agents:
            thread.start()
        for thread in agents:
            thread.join(60)
        assert not any(thread.is_alive() for thread in agents)
        assert list(outcomes.values()) == ["timed out"] * 8 and len(backend.served) == 8
        assert [len(recorder.episode.turns) for _, recorder in opened] == [0] * 8
        assert all(sum(recorder.episode.loss_mask) == 0 and len(recorder.undone) == 1 for _, recorder in opened)
    finally:
        keys.clear()
        gateway.close()


def slow(seconds: float):
    """A reply function whose generate call takes ``seconds`` (once a call, however many prompts it has)."""

    def reply(call, index, prompt):
        if index == 0:
            time.sleep(seconds)
        return "42"

    return reply


@pytest.mark.slow  # waits out a deadline of seconds
@pytest.mark.parametrize("gives_up", ["returns", "raises"])
def test_a_client_that_times_out_and_retries_is_named_as_such_not_as_a_shared_client(
    tiny_tokenizer, tmp_path, gives_up
):
    """openai retries a call that timed out; each retry repeats a call whose reply was undone, which is no
    stray of another agent. An episode whose every reply was undone is an env_error naming the client's
    timeout, never "the agent finished without calling the model", and the run goes on."""
    questions = ["What is 6 times 7, please?", "What is 2 times 3, please?"]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "42"}) + "\n" for q in questions))
    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, slow(1.5)))

    def agent(task, base_url, api_key):
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=0.5)
        chat = [{"role": "user", "content": task["prompt"]}]
        for asked in range(2):  # asks again after its client gave up: each call repeats the one before
            try:
                client.chat.completions.create(model="m", messages=chat)
            except openai.APITimeoutError:
                if gives_up == "raises" and asked == 1:
                    raise
        return ""

    pool = EnvPool(registry.envs.get("dataset"), {"path": str(path)}, name="dataset")
    try:
        spec = AgentSpec(run=agent, command=None, reward=None, timeout_s=60)
        episodes = play_agents(spec, gateway, pool, [0, 1])
    finally:
        gateway.close()
        pool.close()
    assert gateway.strayed == set() and len(backend.served) >= 2
    for ep in episodes:
        assert ep.end_reason == "env_error" and ep.turns == [] and sum(ep.loss_mask) == 0
        named = re.search(
            r"calls timed out before their replies: its client hung up on all \d+ .* likely under ([\d.]+) s", ep.error
        )
        assert named and float(named[1]) >= 0.5, ep.error  # the client's timeout (0.5 s) is under the bound named
