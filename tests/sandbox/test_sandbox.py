"""The sandbox for model-written code: a normal program works, and each escape a test can try fails.

Every run is bounded (a few processes, a few seconds) so the tests cannot hurt a small shared machine.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from omrl.errors import OmrlError
from omrl.sandbox import process, run_sandboxed
from omrl.sandbox import run as sandbox
from omrl.sandbox.cgroup import MemoryCgroup

needs_sandbox = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="the sandbox needs Linux and root (CI has both); without them it raises, tested below",
)
README = Path(__file__).resolve().parents[2] / "README.md"


def attempts(*lines: str) -> str:
    """Python source that runs each ``label: statement`` and prints ``label ok`` or ``label <Error>``."""
    body = [
        f"try:\n    {stmt}\n    print({label!r}, 'ok')\nexcept Exception as e:\n    print({label!r}, type(e).__name__)"
        for label, stmt in (line.split(": ", 1) for line in lines)
    ]
    return "import os, socket\n" + "\n".join(body)


def outcomes(result) -> dict[str, str]:
    """``{label: 'ok' or error name}`` from the output of `attempts`."""
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def host_processes_with(marker: str) -> list[str]:
    """Command lines of the host's processes that contain ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


# --- what works ----------------------------------------------------------------------------------


@needs_sandbox
def test_a_python_program_gets_stdin_and_returns_stdout_stderr_and_exit_code():
    code = "import sys\nprint(sys.stdin.read().upper())\nprint('oops', file=sys.stderr)\nsys.exit(3)"
    result = run_sandboxed(code, stdin="hello", timeout_s=10)
    assert (result.stdout, result.stderr, result.exit_code) == ("HELLO\n", "oops\n", 3)
    assert not result.timed_out and result.killed_reason is None and not result.truncated


@needs_sandbox
def test_a_shell_command_runs_as_an_unprivileged_user_in_a_bare_environment():
    result = run_sandboxed('echo "$(id -u) $(pwd) $HOME"; env | sort; exit 4', language="shell", timeout_s=10)
    uid, cwd, home, *env = result.stdout.split()
    assert result.exit_code == 4, result.stderr
    assert int(uid) >= 1000 and cwd == home == "/scratch"
    assert env == ["HOME=/scratch", "PATH=/usr/local/bin:/usr/bin:/bin", "PWD=/scratch"]


@needs_sandbox
def test_an_argv_runs_as_is_and_a_missing_command_exits_127():
    assert run_sandboxed(["echo", "a b"], timeout_s=10).stdout == "a b\n"
    missing = run_sandboxed(["no-such-command"], timeout_s=10)
    assert missing.exit_code == 127 and "no-such-command" in missing.stderr


def test_bad_arguments_name_what_is_valid():
    with pytest.raises(OmrlError, match="unknown language 'ruby'; valid: python, shell"):
        run_sandboxed("puts 1", language="ruby")
    with pytest.raises(OmrlError, match="timeout_s must be positive"):
        run_sandboxed("print(1)", timeout_s=0)


# --- escapes that must fail ------------------------------------------------------------------------


@needs_sandbox
def test_host_files_cannot_be_read(tmp_path):
    token = secrets.token_hex(16)
    secret = tmp_path / "secret.txt"
    secret.write_text(token)
    secret.chmod(0o644)  # readable by every user: only its absence from the sandbox protects it
    tmp_path.chmod(0o755)
    result = run_sandboxed(
        attempts(
            f"readme: open({str(README)!r}).read()",
            "shadow: open('/etc/shadow').read()",
            f"secret: print(open({str(secret)!r}).read())",
            f"init_root: open('/proc/1/root{secret}').read()",  # through the helper's root, which is the host's
            "root_home: os.listdir('/root/.ssh')",
        ),
        timeout_s=10,
    )
    assert token not in result.stdout
    assert outcomes(result) == {
        "readme": "FileNotFoundError",
        "shadow": "FileNotFoundError",
        "secret": "FileNotFoundError",
        "init_root": "FileNotFoundError",
        "root_home": "FileNotFoundError",
    }, result.stderr


