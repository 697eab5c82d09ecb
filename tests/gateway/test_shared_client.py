"""Episodes played at once, each agent on its own client: the Agents SDK on its own model client plays them
apart, and a process-wide default client, whose calls land in whichever episode set it last, fails the run
by name rather than train episodes on each other's chats."""

from __future__ import annotations

import itertools
import json
import threading
import time

import openai
import pytest

from omrl import registry
from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.gateway.messages import of_another_episode
from omrl.gateway.play import AgentSpec, SharedClient, play_agents
from omrl.rollout import PlaySpec, RolloutSession
from omrl.rollout.pool import EnvPool
from tests.fakes import ScriptedBackend
from tests.gateway import frameworks
from tests.gateway.conftest import make_gateway

QUESTIONS = ["What is 6 times 7, please?", "What is 2 times 3, please?", "What is 4 times 5, please?"]


def session(tmp_path, tokenizer, agent: str, questions=QUESTIONS) -> RolloutSession:
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "42"}) + "\n" for q in questions))
    cfg = command_line_config(
        RolloutRunConfig,
        [f"plugins.dataset.path={path}", f"agent.callable=tests.gateway.frameworks:{agent}", "agent.timeout_s=30"],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    return RolloutSession.from_config(cfg, backend=ScriptedBackend(tokenizer, lambda call, i, prompt: str(i)))


def test_agents_with_clients_of_their_own_play_concurrent_episodes_apart(tiny_tokenizer, tmp_path):
    with session(tmp_path, tiny_tokenizer, "openai_agents_default") as played:
        episodes = played.play([0, 1, 2], PlaySpec(split="train", group_size=2)).episodes
    assert all(ep.end_reason == "done" and len(ep.turns) == 1 for ep in episodes)
    for ep in episodes:  # each episode holds its own task's chat, and nothing else
        prompt = tiny_tokenizer.decode(ep.token_ids[: ep.turns[0].span[0]])
        assert [q for q in QUESTIONS if q in prompt] == [ep.turns[0].observation]


@pytest.mark.parametrize("tasks, group_size", [([0, 1, 2], 1), ([0], 2)])
def test_agents_sharing_a_global_client_fail_the_run_by_name(tiny_tokenizer, tmp_path, tasks, group_size):
    """Other tasks: a call holds another episode's task. One task's group: one key gets every agent's
    chats (each a retry or a chat it did not continue) while the others' agents never called."""
    frameworks.TOGETHER[:] = [threading.Barrier(len(tasks) * group_size, timeout=20)]
    try:
        with session(tmp_path, tiny_tokenizer, "openai_agents_global") as played:
            with pytest.raises(SharedClient, match="share one client .*set_default_openai_client"):
                played.play(tasks, PlaySpec(split="train", group_size=group_size))
    finally:
        frameworks.TOGETHER.clear()


def test_a_group_whose_shared_client_strays_after_each_agents_first_call_fails_the_run(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """One task's group on a process-wide client, each agent's first call on its own key: A's second call
    lands on B's key. It continues A's chat, which holds a reply B never got: the run fails by name rather
    than train B on A's chat."""
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": QUESTIONS[0], "answer": "42"}) + "\n")
    replies = itertools.count()  # every reply differs, as replies sampled at temperature > 0 do
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: f"reply {next(replies)}"))
    for name, value in (("base_url", None), ("api_key", None), ("max_retries", 0)):
        monkeypatch.setattr(openai, name, value)  # put back after the test
    a1, b1, a2 = threading.Event(), threading.Event(), threading.Event()
    order, lock = itertools.count(), threading.Lock()

    def agent(task, base_url, api_key):
        with lock:
            me = "ab"[next(order)]
        if me == "b":
            a1.wait(10)
        openai.base_url, openai.api_key = base_url + "/", api_key  # the process-wide default client
        chat = [{"role": "user", "content": task["prompt"]}]
        first = openai.chat.completions.create(model="m", messages=chat, max_tokens=8)
        chat += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": me}]
        (a1 if me == "a" else b1).set()
        (b1 if me == "a" else a2).wait(10)  # A goes on after B's first call set B's key
        try:
            return openai.chat.completions.create(model="m", messages=chat, max_tokens=8).choices[0].message.content
        finally:
            a2.set()

    fails_as_shared_client(gateway, agent, path)


def test_a_call_on_the_key_of_an_episode_whose_agent_returned_fails_the_run(tiny_tokenizer, tmp_path, monkeypatch):
    """One task's group on a process-wide client, B's key set last: B calls, returns and its episode ends
    before A's call, on B's key, arrives. Only an agent sharing B's client makes that call; the run fails by
    name rather than score A as a failure of the world."""
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": QUESTIONS[0], "answer": "42"}) + "\n")
    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "42"))
    for name, value in (("base_url", None), ("api_key", None), ("max_retries", 0)):
        monkeypatch.setattr(openai, name, value)  # put back after the test
    a_set, keys, order, lock = threading.Event(), [], itertools.count(), threading.Lock()

    def agent(task, base_url, api_key):
        with lock:
            me = "ab"[next(order)]
            keys.append(api_key)
        if me == "b":
            a_set.wait(10)
        openai.base_url, openai.api_key = base_url + "/", api_key  # the process-wide default client
        if me == "a":
            a_set.set()
            for _ in range(1000):  # until B's episode ended
                if len(keys) == 2 and gateway.recorder(keys[1]) is None:
                    break
                time.sleep(0.01)
        chat = [{"role": "user", "content": task["prompt"]}]
        return openai.chat.completions.create(model="m", messages=chat, max_tokens=8).choices[0].message.content

    fails_as_shared_client(gateway, agent, path)


