"""A live sandboxed interpreter: state kept between calls, each call bounded, every failure named by whose it is."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omrl.errors import OmrlError
from omrl.sandbox import run as sandbox
from omrl.sandbox.interpreter import Interpreter, InterpreterPool

from .test_sandbox import host_processes_with, needs_sandbox

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


@pytest.mark.slow  # waits out a deadline of seconds
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
    assert result.truncated and result.stdout.startswith("a" * 100 + "\n[omrl sandbox: stdout was 5,001 bytes")
    assert "only its first 100 characters are shown" in result.stdout
    assert result.stderr.rstrip().endswith("ValueError: last line")  # stderr keeps its tail


@pytest.mark.parametrize(
    "code",
    [
        "print('x' * 9_000_000)",
        "print('x' * 9_000_000, file=__import__('sys').stderr)",
        "x = 'x' * (8 * 2**20 - 2)\nprint(x)\nprint('tail' * 10)",  # the file-size limit is hit after the cell
        "import os\nos.system('yes xxxxxxxxxxxx | head -c 9000000')",  # a program the code starts writes it
        "import sys\nfor _ in range(900):\n    sys.stdout.write('x' * 10_000)",
    ],
)
def test_megabytes_of_output_are_cut_and_the_interpreter_and_its_variables_live_on(python, code):
    python.run("kept = 7")
    result = python.run(code, max_output_chars=1000)
    assert not python.dead and result.killed_reason is None and result.truncated
    shown = result.stdout + result.stderr
    assert "xxxxxxxxxx" in shown and re.search(r"was (9|8),\d{3},\d{3} bytes; only its (first|last) 1,000", shown)
    assert len(shown) < 2 * 1000 + 400
    assert python.run("kept").stdout == "7\n"


@pytest.mark.parametrize("code", ["print(s)", "_ = sys.stdout.write(s)", "print(s, file=sys.stderr)"])
def test_a_string_of_tens_of_megabytes_is_printed_without_a_copy_that_runs_out_of_memory(code):
    """The stream's file copied each write whole: one 40 MB print raised MemoryError inside the driver
    (in the memory the python tool gives its interpreter: room for the string and its UTF-8, not a copy)."""
    with Interpreter(memory_mb=512) as python:
        python.run("import sys\ns = 'x' * 40_000_000")
        result = python.run(code, max_output_chars=1000)
        kept = python.run("len(s)").stdout
    assert result.exit_code == 0 and "MemoryError" not in result.stderr, result.stderr[-300:]
    shown = result.stdout + result.stderr
    assert "xxxxxxxxxx" in shown and re.search(r"was 40,000,00[01] bytes; only its (first|last) 1,000", shown)
    assert kept == "40000000\n"


def test_output_of_emoji_on_both_streams_is_cut_never_taken_for_a_forged_reply(python):
    """JSON spends 12 bytes on an emoji (two escapes): the longest honest reply is 24 bytes a character."""
    code = "import sys\nprint('\U0001f600' * 50_000)\n_ = sys.stderr.write('\U0001f600' * 50_000)"
    result = python.run(code, timeout_s=10, max_output_chars=10_000)
    assert not python.dead and result.killed_reason is None and result.truncated
    assert result.stdout.startswith("\U0001f600" * 10_000 + "\n[omrl sandbox: stdout was 200,001 bytes")
    assert result.stderr.endswith("\U0001f600" * 10_000) and "stderr was 200,000 bytes" in result.stderr


@pytest.mark.parametrize("code", ["sys.stderr.close()", "sys.stderr.detach()", "sys.stdout = sys.stderr = None"])
def test_code_that_breaks_its_own_output_streams_still_gets_its_traceback(python, code):
    result = python.run(f"import sys\nkept = 7\n{code}\n1 / 0")
    assert not python.dead and "ZeroDivisionError" in result.stderr
    assert python.run("print(kept)").stdout == "7\n"


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
        "os.write(4, b'[' * 3000 + b']' * 3000 + b'\\n')",  # too deep for the host's JSON reader
        # the old protocol's well-formed reply: without this call's nonce it is a forgery
        'os.write(4, b\'{"id": 1, "stdout": "", "stderr": "", "error": false, "timed_out": false, "truncated": false}\\n\')',
    ],
)
def test_code_that_forges_the_interpreters_replies_stops_it_and_is_blamed(python, forgery):
    result = python.run(f"import os\n{forgery}", timeout_s=2, max_output_chars=1000)
    assert result.killed_reason == "protocol" and python.dead and "reply channel" in result.stderr


# code that finds the request its driver is answering (any code in the interpreter can) and forges its reply
FORGE_WITH_THE_NONCE = """import os, json, sys
frame = sys._getframe()
while not any(isinstance(v, dict) and "nonce" in v for v in frame.f_locals.values()):
    frame = frame.f_back
