"""The answer rewards: numeric_match (numbers within a tolerance) and math_verify (math-verify's equivalence)."""

from __future__ import annotations

import doctest
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from omrl import registry
from omrl.data import Episode, Turn
from omrl.errors import ConfigError, OmrlError
from omrl.rewards import RewardError, compose_rewards
from omrl_plugins.rewards import answers
from omrl_plugins.rewards.answers import final_number, math_equivalent, numbers_match


def answered(action: str | None, **info) -> Episode:
    """An episode whose last turn answered ``action`` (None: the reply did not parse) with ``info``."""
    turns = [
        Turn("obs", "Act: look", "look", True, 0.0, False),
        Turn("obs", f"Act: {action}", action, action is not None, 0.0, True, info=info),
    ]
    return Episode(env="qa", task_id=7, split="test", instruction="", turns=turns)


def score(name: str, action: str | None, truth, **options) -> float:
    return registry.rewards.get(name)([answered(action, ground_truth=truth)], **options)[0][-1]


def test_registered_as_built_ins():
    for name in ("numeric_match", "math_verify"):
        assert registry.rewards.component(name).distribution == "omrl"


def test_docstring_examples_hold():
    result = doctest.testmod(answers)
    assert result.attempted > 8 and result.failed == 0


@pytest.mark.parametrize(
    "text,expected",
    [
        ("42", [42]),
        ("The answer is 1,234,567.", [1234567]),
        ("$1,200.50 in total", [Fraction("1200.5")]),
        ("-$5", [-5]),
        ("$-5", [-5]),
        ("\u22123", [-3]),  # a typographic minus
        ("x = -0.25", [Fraction(-1, 4)]),
        (".5", [Fraction(1, 2)]),
        ("3/4 of it", [Fraction(3, 4)]),
        ("1.5/3", [Fraction(1, 2)]),
        ("2.5e3", [2500]),
        ("12%", [12, Fraction(12, 100)]),
        ("first 3, then 7", [7]),
        ("1,2,3", [3]),  # no thousands separator: a list
        ("5-3", [3]),  # a hyphen between numbers is no minus sign
        ("Natalia sold 48/2 = 24 clips in May. #### 72", [72]),  # GSM8K's answer field
        ("x2 and v1.5", []),  # numbers glued to words are not read
        ("1/0", []),
        ("no number here", []),
        ("", []),
        ("9" * 5000, [Fraction(Decimal("9" * 5000))]),  # past Python's int-from-text limit, read all the same
        ("1e1000", [Fraction(10) ** 1000]),  # an exponent of any length is read whole
        ("1e1001", []),  # past MAX_EXPONENT: no number
        ("7, not 5e-99999999", [7]),
        ("1e" + "9" * 5000, []),
    ],
)
def test_final_number(text, expected):
    assert final_number(text) == [Fraction(v) for v in expected]


def test_final_number_of_a_huge_exponent_is_exact_and_compares_without_overflow():
    assert final_number("1e999") == [Fraction(10) ** 999]
    assert numbers_match("1e999", "1e999") and not numbers_match("1e999", "1e998")


def test_a_final_number_of_more_digits_than_python_reads_from_text_is_still_the_final_number():
    huge = "1" * 5000  # past sys.get_int_max_str_digits() (4300): int("1" * 5000) raises
    assert final_number(f"42, no: {huge}") == [Fraction(Decimal(huge))]  # never the 42 before it
    assert not numbers_match(f"42, no: {huge}", "42") and numbers_match(f"so {huge}", huge)


@pytest.mark.parametrize(
    "predicted,truth,options,expected",
    [
        ("72", "72", {}, True),
        ("72.0", "72", {}, True),
        ("I think 1,000", "1000", {}, True),
        ("50%", "0.5", {}, True),
        ("0.5", "50%", {}, True),
        ("0.3333333", "1/3", {}, True),
        ("0.333", "1/3", {}, False),
        ("0.333", "1/3", {"rel_tol": 1e-2}, True),
        ("0.001", "0", {}, False),
        ("0.001", "0", {"abs_tol": 0.01}, True),
        ("1e-12", "0", {}, True),  # within the default abs_tol of 1e-9
        ("73", "72", {}, False),
        ("-72", "72", {}, False),
        ("seventy-two", "72", {}, False),
        ("1e1000", "1", {}, False),
        ("5e-1000", "5", {}, False),
        ("5e-1000", "0", {}, True),  # within abs_tol
    ],
)
def test_numbers_match(predicted, truth, options, expected):
    assert numbers_match(predicted, truth, **options) is expected
    assert score("numeric_match", predicted, truth, **options) == float(expected)


