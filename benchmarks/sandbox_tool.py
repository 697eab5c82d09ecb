"""What a sandboxed python tool call costs: sandbox start, call latency and calls/s.

    python benchmarks/sandbox_tool.py [--calls 40] [--pace 0.2] [--json out.json]

Measured on this machine, medians (latency) and totals (calls/s):

- **start**: a one-shot `run_sandboxed("print(6 * 7)")` (set up the namespaces and the chroot, start
  Python, run, tear down), and an `Interpreter` coming up. Peer: a bare ``python -c`` subprocess,
  what a fresh process costs with no sandbox at all.
- **persistent**: calls in one started interpreter (the ``persistent=true`` tool): the call alone.
- **fresh, cold**: a new interpreter for each call, started on demand (``warm=0``).
- **fresh, warm**: a new interpreter for each call from a pool of ``warm`` started ones (the
  default tool), called at an agent's pace (one call every ``--pace`` s, the time a model takes to
  write the next call) and back to back from 4 threads (the rollout steps io-bound envs from
  threads). Reported: warm / cold latency (lower is better) and calls/s.
- **env step**: ``code:reasoning-gym:products`` stepping ``python[print(1663 * 5242)]`` (the
  default fresh tool, warm pool), at the agent's pace.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

from _results import default_json, machine, save_json

from omrl import registry
from omrl.envs import create_env
from omrl.sandbox import run_sandboxed
from omrl.sandbox.interpreter import Interpreter, InterpreterPool

CODE = "print(1663 * 5242)"


def timed(fn, n: int, pace: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        if pace:
            time.sleep(pace)
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def fresh_call(pool: InterpreterPool) -> None:
    interpreter = pool.take()
    assert interpreter.run(CODE).stdout == "8717446\n"
    interpreter.close()


def threaded_rate(fn, threads: int, per_thread: int) -> float:
    """Calls per second with ``threads`` callers back to back."""

    def work():
        for _ in range(per_thread):
            fn()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * per_thread / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--pace", type=float, default=0.2, help="seconds between an agent's calls")
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n = args.calls
    ms = lambda xs: round(1000 * statistics.median(xs), 2)  # noqa: E731

    bare = timed(lambda: subprocess.run([sys.executable, "-I", "-c", CODE], check=True, capture_output=True), n)
    one_shot = timed(lambda: run_sandboxed(CODE, timeout_s=10), n)
    starts = timed(lambda: Interpreter().close(), n)
    with Interpreter() as python:
        persistent = timed(lambda: python.run(CODE), n)
        persistent_rate = n * 5 / sum(timed(lambda: python.run(CODE), n * 5))

    cold_pool = InterpreterPool(0)
    cold = timed(lambda: fresh_call(cold_pool), n, args.pace)
    cold_rate = threaded_rate(lambda: fresh_call(cold_pool), 4, n // 4)
    warm_pool = InterpreterPool(args.warm)
    time.sleep(2)  # let it fill
    warm = timed(lambda: fresh_call(warm_pool), n, args.pace)
    warm_rate = threaded_rate(lambda: fresh_call(warm_pool), 4, n // 4)
    warm_pool.close()

    env = create_env(registry.envs.get("code:reasoning-gym:products"), {"warm": args.warm}, "code")
    env.reset(0)
    time.sleep(2)
    steps = timed(lambda: env.step(f"python[{CODE}]"), min(n, 4), args.pace)  # max_calls=4 an episode
    for _ in range(n // 4 - 1):
        env.reset(0)
        steps += timed(lambda: env.step(f"python[{CODE}]"), 4, args.pace)
    env.close()

    result = {
        "machine": machine(),
        "settings": vars(args),
        "start_ms": {
            "bare_python_subprocess": ms(bare),
            "run_sandboxed_one_shot": ms(one_shot),
            "interpreter": ms(starts),
        },
        "call_ms": {
            "persistent": ms(persistent),
            "fresh_cold": ms(cold),
            "fresh_warm": ms(warm),
            "env_step_warm": ms(steps),
        },
        "calls_per_s": {
            "persistent": round(persistent_rate, 1),
            "fresh_cold_4_threads": round(cold_rate, 1),
            "fresh_warm_4_threads": round(warm_rate, 1),
        },
        "ratios": {
            "one_shot_vs_bare_python": round(statistics.median(one_shot) / statistics.median(bare), 2),
            "fresh_warm_vs_cold_latency": round(statistics.median(warm) / statistics.median(cold), 3),
        },
    }
    for key in ("start_ms", "call_ms", "calls_per_s", "ratios"):
        print(f"{key}: {result[key]}")
    path = args.json or default_json("sandbox_tool")
    save_json(path, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
