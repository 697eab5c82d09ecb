"""A live sandboxed interpreter: state kept between calls, each call bounded, every failure named by whose it is."""

from __future__ import annotations

import stat

import pytest

from omrl.errors import OmrlError
from omrl.sandbox import run as sandbox
from omrl.sandbox.interpreter import Interpreter, InterpreterPool

from .test_sandbox import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture
def python():
    with Interpreter() as interpreter:
        yield interpreter


def test_variables_live_from_call_to_call_and_a_last_expression_is_printed(python):
    assert python.run("x = 6\nimport math").stdout == ""
    assert python.run("x * 7").stdout == "42\n"
    assert python.run("print(math.gcd(x, 4)); None").stdout == "2\n"
    assert python.calls == 3 and python.alive()


def test_an_exception_shows_the_cells_traceback_and_the_interpreter_goes_on(python):
    result = python.run("y = 1\n1 / 0")
    assert result.exit_code == 1 and not result.timed_out
    assert result.stderr.startswith("Traceback") and result.stderr.rstrip().endswith(
        "ZeroDivisionError: division by zero"
    )
    assert "driver" not in result.stderr  # the driver's own frames are cut
    assert python.run("y").stdout == "1\n"
    assert python.run("exit(3)").stderr.rstrip().endswith("SystemExit: 3") and python.alive()


def test_what_a_program_started_by_the_code_prints_is_caught(python):
    result = python.run("import os\nos.system('echo from-a-shell; echo oops >&2')")
    assert "from-a-shell" in result.stdout and "oops" in result.stderr
    assert python.run("print('next')").stdout == "next\n"  # the protocol was not disturbed


def test_a_call_past_its_time_is_stopped_and_the_variables_survive(python):
    python.run("z = 5")
    result = python.run("while True: pass", timeout_s=0.5)
    assert result.timed_out and result.exit_code == 1 and "ran past 0.5 s" in result.stderr
    assert python.run("z").stdout == "5\n"


def test_code_that_swallows_the_time_limit_is_killed_and_the_interpreter_is_dead(python):
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass"
    result = python.run(code, timeout_s=0.3)
    assert result.timed_out and result.killed_reason == "timeout" and python.dead
    with pytest.raises(OmrlError, match="was killed; start another"):
        python.run("1")


def test_a_crash_kills_the_interpreter_and_says_why(python):
    result = python.run("import ctypes; ctypes.string_at(0)")
    assert result.killed_reason == "signal SIGSEGV" and python.dead


def test_output_is_cut_and_says_so(python):
    result = python.run("print('a' * 5000)\nraise ValueError('last line')", max_output_bytes=100)
    assert result.truncated and result.stdout == "a" * 100
    assert "ValueError: last line" in result.stderr and "cut to 100 bytes" in result.stderr  # stderr keeps its tail


def test_a_pool_hands_out_started_interpreters_each_to_one_caller():
    pool = InterpreterPool(2)
    try:
        taken = [pool.take() for _ in range(3)]  # more than are ready: the third starts at once
        assert len({id(t) for t in taken}) == 3 and all(t.alive() for t in taken)
        for k, interpreter in enumerate(taken):
            interpreter.run(f"mine = {k}")
        assert [t.run("mine").stdout for t in taken] == ["0\n", "1\n", "2\n"]
        for interpreter in taken:
            interpreter.close()
    finally:
        pool.close()


def test_a_sandbox_that_cannot_be_set_up_raises_and_runs_nothing(monkeypatch, tmp_path):
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: str(fake))
    with pytest.raises(OmrlError, match="did not start: .*Operation not permitted"):
        Interpreter()
