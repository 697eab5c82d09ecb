"""Peak resident memory of one configuration, each in a fresh process (Linux): helpers the
memory benchmarks share (``update_throughput.py``, ``memory_sweep.py``).

A fresh process per configuration keeps one configuration's freed-but-kept allocator pages
out of the next one's numbers. Inside it, ``reset_peak`` lowers the kernel's high-water mark
(VmHWM) to the current RSS, so the VmHWM read after a phase is that phase's own peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

GIB = 2**30


def memory_status() -> dict[str, int]:
    """This process's resident set now (VmRSS), its high-water mark (VmHWM) and the resident set's
    anonymous and file-backed parts (RssAnon, RssFile: weights mapped from a safetensors file), in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak() -> None:
    """Lower VmHWM to the current RSS (Linux >= 4.0), so the next peak is this pass's own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_while(run):
    """``run()``'s result, the RSS just before it and the peak RSS while it ran (bytes)."""
    reset_peak()
    before = memory_status()["VmRSS"]
    result = run()
    return result, before, memory_status()["VmHWM"]


def worker_spec(args: argparse.Namespace, **spec: Any) -> dict:
    """What a worker reads (:func:`run_worker`): the model, its overrides and the threads, then ``spec``."""
    return {"model": args.model, "overrides": args.overrides, "threads": args.threads, **spec}


def parse_args(parser: argparse.ArgumentParser, worker: Callable[[str], None]) -> argparse.Namespace | None:
    """``parser``'s arguments, or None when :func:`run_worker` started the script: it then ran
    ``worker(spec file)``, given as the hidden ``--memory-worker``, and the script is done."""
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        worker(args.memory_worker)
        return None
    return args


def run_worker(script: str, spec: dict, spec_path: Path, timeout: float | None = None) -> dict:
    """Run ``script --memory-worker <spec file>`` in a fresh Python; its last stdout line, as JSON.

    A worker that fails raises SystemExit with the end of its stderr; one that runs past
    ``timeout`` seconds is killed and comes back as ``{"timed_out": timeout}``.
    """
    spec_path.write_text(json.dumps(spec))
    try:
        done = subprocess.run(
            [sys.executable, script, "--memory-worker", str(spec_path)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"timed_out": timeout}
    if done.returncode:
        raise SystemExit(f"memory worker {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