def test_numeric_match_reads_the_answer_and_the_truths_as_exact_match_does():
    assert score("numeric_match", "answer[$72]", "72") == 1.0  # unwrapped from answer[...]
    assert score("numeric_match", "12", ["11", "12"]) == 1.0  # any accepted answer
    assert score("numeric_match", "answer[no idea]", "72") == 0.0
    # a reply that did not parse never reached the env: 0, even without a ground truth to read
    assert registry.rewards.get("numeric_match")([answered(None)]) == [[0.0, 0.0]]


def test_numeric_match_refuses_what_it_cannot_score():
    with pytest.raises(RewardError, match=r"ground truth 'Paris' .* holds no number; use exact_match"):
        score("numeric_match", "Paris", "Paris")
    with pytest.raises(RewardError, match="needs a ground truth in the last turn's info"):
        registry.rewards.get("numeric_match")([answered("72")])
    with pytest.raises(RewardError, match=r"rel_tol=-0\.1 is invalid; valid: a finite number >= 0"):
        score("numeric_match", "1", "1", rel_tol=-0.1)
    with pytest.raises(RewardError, match=r"abs_tol=nan is invalid"):
        score("numeric_match", "1", "1", abs_tol=float("nan"))
    with pytest.raises(RewardError, match=r"abs_tol=True is invalid"):
        score("numeric_match", "1", "1", abs_tol=True)


def test_options_come_from_the_plugins_block():
    episodes = [answered("3.14", ground_truth="3.14159")]
    assert compose_rewards(episodes, {"numeric_match": 1.0})["numeric_match"] == 0.0
    means = compose_rewards(episodes, {"numeric_match": 1.0}, {"numeric_match": {"rel_tol": 0.001}})
    assert means["numeric_match"] == 1.0
    with pytest.raises(ConfigError, match="its options: rel_tol, abs_tol"):
        compose_rewards(episodes, {"numeric_match": 1.0}, {"numeric_match": {"tolerance": 0.1}})


@pytest.mark.parametrize(
    "predicted,truth,expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("$\\frac{1}{2}$", "1/2", True),
        ("The answer is \\boxed{42}.", "42", True),
        ("x = 3", "3", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\{1, 2\\}", "\\{2, 1\\}", True),
        ("0.51", "1/2", False),
        ("41", "42", False),
        ("I don't know", "42", False),
        ("", "42", False),
        ("Paris", "Paris", True),  # a truth math-verify reads as no expression compares as text
        ("paris!", "Paris", True),
        ("Lyon", "Paris", False),
    ],
)
def test_math_verify(predicted, truth, expected):
    assert math_equivalent(predicted, truth) is expected
    assert score("math_verify", predicted, truth) == float(expected)


def test_math_verify_works_off_the_main_thread_and_skips_unparsed_replies():
    results = []
    thread = threading.Thread(target=lambda: results.append(score("math_verify", "\\frac{6}{3}", "2")))
    thread.start()
    thread.join()
    assert results == [1.0]
    assert registry.rewards.get("math_verify")([answered(None)]) == [[0.0, 0.0]]


def test_a_worker_killed_while_idle_is_replaced_and_the_answer_still_judged():
    """The world killed it (the OOM killer, a stray signal): the answer was never checked, so it is not 0."""
    assert math_equivalent("\\frac{1}{2}", "0.5")  # leaves an idle worker
    idle = list(answers.math_worker._idle)
    for worker in idle:
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
    assert math_equivalent("\\frac{1}{2}", "0.5") and math_equivalent("\\frac{1}{3}", "0.5") is False
    assert not set(map(id, idle)) & set(map(id, answers.math_worker._idle))  # the dead ones are gone


@pytest.mark.slow  # waits out a deadline of seconds
@pytest.mark.parametrize("on_main_thread", [True, False])
def test_an_answer_that_would_compute_forever_is_not_equal_at_its_deadline_on_any_thread(on_main_thread):
    """math-verify's own bound, a signal alarm, works on the main thread only; tool envs score on others."""
    assert math_equivalent("\\frac{1}{2}", "0.5")  # a worker is started: its start is not what is timed
    results, started = [], time.monotonic()

    def compare():
        results.append(math_equivalent("9^{9^{9^{9}}}", "3", timeout_s=2))

    if on_main_thread:
        compare()
    else:
        thread = threading.Thread(target=compare, daemon=True)
        thread.start()
        thread.join(30)
    assert results == [False] and time.monotonic() - started < 2 + 2
    assert math_equivalent("\\frac{6}{3}", "2") and not math_equivalent("\\frac{6}{3}", "3")  # a new worker


