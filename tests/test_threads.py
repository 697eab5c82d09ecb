"""torch's thread count follows the free cores, or OMRL_NUM_THREADS."""

from __future__ import annotations

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
