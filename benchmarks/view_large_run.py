"""How fast ``omrl view`` opens a large run: 10,000 episodes of real tiny-model trajectories.

    python benchmarks/view_large_run.py [--episodes 10000] [--source rollout.parquet] [--rounds 3] [--json out.json]
    python benchmarks/view_large_run.py --episodes 200 --layouts single --rounds 1 --json /tmp/view.json  # a smoke run

The run is synthesized from a real trajectory file (by default one ``omrl rollout --env
gridworld --model tiny`` writes first, about 2,000 tokens an episode): its episodes repeated
to ``--episodes`` rows with fresh task ids, groups, rewards and success, plus a 500-step
metrics.jsonl and a config.yaml naming the tiny model (whose tokenizer the page uses). Three
layouts of the same episodes:

- ``single``: one parquet file, one row group (what ``write_episodes`` writes today);
- ``single-rg64``: one parquet file in row groups of 64 episodes;
- ``per-step``: 100 files ``rollouts/step-NNNNNN.parquet`` of 100 episodes (a trainer saving
  each step's rollout).

For each, a fresh Python process opens the run and serves it (what ``omrl view RUN`` does
after the CLI has started), and the timings are:

- ``index``: finding the files and reading every episode's summary, in that process;
- ``open``: from starting that process to the episode list showing its first rows in
  headless Chromium (when Chromium and Playwright are installed; else to the first page of
  the list fetched over HTTP). The target is under 3 s;
- ``overview``: from navigating to the page to its learning-curve SVGs drawn;
- ``episode cold`` / ``episode warm``: fetching one episode in full (its tokens decoded) the
  first time its row group is read, and again from another row of the same group;
- ``filter``: a filtered, sorted page of the list (``success=won&sort=-reward``).

Each timing is measured ``--rounds`` times and reported as median / min (the machine's load
average is printed too: on a shared machine it moves the numbers more than anything else).
``omrl`` itself loads every plugin before running any command; ``cli start`` reports what
that costs (``omrl --help``), since a user typing ``omrl view`` waits for it too.

The record, machine included (its load average as the run starts; ``load_after`` as it ends), goes
to ``--json`` (default ``benchmarks/results/view_large_run.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _results import default_json, machine, save_json

SERVER = r"""
import json, sys, time
t0 = time.perf_counter()
from omrl.view import open_run
from omrl.view.server import make_server
store = open_run(sys.argv[1])
index = time.perf_counter() - t0
server = make_server(store, "127.0.0.1", 0)
print(json.dumps({"url": server.url, "index_s": index, "episodes": len(store.summaries)}), flush=True)
server.serve_forever()
"""


def make_source(workdir: Path) -> Path:
    """A real trajectory file from the tiny model (about 20 s on 2 CPU cores)."""
    out = workdir / "source" / "rollout.parquet"
    subprocess.run(
        [
            "omrl",
            "rollout",
            "--env",
            "gridworld",
            "--model",
            "tiny",
            "--num-tasks",
            "4",
            "--group-size",
            "2",
            "-o",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def synthesize(source: Path, episodes: int, seed: int = 0):
    """The source's episodes repeated to ``episodes`` rows, with varied tasks, groups and rewards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = pq.read_table(source)
    table = base.take(pa.array([i % base.num_rows for i in range(episodes)]))
    rng = random.Random(seed)
    group_size = 8
    won = [rng.random() < 0.3 for _ in range(episodes)]
    reward = [float(w) + rng.gauss(0, 0.2) for w in won]
    updates = {
        "task_id": pa.array([i // group_size for i in range(episodes)], pa.int64()),
        "group": pa.array([(i // group_size) % 16 for i in range(episodes)], pa.int64()),
        "sample": pa.array([i % group_size for i in range(episodes)], pa.int64()),
        "won": pa.array(won),
        "score": pa.array([float(w) for w in won]),
        "rewards": pa.array([[("goal", [r]), ("total", [r])] for r in reward], base.schema.field("rewards").type),
    }
    for name, column in updates.items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table.replace_schema_metadata(base.schema.metadata)


def write_run(table, root: Path, layout: str) -> None:
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    (root / "config.yaml").write_text("command: train\nmodel:\n  name: tiny\nalgorithm:\n  advantage: grpo\n")
    rng = random.Random(1)
    with (root / "metrics.jsonl").open("w") as f:
        for step in range(1, 501):
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "reward": 0.3 + step / 1000 + rng.gauss(0, 0.05),
                        "success": step / 600,
                        "kl": rng.random() * 0.01,
                        "entropy": 2 - step / 500,
                        "loss": rng.gauss(0, 1),
                        "response_tokens": 280 + rng.gauss(0, 10),
                        "step_time": 5 + rng.random(),
                        "tokens_per_s": 350 + rng.gauss(0, 5),
                        "time": 1.7e9 + step,
                    }
                )
                + "\n"
            )
    if layout == "single":
        pq.write_table(table, root / "rollouts.parquet")
    elif layout == "single-rg64":
        pq.write_table(table, root / "rollouts.parquet", row_group_size=64)
    else:
        (root / "rollouts").mkdir()
        per_file = 100
        for step, start in enumerate(range(0, table.num_rows, per_file), start=1):
            pq.write_table(table.slice(start, per_file), root / "rollouts" / f"step-{step:06d}.parquet")


def get_json(url: str) -> tuple[float, object]:
    started = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        body = json.loads(response.read())
    return time.perf_counter() - started, body


def browser():
    """(playwright, browser) or (None, None) when Playwright or Chromium is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, None
    if chromium is None:
        return None, None
    playwright = sync_playwright().start()
    return playwright, playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])


def measure(root: Path, chrome) -> dict[str, float]:
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(server.stdout.readline())
        url = info["url"]
        result = {"index": info["index_s"], "episodes": info["episodes"]}
        if chrome is not None:
            page = chrome.new_page()
            page.goto(url + "#/episodes")
            page.wait_for_selector("table.list tbody tr")
            result["open"] = time.perf_counter() - started
            result["open_what"] = "episode list rendered in Chromium"
            shown = time.perf_counter()
            page.goto(url + "#/overview")
            page.wait_for_selector("figure.plot path.series", state="attached")
            result["overview"] = time.perf_counter() - shown
            page.close()
        else:
            get_json(url + "api/run")
            get_json(url + "api/episodes")
            result["open"] = time.perf_counter() - started
            result["open_what"] = "overview and first list page fetched over HTTP (no browser)"
        # the middle episode (5000 of 10,000), rounded down to a multiple of 8 so that the next one is in
        # the same row group of 64 and the same file of 100
        middle = info["episodes"] // 2 // 8 * 8
        result["episode_cold"], _ = get_json(url + f"api/episode/{middle}")
        result["episode_warm"], _ = get_json(url + f"api/episode/{middle + 1}")
        result["filter"], page_body = get_json(url + "api/episodes?success=won&sort=-reward")
        result["filter_matches"] = page_body["total"]
        return result
    finally:
        server.terminate()
        server.wait()


TIMINGS = ("index", "open", "overview", "episode_cold", "episode_warm", "filter")


def _spread(rounds: list[dict], key: str) -> str:
    values = sorted(r[key] for r in rounds)
    return f"{statistics.median(values):.2f}/{values[0]:.2f} s"


def cli_start() -> float:
    started = time.perf_counter()
    subprocess.run(["omrl", "--help"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--source", type=Path, help="A trajectory parquet to repeat (default: a fresh tiny rollout).")
    parser.add_argument("--layouts", default="single,single-rg64,per-step")
    parser.add_argument("--rounds", type=int, default=3, help="Measurements per layout (median and min reported).")
    parser.add_argument("--json", type=Path, default=default_json("view_large_run"), help="Where the record goes.")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="omrl-view-bench-"))
    playwright, chrome = browser()
    try:
        source = args.source or make_source(workdir)
        table = synthesize(source, args.episodes)
        results = {
            "benchmark": "view_large_run",
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": machine(),
            "episodes": args.episodes,
            "cli_start": cli_start(),
            "layouts": {},
        }
        for layout in args.layouts.split(","):
            root = workdir / layout
            write_run(table, root, layout)
            size = sum(p.stat().st_size for p in root.rglob("*.parquet")) / 1e6
            rounds = [measure(root, chrome) for _ in range(args.rounds)]
            results["layouts"][layout] = {"parquet_mb": round(size, 1), "rounds": rounds}
        results["load_after"] = os.getloadavg()[0]
        print(
            f"{args.episodes} episodes, {args.rounds} rounds (median / min); {results['machine']['cpus']} CPUs, load "
            f"average {results['machine']['load_average'][0]:.1f} -> {results['load_after']:.1f}; `omrl --help` (CLI start, plugins "
            f"loaded): {results['cli_start']:.2f} s"
        )
        for layout, r in results["layouts"].items():
            cells = "  ".join(f"{key} {_spread(r['rounds'], key)}" for key in TIMINGS if key in r["rounds"][0])
            print(f"{layout:12} {r['parquet_mb']:6.1f} MB  {cells}")
        print(f"open = {next(iter(results['layouts'].values()))['rounds'][0]['open_what']}; target: under 3 s")
        save_json(args.json, results)
        print(f"wrote {args.json}")
    finally:
        if chrome is not None:
            chrome.close()
            playwright.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