def running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow  # a worker process, waited on until it ends by itself
def test_a_worker_left_computing_by_a_killed_caller_ends_by_itself():
    """math-verify's own alarm works on the worker's main thread, and its reply then finds no reader."""
    script = (
        "from omrl_plugins.rewards import math_worker\n"
        "from omrl_plugins.rewards.answers import math_equivalent\n"
        "math_equivalent('\\\\frac{1}{2}', '0.5')\n"
        "print(math_worker._idle[0].proc.pid, flush=True)\n"
        "math_equivalent('9^{9^{9^{9}}}', '3', timeout_s=3)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(caller.stdout.readline())
    time.sleep(0.3)  # the worker is computing
    caller.kill()
    caller.wait()
    started = time.monotonic()
    while running(worker):
        assert time.monotonic() - started < 60, "the orphaned worker still runs"
        time.sleep(0.2)
    assert time.monotonic() - started > 1  # it was computing when its caller died


def test_a_worker_stuck_past_its_jobs_cpu_time_is_ended_by_the_kernel():
    """For a computation no alarm can stop (inside C) when no caller is left to kill the worker."""
    script = (
        "from omrl_plugins.rewards import math_worker\n"
        "math_worker._CPU_MARGIN_S = 1\n"
        "math_worker._limit_cpu(0)\n"
        "while True:\n    pass\n"
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == -signal.SIGXCPU


def test_a_worker_that_starts_with_a_line_other_than_json_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(answers.math_worker, "_BOOT", "print('not json', flush=True)")
    with pytest.raises(OmrlError, match=r"the math-verify worker replied b'not json', which is not JSON"):
        answers.math_worker._Worker()


def test_a_worker_that_replies_a_line_other_than_json_is_an_error_not_a_verdict(monkeypatch):
    """Its replies have a stdout of their own, so such a line is the worker broken: never "not equal"."""
    ready_then_junk = "print('{\"ready\": true}', flush=True); input(); print('oops', flush=True)"
    monkeypatch.setattr(answers.math_worker, "_BOOT", ready_then_junk)
    worker = answers.math_worker._Worker()
    with pytest.raises(OmrlError, match=r"the math-verify worker replied b'oops', which is not JSON"):
        worker.compare("1", "1", timeout_s=10)
    assert worker.proc.returncode is not None  # killed: never used again


def test_plain_answers_are_judged_without_a_worker(monkeypatch):
    monkeypatch.setattr(answers.math_worker, "equivalent", None)  # any call to a worker would fail
    assert math_equivalent("72", " 72 ") and math_equivalent("3.0", "3") and not math_equivalent("-3", "3")
    assert not math_equivalent("12345678901234567890", "12345678901234567891")


def test_math_verify_without_the_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(
        RewardError, match=r"reward 'math_verify' needs the math-verify package.*pip install 'omrl\[math\]'"
    ):
        score("math_verify", "1", "1")


def test_math_verify_is_imported_only_when_used():
    from tests.helpers import fresh_python_json

    loaded = fresh_python_json(
        "import json, sys; from omrl import registry; registry.rewards.get('numeric_match'); "
        "print(json.dumps('math_verify' in sys.modules))"
    )
    assert loaded is False


@pytest.mark.parametrize("name", ["exact_match", "accuracy", "bleu", "numeric_match", "math_verify"])
def test_an_unparsed_last_reply_scores_0_with_every_answer_reward(name):
    # the env never saw an answer, so it reported no ground truth: the agent failed, nothing is broken
    assert registry.rewards.get(name)([answered(None)]) == [[0.0, 0.0]]


@pytest.mark.parametrize("name", ["exact_match", "accuracy", "bleu", "numeric_match", "math_verify"])
@pytest.mark.parametrize("end", ["max_turns", "max_context"])
def test_an_episode_cut_while_it_still_called_a_tool_scores_0_with_every_answer_reward(name, end):
    """A tool env's last step at the turn cap reports no ground truth: the run stopped, blaming the env."""
    ep = answered("python[print(17 + 25)]", tool="python", score=0.0, won=False)
    ep.end_reason = end
    assert registry.rewards.get(name)([ep]) == [[0.0, 0.0]]
    ep.end_reason = "done"  # an env that ended the episode must report its answer: still refused
    with pytest.raises(RewardError, match="needs a ground truth"):
        registry.rewards.get(name)([ep])
