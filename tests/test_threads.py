"""torch's thread count follows the free cores, or OMRL_NUM_THREADS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omrl.errors import ConfigError
from omrl.threads import configure_threads, free_cores


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_omrl_num_threads_decides_when_set(monkeypatch):
    monkeypatch.setenv("OMRL_NUM_THREADS", "1")
    assert configure_threads() == 1 == torch.get_num_threads()


def test_a_bad_omrl_num_threads_is_named(monkeypatch):
    monkeypatch.setenv("OMRL_NUM_THREADS", "many")
    with pytest.raises(ConfigError, match="OMRL_NUM_THREADS must be a whole number >= 1, got 'many'"):
        configure_threads()


def test_busy_cores_and_processes_launched_together_get_fewer_threads(monkeypatch):
    monkeypatch.delenv("OMRL_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("os.getloadavg", lambda: (3.2, 0.0, 0.0))
    assert free_cores() == 5
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert configure_threads() == 2
    monkeypatch.setattr("os.getloadavg", lambda: (40.0, 0.0, 0.0))
    assert configure_threads() == 1  # never 0


def test_huge_pages_are_asked_for_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    configure_threads()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    configure_threads()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"


@pytest.mark.slow
def test_torch_gets_huge_pages_when_configured_before_it_loads():
    """What the CLI does (configure_threads before any import of torch) gives torch's large blocks huge
    pages wherever the kernel offers them (THP "always" or "madvise")."""
    script = (
        "import omrl.threads; omrl.threads.configure_threads(); import torch\n"
        "x = torch.zeros(64 * 2**20 // 4); x += 1\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    huge_kib = int(
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    )
    offered = "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    assert (huge_kib >= 32 * 1024) if offered else (huge_kib == 0)