@needs_sandbox
def test_nothing_outside_the_scratch_dir_can_be_written_and_the_scratch_dir_is_fresh(tmp_path):
    tmp_path.chmod(0o777)  # writable by every user: only its absence from the sandbox protects it
    result = run_sandboxed(
        attempts(
            f"host_tmp: open({str(tmp_path / 'pwned')!r}, 'w').write('x')",
            "root: open('/pwned', 'w').write('x')",
            "usr: open('/usr/pwned', 'w').write('x')",
            "etc: open('/etc/pwned', 'w').write('x')",
            "passwd: open('/etc/passwd', 'a').write('x')",
            "scratch: open('/scratch/mine', 'w').write('x')",
            "tmp: open('/tmp/mine2', 'w').write('x')",
        ),
        timeout_s=10,
    )
    assert outcomes(result) == {
        "host_tmp": "FileNotFoundError",
        "root": "OSError",
        "usr": "OSError",
        "etc": "OSError",
        "passwd": "PermissionError",  # read-only, or root's
        "scratch": "ok",
        "tmp": "ok",
    }, result.stderr
    assert list(tmp_path.iterdir()) == []
    assert run_sandboxed("ls -A /scratch", language="shell", timeout_s=10).stdout == ""  # "mine" is gone


@needs_sandbox
def test_it_has_no_capabilities_and_cannot_gain_any():
    result = run_sandboxed(
        "grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs)' /proc/self/status; unshare --user --map-root-user id",
        language="shell",
        timeout_s=10,
    )
    assert result.stdout.split() == ["CapPrm:", "0" * 16, "CapEff:", "0" * 16, "CapAmb:", "0" * 16, "NoNewPrivs:", "1"]
    assert "Operation not permitted" in result.stderr  # no user namespace, the usual way out of a chroot


@needs_sandbox
def test_no_network_not_even_to_a_server_on_the_hosts_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the server does listen
        server.accept()[0].close()
        result = run_sandboxed(
            attempts(
                f"loopback: socket.create_connection(('127.0.0.1', {port}), timeout=3)",
                "dns: socket.getaddrinfo('pypi.org', 443)",
                "localhost: socket.getaddrinfo('localhost', 80)",
                "internet: socket.create_connection(('1.1.1.1', 53), timeout=3)",
            ),
            timeout_s=10,
        )
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing from the sandbox ever arrived
    assert outcomes(result) == {
        "loopback": "OSError",
        "dns": "gaierror",
        "localhost": "gaierror",
        "internet": "OSError",
    }, result.stderr


@needs_sandbox
def test_processes_are_limited_and_none_outlives_its_run():
    marker = f"61.{secrets.randbelow(10**9)}"  # a sleep length no other process uses
    code = (
        "import os\nn = 0\n"
        "while n < 100:\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        print(n, type(e).__name__)\n        break\n"
        f"    if pid == 0:\n        os.execv('/bin/sleep', ['sleep', {marker!r}])\n"
        "    n += 1\n"
    )
    result = run_sandboxed(code, max_processes=8, timeout_s=10)
    forked, error = result.stdout.split()
    assert 0 < int(forked) < 8 and error == "BlockingIOError", result.stderr
    assert host_processes_with(marker) == []  # the sleeping children died with the run


