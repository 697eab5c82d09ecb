"""Episodes an agent program played through omrl's gateway: where each row starts, every tool-call
attempt with its status, and what the agent returned and how the reward function scored it, in the
episode's answer and on the page in a real Chromium (a hand-made episode for the statuses, which the
tiny model rarely writes, and a real gateway rollout of the tiny model for the rest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omrl.view import open_run
from omrl.view.page import write_page

from .conftest import SCRIPT
from .test_browser import page_of, serving

REPO = Path(__file__).resolve().parents[2]
STATUSES = ["ok", "invalid_json", "unclosed", "missing_name", "unknown_tool", "bad_arguments"]
ATTEMPTS = [
    {"status": "ok", "name": "multiply"},
    {"status": "invalid_json", "name": None, "error": "Expecting ',' delimiter: line 1 column 30"},
    {"status": "unclosed", "name": None, "error": "<tool_call> without </tool_call>"},
    {"status": "missing_name", "name": None, "error": "the call names no function"},
    {"status": "unknown_tool", "name": "divide", "error": "no tool named 'divide'; valid: multiply"},
    {"status": "bad_arguments", "name": "multiply", "error": "a: expected integer, got 'six'"},
]
REWARD = {"correct": 1.0, "brevity": 0.25}


def agent_episode(rows, sample=0, result="'42'", reward=REWARD):
    """An episode as the gateway records one: ``rows`` holds each row's turns, each turn the list of
    its reply's tool-call attempts ([] for a reply without one). Each turn is a prompt of 4 tokens (a
    row's first, or the tool results it answers) and 3 sampled ones."""
    from omrl.data.trajectory import Episode, Turn

    ids, mask, turns, row_starts = [], [], [], []
    for row, replies in enumerate(rows):
        if row:
            row_starts.append(len(ids))
        for calls in replies:
            ids += [10 + row, 11, 12, 13]
            mask += [0] * 4
            start = len(ids)
            ids += [100, 101, 102]
            mask += [1] * 3
            turns.append(agent_turn(Turn, row, calls, (start, len(ids))))
    last = turns[-1]
    last.done, last.reward = True, sum((reward or {}).values())
    last.info["agent_result"] = result
    if reward is not None:
        last.info["agent_reward"] = reward
    return Episode(
        "dataset",
        0,
        "test",
        "What is 6 times 7?",
        turns=turns,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        prompt_length=4,
        sample=sample,
        row_starts=row_starts,
        messages=[{"role": "user", "content": "What is 6 times 7?"}],
    )


def agent_turn(Turn, row, calls, span):
    """One turn with the info the gateway's recorder gives it."""
    info = {"rollout": {"truncated": False, "token_exact": True, "new_tokens": 3, "row": row}}
    problem = next((c for c in calls if c["status"] != "ok"), None)
    if calls:
        info["tool_calls"] = calls
        info["tool"] = next((c["name"] for c in calls if c["name"]), "(unparsed)")
    if problem is not None:
        info["tool_error"] = f"{problem['status']}: {problem['error']}"
    return Turn(
        observation="What is 6 times 7?" if not row else "42",
        response="<tool_call>...</tool_call>" if calls else "42",
        action=None,
        format_ok=problem is None,
        reward=0.0,
        done=False,
        info=info,
        span=span,
        parse_error=info.get("tool_error"),
    )


@pytest.fixture
def agent_file(tmp_path):
    """Two agent episodes: three rows with every tool-call status in the second; one row, no tool call."""
    from omrl.data.trajectory import write_episodes

    episodes = [
        agent_episode([[[]], [ATTEMPTS, [ATTEMPTS[0]]], [[]]]),
        agent_episode([[[], []]], sample=1, result="None", reward=None),
    ]
    return write_episodes(episodes, tmp_path / "agent.parquet")


