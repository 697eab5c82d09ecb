"""What the ``judge`` reward reads of a reply, against the loopback judge of :mod:`tests.rewards.test_judge`:
a reply cut at max_tokens, a verdict inside ``<think>``, group attempt ids that are no attempt number, and a
``base_url`` that is no URL."""

from __future__ import annotations

import json

import pytest

from omrl.errors import ConfigError
from omrl_plugins.rewards.judge import judge_reward
from tests.rewards.test_judge import by_task, composed, episode, ranking


def scores(*entries):
    return json.dumps({"scores": [{"id": key, "explanation": "e", "score": score} for key, score in entries]})


# --- one episode a prompt: a verdict is read only outside the thinking, and a cut reply only when it ends on it ---


@pytest.mark.parametrize(
    "reply, why",
    [
        (
            ("cut", "<think>\nThe task asks for 42. A naive score: 9 would be too kind, but"),
            "no line 'SCORE: <a number from 0 to 10 (10 is best)>' outside its thinking",
        ),
        (
            ("cut", "The last line is SCORE: 10 (a number from 0 to 10) and the answer here"),
            "the reply was cut short and its last line is no verdict alone",
        ),
        (
            ("cut", "It looks right.\nSCORE: 9\nOn reflection, the units are wrong, so the"),
            "the reply was cut short and its last line is no verdict alone",
        ),
        (
            "<think>\nIf it were right I'd write score: 9. It is 41, not 42.\n</think>\nThe answer is wrong.",
            "no line 'SCORE: <a number from 0 to 10 (10 is best)>' outside its thinking in 'The answer is wrong.'",
        ),
        (
            "If it were right I'd write SCORE: 9.</think>\nThe answer is wrong.",  # the template opened <think>
            "no line 'SCORE: <a number from 0 to 10 (10 is best)>' outside its thinking",
        ),
        (
            "Fine.\n<THINK>\nscore: 8, unless",
            "no line 'SCORE: <a number from 0 to 10 (10 is best)>' outside its thinking in 'Fine.'",
        ),
    ],
)
def test_a_verdict_only_in_the_thinking_or_before_a_cut_is_unreadable_and_asked_again(judge, reply, why):
    judge.script = by_task(one=reply, two="Right.\nSCORE: 8")
    bad, good = episode("task one", "41"), episode("task two", "42")
    means = composed([bad, good], **judge.options(max_tokens=32))
    assert bad.end_reason == "env_error", bad.rewards
    assert bad.error.startswith(f"reward 'judge': judge 'judge-model' at {judge.base_url}: answered unparseably: {why}")
    assert ("(the reply was cut at max_tokens=32)" in bad.error) == isinstance(reply, tuple)
    assert good.end_reason == "done" and means == {"judge": 0.8, "total": 0.8}
    again = episode("task one", "41")  # the unreadable reply was not cached: the judge is asked again
    composed([again], **judge.options(max_tokens=32))
    assert len(judge.requests) == 3 and again.end_reason == "env_error"


@pytest.mark.parametrize(
    "reply, score, reasoning",
    [
        (("cut", "It is right.\nSCORE: 7"), 0.7, "It is right."),  # cut just after the verdict
        (("cut", "It is right.\n**Final score:** 7/10\n"), 0.7, "It is right."),
        (("cut", "7"), 0.7, ""),
        ("<think>\nscore: 2 at first sight; no, it is 42.\n</think>\nIt is right.\nSCORE: 8", 0.8, None),
        ("score: 2 at first sight; no.</think>SCORE: 8", 0.8, "score: 2 at first sight; no."),
        (("cut", "<think>score: 1?</think>\n9"), 0.9, "score: 1?"),
        ("It is right.\nSCORE: 7\nNote on score: 0-10, 10 best", 0.7, "It is right."),  # the scale, not a verdict
        ("It is right.\nSCORE: 6\n(score: 0 to 10, as asked)", 0.6, "It is right."),
    ],
)
def test_the_verdict_after_the_thinking_or_on_a_cut_replys_last_line_counts(judge, reply, score, reasoning):
    judge.script = lambda prompt: reply
    ep = episode("Say 42.", "42")
    assert judge_reward([ep], **judge.options()) == [[0.0, score]] and ep.end_reason == "done"
    expected = reasoning if reasoning is not None else "score: 2 at first sight; no, it is 42.\n\nIt is right."
    assert ep.turns[-1].info["judge"]["reasoning"] == expected  # the thinking first