@pytest.mark.slow  # a stress test: a fork bomb
@needs_sandbox
def test_a_fork_bomb_is_contained_and_the_machine_survives():
    marker = f"bomb-{secrets.token_hex(8)}"  # in every bomb process's command line
    bomb = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    started = time.monotonic()
    result = run_sandboxed([sandbox.sandbox_python(), "-c", bomb], max_processes=16, timeout_s=3)
    assert result.timed_out and result.killed_reason == "timeout"
    assert time.monotonic() - started < 3 + 3
    assert host_processes_with(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


@needs_sandbox
def test_allocating_2_gb_fails():
    result = run_sandboxed("b = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256, timeout_s=10)
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert result.exit_code == 1


@needs_sandbox
def test_the_memory_limit_holds_for_the_run_as_a_whole_not_each_process():
    """Four processes of 100 MB each would be 400 MB: with memory_mb=256 for the run, none gets it;
    a share of the run's memory (256 / 4 = 64 MB a process) is what each may have."""
    code = (
        "import os\n"
        "def grab(mb):\n"
        "    try:\n        b = bytearray(mb * 2**20)\n        return 'ok'\n"
        "    except MemoryError:\n        return 'MemoryError'\n"
        "for mb in (100, 20):\n"
        "    children = []\n"
        "    for _ in range(3):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n            os._exit(0 if grab(mb) == 'ok' else 1)\n"
        "        children.append(pid)\n"
        "    mine = grab(mb)\n"
        "    held = sum(os.waitstatus_to_exitcode(os.waitpid(c, 0)[1]) == 0 for c in children)\n"
        "    print(mb, mine, held)\n"
    )
    result = run_sandboxed(code, memory_mb=256, max_processes=4, timeout_s=20)
    assert result.stdout.splitlines() == ["100 MemoryError 0", "20 ok 3"], result.stderr
    # one process may have it all when the run asks for no other
    alone = run_sandboxed("b = bytearray(200 * 2**20)\nprint('allocated')", memory_mb=256, max_processes=1)
    assert alone.stdout == "allocated\n", alone.stderr


# Memory that is in no process's address space: files in memory, 15 MB each (under the file-size
# limit), opened by each of these; the program writes 600 MB and prints how much it wrote.
IN_MEMORY_FILES = {
    "memfd": "lambda n: os.memfd_create(f'f{n}')",
    "dev_shm": "lambda n: os.open(f'/dev/shm/f{n}', os.O_CREAT | os.O_WRONLY)",
    "sysv_shm": "sysv_segment",
}
SYSV_SEGMENT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def sysv_segment(n):  # a System V shared memory segment, filled through a mapping that is then dropped
    segment = libc.shmget(0, 15 * 2**20, 0o1600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 15 * 2**20)
    libc.shmdt(ctypes.c_void_p(address))
    return None
"""
HOG = """
import os
written = 0
try:
    while written < 600:
        fd = open_file(written) if written % 15 == 0 else fd
        if fd is not None:
            os.write(fd, b'x' * 2**20)
        written += 1
finally:
    print(written, flush=True)
"""


def shared_memory_mb() -> float:
    """The host's shared memory (tmpfs, memfd, System V), in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


@needs_sandbox
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no_cgroup"])
@pytest.mark.parametrize("kind", IN_MEMORY_FILES)
def test_memory_in_files_counts_against_the_run_and_the_host_never_holds_more(kind, cgroup, monkeypatch):
    """Rlimits bound address space, which in-memory files are not in: the run as a whole is bounded,
    by a memory cgroup where the host lets omrl make one, else by making no such file possible."""
    if not cgroup:
        monkeypatch.setattr(MemoryCgroup, "create", lambda limit_bytes: None)
    elif (probe := MemoryCgroup.create(2**30)) is None:
        pytest.skip("this host lets omrl make no memory cgroup")
    else:
        probe.remove()
    code = SYSV_SEGMENT + f"open_file = {IN_MEMORY_FILES[kind]}\n" + HOG
    peak, before = [], shared_memory_mb()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_sandboxed, code, memory_mb=256, disk_mb=32, timeout_s=30)
        while not running.done():
            peak.append(shared_memory_mb())
            time.sleep(0.02)
    result = running.result()
    assert result.stdout.strip() != "600", f"{kind}: the program wrote 600 MB ({result})"
    assert result.exit_code != 0 or result.stderr  # an error of the code: MemoryError, ENOSPC or killed
    # the run may hold up to its limit (256 + 32 MB); the host's Shmem is every process's, so some slack.
    # Unbounded, the program holds all 600 MB
    grew = max(peak) - before
    assert grew < 256 + 32 + 96, f"{kind}: the host's shared memory grew by {grew:.0f} MB"


@needs_sandbox
def test_a_memory_share_too_small_to_run_a_process_is_refused():
    with pytest.raises(
        OmrlError,
        match=r"memory_mb=256 shared by max_processes=16 leaves 16.0 MB a process, under "
        r"the 32 MB a process needs; valid: memory_mb >= 512 for 16 processes",
    ):
        run_sandboxed("print(1)", memory_mb=256, max_processes=16)


@needs_sandbox
def test_files_are_cut_at_the_file_size_limit_and_the_scratch_dir_at_its_size():
    one_file = run_sandboxed(
        "import os\nwith open('big', 'wb') as f:\n"
        "    try:\n        while True:\n            f.write(b'x' * 2**20); f.flush()\n"
        "    except OSError as e:\n        print(os.strerror(e.errno))\n"
        "print(os.path.getsize('big'))",
        max_file_mb=4,
        timeout_s=10,
    )
    assert one_file.stdout.split("\n")[:2] == ["File too large", str(4 * 2**20)], one_file.stderr
    # a program that keeps the default SIGXFSZ is killed by it
    shell = run_sandboxed("exec head -c 10000000 /dev/zero > big", language="shell", max_file_mb=2, timeout_s=10)
    assert shell.killed_reason == "file_size"
    many_files = run_sandboxed(
        "import os\ntotal = 0\n"
        "try:\n    for i in range(100):\n        with open(f'f{i}', 'wb') as f:\n"
        "            for _ in range(3):\n                f.write(b'x' * 2**20); f.flush(); total += 2**20\n"
        "except OSError as e:\n    print(os.strerror(e.errno), total)",
        max_file_mb=4,
        disk_mb=8,
        timeout_s=10,
    )
    error, total = many_files.stdout.rsplit(" ", 1)
    assert error == "No space left on device" and int(total) <= 8 * 2**20, many_files.stderr


@needs_sandbox
def test_an_infinite_loop_is_killed_at_the_wall_time_limit():
    started = time.monotonic()
    result = run_sandboxed("import time\nwhile True: time.sleep(0.1)", timeout_s=1)
    assert result.timed_out and result.killed_reason == "timeout" and result.exit_code == -9
    assert time.monotonic() - started < 1 + 2
    started = time.monotonic()  # closing stdout and stderr does not stop the clock
    result = run_sandboxed("exec >&- 2>&-; sleep 30", language="shell", timeout_s=1)
    assert result.timed_out and time.monotonic() - started < 1 + 2


@needs_sandbox
def test_a_busy_loop_is_killed_at_the_cpu_time_limit():
    result = run_sandboxed("while True: pass", cpu_time_s=1, timeout_s=10)
    assert not result.timed_out and result.killed_reason == "cpu_time"


@needs_sandbox
def test_output_is_capped_and_says_so():
    result = run_sandboxed("print('x' * 1_000_000)", max_output_bytes=1000, timeout_s=10)
    assert result.truncated and result.exit_code == 0
    assert result.stdout.startswith("x" * 1000) and "truncated" in result.stdout and len(result.stdout) < 1200


# --- failing closed ----------------------------------------------------------------------------------


def test_without_unshare_it_refuses_to_run(monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: None)
    with pytest.raises(OmrlError, match="needs util-linux's `unshare`"):
        run_sandboxed("print(1)")


def test_without_root_it_refuses_to_run(monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(OmrlError, match="needs root .* running as uid 1000"):
        run_sandboxed("print(1)")


@needs_sandbox
def test_when_namespaces_are_refused_it_raises_and_runs_nothing(monkeypatch, tmp_path):
    fake = tmp_path / "unshare"  # what unshare does in a container that forbids namespaces
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: str(fake))
    with pytest.raises(OmrlError, match="could not be set up.*Operation not permitted"):
        run_sandboxed(f"open({str(tmp_path / 'ran')!r}, 'w')")
    assert not (tmp_path / "ran").exists()


@needs_sandbox
def test_a_namespace_left_out_makes_the_helper_refuse(monkeypatch, tmp_path):
    flags = tuple(f for f in process.UNSHARE_FLAGS if f != "--net")
    monkeypatch.setattr(process, "UNSHARE_FLAGS", flags)
    with pytest.raises(OmrlError, match="shares the caller's net namespace"):
        run_sandboxed("print(1)")
