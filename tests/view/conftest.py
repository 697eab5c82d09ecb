"""Runs for the viewer's tests: small hand-made ones (fast), and a real one made by the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>'


def make_episode(task, sample, won, reward, *, observation="goal: 1 up.", end="done", group=None, node_ids=()):
    """An Episode with two turns and a token sequence: prompt, then 3 sampled tokens per turn. ``group``
    defaults to ``task``; ``node_ids`` (one per turn) make it a path of a search tree."""
    from omrl.data.trajectory import Episode, Turn

    ids, mask, logprobs, turns = list(range(10, 20)), [0] * 10, [0.0] * 10, []
    for i in range(2):
        start = len(ids)
        ids += [100 + i, 200 + i, 300 + i]
        mask += [1, 1, 1]
        logprobs += [-0.5, -1.25, -2.0]
        node = node_ids[i] if node_ids else -1
        parent = (node_ids[i - 1] if i else 0) if node_ids else -1
        turns.append(
            Turn(
                observation=observation,
                response=f"Think: go.\nAct: up{i}",
                action=f"up{i}",
                format_ok=True,
                reward=reward if i == 1 else 0.0,
                done=i == 1,
                info={"search": {"strategy": "beam", "score": 0.5}} if node_ids else {},
                span=(start, start + 3),
                node_id=node,
                parent_id=parent,
            )
        )
        ids += [50, 51]  # the observation after the turn
        mask += [0, 0]
        logprobs += [0.0, 0.0]
    return Episode(
        "gridworld",
        task,
        "train",
        "Walk to the goal.",
        turns=turns,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=10,
        won=won,
        score=float(won),
        end_reason=end,
        group=task if group is None else group,
        sample=sample,
        rewards={"goal": [0.0, reward], "total": [0.0, reward]},
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": observation}],
    )


def small_episodes() -> list:
    """Three tasks x two samples: task 0 one win, task 1 none, task 2 an env error."""
    return [
        make_episode(0, 0, True, 1.0),
        make_episode(0, 1, False, 0.0),
        make_episode(1, 0, False, 0.0, end="max_turns"),
        make_episode(1, 1, False, 0.2, end="max_turns"),
        make_episode(2, 0, False, 0.0, end="env_error"),
        make_episode(2, 1, True, 1.0),
    ]


def write_metrics(path: Path, steps: int = 3, tail: str = "") -> None:
    lines = [
        json.dumps(
            {
                "step": s,
                "reward": 0.1 * s,
                "reward_goal": 0.05 * s,
                "success": s / 10,
                "kl": 0.01,
                "entropy": 2.0,
                "step_time": 1.5,
                "tokens_per_s": 300.0,
                "time": 1.7e9 + s,
            }
        )
        for s in range(1, steps + 1)
    ]
    path.write_text("\n".join(lines) + "\n" + tail)


@pytest.fixture
def small_run(tmp_path) -> Path:
    """A run directory: config, metrics, one trajectory parquet (6 episodes)."""
    from omrl.data.trajectory import write_episodes

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "model:\n  name: tiny\nalgorithm:\n  advantage: grpo\n  norm_adv_by_std: true\n  eps: 1.0e-06\n"
    )
    write_metrics(run / "metrics.jsonl")
    write_episodes(small_episodes(), run / "rollout.parquet")
    return run


def _omrl(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "omrl", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMRL_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A real run: 2 GRPO steps of the tiny model on gridworld, plus a rollout written into it (~50 s)."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    # the run's own step rollouts are left out, so the list holds exactly the rollout's 8 episodes
    _omrl(
        *"train --algo grpo --env gridworld --model tiny --steps 2 --output-dir".split(),
        str(run),
        "logging.save_rollouts=false",
    )
    _omrl(*"rollout --env gridworld --model tiny --num-tasks 4 --group-size 2 -o".split(), str(run / "rollout.parquet"))
    return run


@pytest.fixture(scope="module")
def chromium():
    """A headless Debian Chromium driven by Playwright. Missing either fails the test (the README's
    test command installs both); OMRL_ALLOW_NO_BROWSER=1 skips instead, for machines without apt.
    One per module: Playwright's sync API holds an event loop on the main thread while it runs, which
    would break every later test that starts its own (asyncio.run, an agent framework's run_sync)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if binary is None or sync_playwright is None:
        why = (
            "needs Debian's Chromium (apt-get install -y chromium) and Playwright (pip install playwright); "
            f"found chromium={binary}, playwright={sync_playwright is not None}"
        )
        if os.environ.get("OMRL_ALLOW_NO_BROWSER") == "1":
            pytest.skip(why)
        pytest.fail(why)
    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox"])
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()
