"""Which process of a launch this is (``accelerate launch`` and torchrun set ``RANK`` and ``WORLD_SIZE``):
torch-free, so the command line reads it for its messages before, or without, importing torch."""

from __future__ import annotations

import os


def process_rank() -> int:
    """This process's rank: 0 in a run of one process."""
    return int(os.environ.get("RANK", "0") or 0)


def world_size() -> int:
    """How many processes the run has: 1 without a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_main_process() -> bool:
    """True in a single process, and in process 0 of several (before any process group exists)."""
    return process_rank() == 0


def process_label() -> str:
    """``"process 1 of 2: "`` under a launch, where each process may say its own error; "" in one process."""
    return f"process {process_rank()} of {world_size()}: " if world_size() > 1 else ""