def test_another_episodes_call_that_found_a_key_just_before_it_ended_is_told_apart(tiny_tokenizer):
    """Three tasks on one process-wide client, all calls on C's key: C's own call is answered and C ends
    while A's call, which found C's key just before, waits its turn. It was refused as a call on an ended
    key, and the run went on as though A's agent had failed on its own."""
    from omrl.data.trajectory import Episode
    from omrl.gateway.protocol import ChatRequest
    from omrl.gateway.server import Misrouted

    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "42"))
    try:
        opened = [
            gateway.open(Episode(env="qa", task_id=i, split="train", instruction=""), q)
            for i, q in enumerate(QUESTIONS)
        ]
        (_, _), (_, _), (key_c, c) = opened
        asked = ChatRequest.from_json({"messages": [{"role": "user", "content": QUESTIONS[2]}]})
        gateway.delivered(c, gateway.complete(c, asked)[2])
        found = gateway.recorder(key_c)  # A's call finds C's key
        gateway.end(key_c, agent_returned=True)  # C's agent returned
        with pytest.raises(Misrouted, match="share one client"):
            gateway.complete(found, ChatRequest.from_json({"messages": [{"role": "user", "content": QUESTIONS[0]}]}))
        assert gateway.misrouted
    finally:
        gateway.close()


def test_a_same_task_siblings_call_that_found_a_key_just_before_it_ended_is_told_apart(tiny_tokenizer):
    """One task's group: B's own call is answered and B ends while A's call, the same request, found B's key
    just before. A client retries only a reply it did not get, and B's agent got its reply and returned: the
    call is a sibling's, so the agents share a client. It was refused as a call on an ended key."""
    from omrl.data.trajectory import Episode
    from omrl.gateway.protocol import ChatRequest
    from omrl.gateway.server import Misrouted

    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda *_: "42"))
    try:
        for sample in (0, 1):
            key_b, b = gateway.open(
                Episode(env="qa", task_id=0, split="train", instruction="", sample=sample), QUESTIONS[0]
            )
        asked = ChatRequest.from_json({"messages": [{"role": "user", "content": QUESTIONS[0]}]})
        gateway.delivered(b, gateway.complete(b, asked)[2])
        found = gateway.recorder(key_b)
        gateway.end(key_b, agent_returned=True)
        with pytest.raises(Misrouted, match="share one client"):
            gateway.complete(found, asked)
        assert gateway.misrouted
    finally:
        gateway.close()


def test_a_same_task_siblings_chat_counts_only_by_a_reply_this_episode_never_got():
    prompt, reply = {"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": "42"}
    other = {"role": "assistant", "content": "43"}
    messages = [prompt, reply, {"role": "user", "content": "Go on."}]
    sibling = (QUESTIONS[0], [prompt, reply], [reply])
    assert of_another_episode(messages, QUESTIONS[0], [sibling], given=[other])  # A's reply, sent on B's key
    assert not of_another_episode(messages, QUESTIONS[0], [sibling], given=[other, reply])  # B got it too
    few_shot = (QUESTIONS[0], [prompt, reply], [other])  # an assistant message of the prompt, no reply of theirs
    assert not of_another_episode(messages, QUESTIONS[0], [few_shot], given=[])


def fails_as_shared_client(gateway, agent, path) -> None:
    """Play a group of two of the one task in ``path`` with ``agent``: the run fails as a shared client."""
    pool = EnvPool(registry.envs.get("dataset"), {"path": str(path)}, name="dataset")
    try:
        with pytest.raises(SharedClient, match="share one client"):
            play_agents(AgentSpec(run=agent, command=None, reward=None, timeout_s=30), gateway, pool, [0], group_size=2)
    finally:
        gateway.close()
        pool.close()


def test_an_agent_that_asks_its_opening_twice_on_purpose_is_no_shared_client(tiny_tokenizer, tmp_path):
    """Self-consistency on one task beside an episode of another task whose agent decided not to call: no
    episode of the asking agent's task went without a call, so nothing says the client is shared."""
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "42"}) + "\n" for q in QUESTIONS[:2]))

    def agent(task, base_url, api_key):
        if task["id"] == 1:
            return "42"  # answers without the model
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        chat = [{"role": "user", "content": task["prompt"]}]
        return [client.chat.completions.create(model="m", messages=chat).choices[0].message.content for _ in "ab"][0]

    gateway, _ = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: f"try {call}"))
    pool = EnvPool(registry.envs.get("dataset"), {"path": str(path)}, name="dataset")
    try:
        spec = AgentSpec(run=agent, command=None, reward=None, timeout_s=30)
        asked, answered = play_agents(spec, gateway, pool, [0, 1], group_size=1)
    finally:
        gateway.close()
        pool.close()
    assert len(asked.turns) == 2 and len(asked.rows()) == 2  # both samples trained, each a row
    assert answered.error == "the agent finished without calling the model"
