"""How torch computes on the CPU: with the cores actually free, unless ``OMRL_NUM_THREADS`` says, and
with huge pages for its large blocks.

On a busy machine more threads than free cores make every kernel wait on the others:
measured on 2 cores under load, a decode step was 3x slower with 2 threads than with 1.
Processes launched together (``accelerate launch``) share the cores between them.

torch's CPU allocator hands each large block back to the system when it is freed, so the next one
is faulted in again page by page; the RL update allocates a vocabulary-sized embedding gradient per
micro-batch. In 2 MiB pages instead of 4 KiB ones, allocating and filling SmolLM2's (113 MB) took
26 ms instead of 85 on one core (docs/performance.md). torch reads ``THP_MEM_ALLOC_ENABLE`` once,
at its first allocation, so it is set before torch loads; a value the environment gives is kept.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable

from omrl.errors import ConfigError


def free_cores() -> int:
    """Cores this process may use, less the load other processes put on them (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
    return max(1, cores - busy)


def configure_threads() -> int:
    """Set torch's intra-op thread count (now, or when torch loads) and return it: ``OMRL_NUM_THREADS`` when set, else the free
    cores divided among the processes launched together on this machine. Ask for huge pages too
    (see the module docstring; they take effect only when torch has not loaded yet)."""
    asked = os.environ.get("OMRL_NUM_THREADS", "").strip()
    if asked:
        if not asked.isdigit() or int(asked) < 1:
            raise ConfigError(f"OMRL_NUM_THREADS must be a whole number >= 1, got {asked!r}")
        threads = int(asked)
    else:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        threads = max(1, free_cores() // local_processes)
    # torch reads both when it loads, so a command that never computes need not import it
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    return threads


def on_daemon_thread(fn: Callable[[], Any], name: str, gate: Any = None) -> Future:
    """``fn()`` on a daemon thread of its own (entered through ``gate``, a context manager such as a
    semaphore, when given), its result or exception in the returned Future: a call stuck for good is
    left behind without holding up the process's exit, as an executor's joined threads would."""
    future: Future = Future()

    def run() -> None:
        with gate if gate is not None else contextlib.nullcontext():
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter, as an executor does
                future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