request = next(v for v in frame.f_locals.values() if isinstance(v, dict) and "nonce" in v)
reply = {"id": request["id"], "nonce": request["nonce"], "stdout": "forged", "stderr": "", "error": False,
         "timed_out": False, "stdout_cut": False, "stderr_cut": False, "stdout_bytes": 6, "stderr_bytes": 0}
os.write(4, (json.dumps(reply) + "\\n").encode())
"""


def test_a_forgery_that_knows_its_calls_nonce_fools_only_that_call(python):
    python.run("kept = 7")
    assert python.run(FORGE_WITH_THE_NONCE).stdout == "forged"  # the code could have printed that anyway
    # the driver's own reply to the forged call arrives late: it is dropped, and the next call is not blamed
    assert [python.run(code).stdout for code in ("print('next')", "kept")] == ["next\n", "7\n"]
    assert python.alive()


def test_a_forked_child_never_answers_in_the_interpreters_place(python):
    python.run("import os\npid = os.fork()\nprint('child' if pid == 0 else 'parent')")
    assert [python.run(f"print({k})").stdout for k in range(3)] == ["0\n", "1\n", "2\n"]


def test_a_forked_childs_late_output_never_lands_in_a_later_call():
    with Interpreter(lifetime_s=60) as python:
        # the child leaves the cell a second after the parent: its buffered 'child' is flushed then
        python.run("import os, time\nif os.fork() == 0:\n    print('child')\n    time.sleep(1)\nprint('parent')")
        assert python.run("import time\ntime.sleep(2)\nprint(0)").stdout == "0\n"


@pytest.mark.slow  # waits out a deadline of seconds
def test_a_request_the_stuck_interpreter_will_not_read_times_out_instead_of_hanging():
    with Interpreter(lifetime_s=60) as python:
        stall = (
            FORGE_WITH_THE_NONCE + "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(50)"
        )
        assert python.run(stall, timeout_s=1).stdout == "forged"
        started = time.monotonic()
        result = python.run("x = '" + "a" * 200_000 + "'", timeout_s=1)
        assert result.killed_reason == "timeout" and time.monotonic() - started < 10


def test_code_that_ends_the_interpreter_is_an_error_of_the_code(python):
    result = python.run("import os\nos._exit(0)")
    assert result.exit_code != 0 and result.killed_reason == "exited" and python.dead


@pytest.mark.slow  # waits out a deadline of seconds
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


def running(pid: str) -> bool:
    """Whether host process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("busy", [False, True])
def test_an_interpreter_dies_with_the_process_that_started_it(busy):
    """A caller killed with SIGKILL (no chance to close anything) takes its interpreters with it,
    idle or in the middle of a call."""
    marker = f"71.{os.getpid()}{int(busy)}"  # a sleep length no other process uses
    last = "python.run('import time; time.sleep(100)', timeout_s=200)" if busy else "time.sleep(100)"
    script = (
        "import time\nfrom omrl.sandbox.interpreter import Interpreter\n"
        "python = Interpreter(lifetime_s=300)\n"
        f"python.run(\"import subprocess; subprocess.Popen(['sleep', '{marker}'])\")\n"
        "print(python.proc.pid, flush=True)\n" + last
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    unshare = caller.stdout.readline().strip()
    try:
        assert unshare.isdigit() and host_processes_with(marker)
        time.sleep(0.5)  # the call is under way
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 5
        while (host_processes_with(marker) or running(unshare)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert host_processes_with(marker) == [] and not running(unshare)
    finally:  # the sandbox of a failed test must not stay for its lifetime: killing unshare ends it
        caller.kill()
        if unshare.isdigit() and running(unshare):
            os.kill(int(unshare), signal.SIGKILL)
