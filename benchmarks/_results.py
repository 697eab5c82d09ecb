"""Where the benchmarks write their JSON, and the machine each record names.

Every benchmark writes its record, with :func:`machine`, to ``benchmarks/results/<name>.json``
unless ``--json`` says otherwise (``search_budget.py``: ``benchmarks/results/search_budget/<env>/``,
unless ``--out`` does), so running one refreshes the numbers the docs quote; a trial run should
pass ``--json /tmp/...`` to leave the committed records alone. A record is written whole or not at
all (a temporary sibling, then a rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

from omrl.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def default_json(name: str) -> Path:
    """``benchmarks/results/<name>.json``."""
    return RESULTS / f"{name}.json"


def machine(threads: int | None = None) -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores this process may use, memory, versions."""
    import torch
    import transformers

    cpu = next(
        (line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    mem_kib = next((int(line.split()[1]) for line in _lines("/proc/meminfo") if line.startswith("MemTotal:")), 0)
    out = {
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 2**20, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if threads is not None:
        out["threads"] = threads
    return out


def save_json(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` as indented JSON, whole or not at all."""
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def save_comparison(args: argparse.Namespace, name: str, target: str, results: dict[str, Any]) -> None:
    """Write a comparison's record to ``--json`` (default ``benchmarks/results/<name>.json``): its name,
    target, command line and machine (``--threads``), then ``results``; and say where it went."""
    path = args.json or default_json(name)
    record = {"benchmark": name, "target": target, "args": {**vars(args), "json": str(path)}}
    save_json(path, {**record, "machine": machine(args.threads), **results})
    print(f"wrote {path}")


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.readlines()
    except OSError:
        return []
