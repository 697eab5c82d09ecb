"""Episodes played at once, each agent on its own client: the Agents SDK on its own model client plays them
apart, and a process-wide default client, whose calls land in whichever episode set it last, fails the run
by name rather than train episodes on each other's chats."""

from __future__ import annotations

import json
import threading

import pytest

from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.gateway.play import SharedClient
from omrl.rollout import PlaySpec, RolloutSession
from tests.fakes import ScriptedBackend
from tests.gateway import frameworks

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
