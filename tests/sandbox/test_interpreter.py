"""A live sandboxed interpreter: state kept between calls, each call bounded, every failure named by whose it is."""

from __future__ import annotations

import stat
import time

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
    result = python.run("print('a' * 5000)\nraise ValueError('last line')", max_output_chars=100)
    assert result.truncated and result.stdout == "a" * 100
    assert (
        "ValueError: last line" in result.stderr and "cut to 100 characters" in result.stderr
    )  # stderr keeps its tail


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


@pytest.mark.parametrize(
    "forgery",
    [
        "os.write(4, b'not json\\n')",
        "os.write(4, b'[1, 2]\\n')",
        'os.write(4, b\'{"id": 1, "stdout": 5}\\n\')',
        "os.write(4, b'x' * 300000)",  # no line end, and more than any reply can be
    ],
)
def test_code_that_forges_the_interpreters_replies_stops_it_and_is_blamed(python, forgery):
    result = python.run(f"import os\n{forgery}", timeout_s=2, max_output_chars=1000)
    assert result.killed_reason == "protocol" and python.dead and "reply channel" in result.stderr


def test_a_well_formed_forgery_only_fools_the_call_that_made_it(python):
    code = 'import os, json\nos.write(4, (json.dumps({"id": 1, "stdout": "forged", "stderr": "", "error": False, "timed_out": False, "truncated": False}) + "\\n").encode())'
    assert python.run(code).stdout == "forged"  # the code could have printed that anyway
    result = python.run("print('next')")  # the driver's own late reply to call 1 is out of step
    assert result.killed_reason == "protocol" and python.dead


def test_a_forked_child_never_answers_in_the_interpreters_place(python):
    python.run("import os\npid = os.fork()\nprint('child' if pid == 0 else 'parent')")
    assert [python.run(f"print({k})").stdout for k in range(3)] == ["0\n", "1\n", "2\n"]


def test_a_forked_childs_late_output_never_lands_in_a_later_call():
    with Interpreter(lifetime_s=60) as python:
        # the child leaves the cell a second after the parent: its buffered 'child' is flushed then
        python.run("import os, time\nif os.fork() == 0:\n    print('child')\n    time.sleep(1)\nprint('parent')")
        assert python.run("import time\ntime.sleep(2)\nprint(0)").stdout == "0\n"


def test_a_request_the_stuck_interpreter_will_not_read_times_out_instead_of_hanging():
    with Interpreter(lifetime_s=60) as python:
        forged = '{"id": 1, "stdout": "", "stderr": "", "error": false, "timed_out": false, "truncated": false}'
        stall = f"import os, signal, time\nos.write(4, b'{forged}\\n')\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(50)"
        python.run(stall, timeout_s=1)
        started = time.monotonic()
        result = python.run("x = '" + "a" * 200_000 + "'", timeout_s=1)
        assert result.killed_reason == "timeout" and time.monotonic() - started < 10


def test_code_that_ends_the_interpreter_is_an_error_of_the_code(python):
    result = python.run("import os\nos._exit(0)")
    assert result.exit_code != 0 and result.killed_reason == "exited" and python.dead


def test_a_sandbox_that_reaches_its_lifetime_mid_call_is_the_hosts_failure_not_the_codes():
    with Interpreter(lifetime_s=1) as python:
        with pytest.raises(OmrlError, match="reached its lifetime"):
            python.run("import time\ntime.sleep(8)", timeout_s=10)


def test_the_pool_drops_interpreters_that_waited_half_their_lifetime():
    pool = InterpreterPool(1, lifetime_s=2)
    try:
        deadline = time.monotonic() + 20
        while not pool._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        [waiting] = list(pool._ready)
        time.sleep(1.1)
        taken = pool.take()
        assert taken is not waiting and taken.age() < 1 and waiting.dead
        taken.close()
    finally:
        pool.close()