def test_the_episode_answer_carries_rows_attempts_and_the_agents_outcome(agent_file):
    detail = open_run(agent_file).episode(0)
    assert detail["played_by_agent"] is True and len(detail["row_starts"]) == 2
    assert [t["row"] for t in detail["turns"]] == [0, 1, 1, 2]
    assert [c["status"] for c in detail["turns"][1]["tool_calls"]] == STATUSES
    assert detail["turns"][1]["tool_calls"][4] == {
        "status": "unknown_tool",
        "name": "divide",
        "error": "no tool named 'divide'; valid: multiply",
    }
    assert detail["turns"][0]["tool_calls"] == []
    assert detail["tool_calls"] == {"ok": 2} | dict.fromkeys(STATUSES[1:], 1)
    assert detail["turns"][-1]["agent_result"] == "'42'" and detail["turns"][-1]["agent_reward"] == REWARD
    assert detail["turns"][0]["agent_result"] is None and detail["turns"][0]["agent_reward"] is None


def test_an_env_loop_episode_is_not_taken_for_an_agents(small_run):
    detail = open_run(small_run).episode(0)
    assert detail["played_by_agent"] is False and detail["tool_calls"] == {}
    assert all(t["tool_calls"] == [] and t["agent_reward"] is None for t in detail["turns"])


@pytest.mark.slow
def test_the_page_marks_each_row_and_every_failed_tool_call(agent_file, chromium):
    with serving(agent_file, tokenizer="tiny") as url, page_of(chromium) as page:
        page.goto(url + "#/episode/0")
        page.wait_for_selector(".tokens .tok")
        # rows: counted in the summary, a divider in the turn list and among the tokens
        assert page.inner_text("tr[data-fact=rows] td").startswith("3 — a new row starts where the agent sent")
        assert page.locator("main > .row-break").all_inner_texts() == ["row 2 (new prompt)", "row 3 (new prompt)"]
        assert page.locator(".tokens .row-break").all_inner_texts() == ["row 2 (new prompt)", "row 3 (new prompt)"]
        # every attempt of the second turn: its status, the tool it named, why it failed
        attempts = page.locator(".turn[data-turn='1'] li.tool-call")
        assert [attempts.nth(i).get_attribute("data-status") for i in range(attempts.count())] == STATUSES
        assert attempts.nth(0).locator(".badge.good").inner_text() == "ok"
        assert attempts.nth(0).locator(".error").count() == 0
        for i, attempt in enumerate(ATTEMPTS[1:], start=1):
            assert attempts.nth(i).locator(".badge.bad").inner_text() == attempt["status"]
            assert attempt["error"] in attempts.nth(i).inner_text()
        assert "divide" in attempts.nth(4).inner_text() and "(no name)" in attempts.nth(1).inner_text()
        # at a glance: the turn is marked, and the summary counts the attempts by status
        assert page.locator(".turn.failed-calls").count() == 1
        assert "5 of 6 tool call(s) failed" in page.inner_text(".turn[data-turn='1'] > div >> nth=0")
        assert page.locator(".turn[data-turn='2'] li.tool-call.bad").count() == 0
        counts = page.locator("tr[data-fact='tool calls'] .badge")
        assert counts.all_inner_texts() == ["ok × 2"] + [f"{s} × 1" for s in STATUSES[1:]]
        assert page.locator("tr[data-fact='tool calls'] .badge.bad").count() == 5

        page.goto(url + "#/episode/1")  # one row, no tool call
        page.wait_for_selector(".tokens .tok")
        assert page.inner_text("tr[data-fact=rows] td") == "1 — every call of the agent continued the same prompt"
        assert page.locator(".row-break, li.tool-call, tr[data-fact='tool calls']").count() == 0