# --- group mode: a cut reply is never read, nor a ranking in the thinking, nor an id that is no attempt number ---


@pytest.mark.parametrize(
    "reply, why",
    [
        (("cut", ranking(9, 2)), "a ranking in a reply that was cut short is not read (the reply was cut at"),
        (
            ("cut", '<think>For example {"scores": [{"id": 1, "score": 10}, {"id": 2, "score": 10}]} is the format'),
            "a ranking in a reply that was cut short is not read",
        ),
        ("<think>" + ranking(10, 10) + "</think>\nI cannot tell them apart.", "no JSON object with 'scores' outside"),
        (scores((1.9, 9), (2, 2)), "an entry's id 1.9 is not an attempt number"),
        (scores((True, 9), (2, 2)), "an entry's id True is not an attempt number"),
        (scores((1.0, 9), (2, 2)), "an entry's id 1.0 is not an attempt number"),
        (scores(("1.5", 9), (2, 2)), "an entry's id '1.5' is not an attempt number"),
        (scores((None, 9), (2, 2)), "an entry's id None is not an attempt number"),
    ],
)
def test_a_group_reply_cut_or_ranked_only_in_thought_or_with_a_bad_id_is_unreadable(judge, reply, why):
    judge.script = lambda prompt: reply
    episodes = [episode("Say 42.", "42", sample=0), episode("Say 42.", "41", sample=1)]
    composed(episodes, **judge.options(group=True))
    for ep in episodes:
        assert ep.end_reason == "env_error", ep.rewards
        assert f"answered unparseably: {why}" in ep.error


def test_a_group_ranking_after_a_draft_in_the_thinking_with_ids_as_digits_is_read(judge):
    draft = scores((1, 1), (2, 1))
    judge.script = lambda prompt: f"<think>A draft: {draft}</think>\n" + scores(("2", 3), (" 1 ", 9))
    episodes = [episode("Say 42.", "42", sample=0), episode("Say 42.", "41", sample=1)]
    assert judge_reward(episodes, **judge.options(group=True)) == [[0.0, 0.9], [0.0, 0.3]]


# --- base_url ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["127.0.0.1:{port}/v1", "localhost:{port}/v1", "ftp://127.0.0.1:{port}/v1"])
def test_a_base_url_that_is_no_http_url_is_refused_naming_the_option_and_a_valid_one(judge, shape):
    base_url = shape.format(port=judge.port)
    with pytest.raises(ConfigError) as refused:
        judge_reward([episode("Say 42.", "42")], **judge.options(base_url=base_url))
    message = str(refused.value)
    assert f"option base_url={base_url!r} is not an http:// or https:// URL with a host" in message
    assert "plugins.judge.base_url=http://127.0.0.1:8000/v1" in message and judge.requests == []
    assert judge_reward([episode("Say 42.", "42")], **judge.options(base_url=f"{judge.base_url}/")) == [[0.0, 0.5]]


# --- what the judge is shown of the episode ---


def test_a_last_reply_that_did_not_parse_is_shown_without_its_reasoning():
    from omrl.data import Episode, Turn
    from omrl_plugins.rewards.judge import answer

    reasoning = "<think>\nIs it 41? No.\n</think>\n"
    turn = Turn("What is 6*7?", reasoning + "It is 42", None, False, 0.0, True, {"answer_from": len(reasoning)})
    ep = Episode(env="dataset", task_id=0, split="test", instruction="", turns=[turn])
    assert answer(ep) == "It is 42"