@pytest.mark.slow
def test_the_page_shows_what_the_agent_returned_and_its_reward(agent_file, chromium):
    with serving(agent_file, tokenizer="tiny") as url, page_of(chromium) as page:
        page.goto(url + "#/episode/0")
        page.wait_for_selector(".turn")
        assert page.inner_text("tr[data-fact='agent returned'] td") == "'42'"
        assert page.locator("tr[data-fact='agent reward'] .badge").all_inner_texts() == ["correct 1", "brevity 0.25"]
        last = page.locator(".turn[data-turn='3']")
        assert last.locator("pre.agent-result").inner_text() == "'42'"
        assert last.locator(".agent-reward .badge").all_inner_texts() == ["correct 1", "brevity 0.25"]
        assert page.locator(".turn[data-turn='0'] pre.agent-result").count() == 0

        page.goto(url + "#/episode/1")  # no reward function: the result alone
        page.wait_for_selector(".turn")
        assert page.inner_text("tr[data-fact='agent returned'] td") == "None"
        assert page.locator("tr[data-fact='agent reward'], .agent-reward").count() == 0


@pytest.mark.slow
def test_tool_names_errors_and_results_show_as_text(chromium, tmp_path):
    """A model writes the tool names and the agent returns what it likes: shown exactly, never as HTML."""
    from omrl.data.trajectory import write_episodes

    attempt = {"status": "unknown_tool", "name": "<b>tool</b>", "error": SCRIPT}
    path = write_episodes([agent_episode([[[attempt]]], result=SCRIPT)], tmp_path / "agent.parquet")
    write_page(open_run(path, tokenizer="tiny"), tmp_path / "saved.html")
    with serving(path, tokenizer="tiny") as url, page_of(chromium) as page:
        for address in (url + "#/episode/0", (tmp_path / "saved.html").as_uri() + "#/episode/0"):
            page.goto(address)
            page.wait_for_selector("li.tool-call")
            assert page.text_content("li.tool-call code") == "<b>tool</b>"
            assert page.text_content("li.tool-call .error") == " " + SCRIPT
            assert page.text_content("pre.agent-result") == SCRIPT
            assert page.evaluate("window.__pwned") is None
            assert page.locator("main img, main b, main script").count() == 0


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory):
    """A real rollout: the tiny model played by an agent that sends two prompts of its own, scored by a
    reward function (~10 s)."""
    folder = tmp_path_factory.mktemp("gateway")
    (folder / "questions.jsonl").write_text('{"question": "What is 6 times 7?", "answer": "42"}\n')
    command = [
        *"rollout --env dataset --model tiny --num-tasks 1".split(),
        f"plugins.dataset.path={folder / 'questions.jsonl'}",
        *"--agent tests.view.gateway_agents:two_prompts --reward tests.view.gateway_agents:answered -o".split(),
        str(folder / "out.parquet"),
    ]
    subprocess.run(  # from the repository, so the agent's module imports
        [sys.executable, "-m", "omrl", *command],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMRL_NUM_THREADS": "1"},
    )
    return folder / "out.parquet"


@pytest.mark.slow
def test_a_real_gateway_episode_on_the_page(gateway_run, chromium):
    detail = open_run(gateway_run).episode(0)
    assert detail["played_by_agent"] is True and len(detail["row_starts"]) == 1  # the agent's second prompt: a new row
    with serving(gateway_run) as url, page_of(chromium) as page:
        page.goto(url + "#/episode/0")
        page.wait_for_selector(".tokens .tok")
        assert page.inner_text("tr[data-fact=rows] td").startswith("2 — ")
        assert page.locator("main > .row-break").all_inner_texts() == ["row 2 (new prompt)"]
        assert page.locator(".tokens .row-break").count() == 1
        # the divider sits between the two turns
        assert page.locator(".turn[data-turn='0'] + .row-break + .turn[data-turn='1']").count() == 1
        assert page.text_content("tr[data-fact='agent returned'] td") == detail["turns"][-1]["agent_result"]
        components = page.locator("tr[data-fact='agent reward'] .badge")
        names = [components.nth(i).get_attribute("data-component") for i in range(components.count())]
        assert names == ["answered", "bonus"] and components.nth(1).inner_text() == "bonus 0.5"
