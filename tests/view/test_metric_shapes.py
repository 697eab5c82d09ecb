"""The run overview in a real Chromium draws every shape of metric a real run logs: constant, constant
but for the last bit (one PPO pass logs a ratio of 1 as 0.9999999999999998), NaN and infinities among
the values, one point, a range from 1e-12 to 1e12, all negative, and nothing finite at all (which its
chart says). Served and saved (``omrl view RUN --out``), with no error in the page's console."""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from omrl.view import open_run

from .conftest import small_episodes
from .test_browser import page_of, serving
from .test_page_and_server import cli

NAN, INF = float("nan"), float("inf")

# one metric per shape, each a panel of its own (no panel of omrl.view.metrics.PANELS takes these names)
SHAPES = {
    "pg_ratio_mean": [1.0, 1.0, 1.0, 0.9999999999999998, 1.0, 1.0],
    "big_near_constant": [1e9, 1e9 + 1e-7, 1e9, 1e9 + 1e-7, 1e9, 1e9],
    "float32_noise": [1.0, 0.99999994, 1.0, 1.0, 0.99999994, 1.0],
    "constant": [0.5] * 6,
    "with_nonfinite": [0.25, 0.3, NAN, 0.5, INF, -INF],
    "logged_once": [None, None, 3.0, None, None, None],
    "huge_range": [1e-12, 1e12, 1e3, 1e-6, 1.0, 5e11],
    "all_negative": [-3.0, -2.5, -4.0, -3.5, -2.0, -3.0],
    "never_finite": [NAN, INF, -INF, NAN, NAN, INF],
}
# the chart's box inside the SVG's viewBox (view.js: W 420, H 220, T 10, B 28)
WIDTH, HEIGHT, TOP, BOTTOM = 420, 220, 10, 220 - 28


def write_run(folder, shapes: dict[str, list], steps: int) -> None:
    """A run folder as training leaves it: config, a rollout, and ``metrics.jsonl`` with these series
    (None: the step does not log the key), NaN and infinities written as Python's json writes them."""
    from omrl.data.trajectory import write_episodes

    folder.mkdir()
    (folder / "config.yaml").write_text("model:\n  name: tiny\nalgorithm:\n  advantage: grpo\n")
    write_episodes(small_episodes(), folder / "rollout.parquet")
    lines = []
    for s in range(steps):
        record = {"step": s + 1, "reward": 0.1 * s, "time": 1.7e9 + s}
        record |= {key: values[s] for key, values in shapes.items() if values[s] is not None}
        lines.append(json.dumps(record) + "\n")
    (folder / "metrics.jsonl").write_text("".join(lines))


@contextmanager
def overview(chromium, run, how: str, tmp_path):
    """The run's overview page, served or saved with ``omrl view RUN --out``, in Chromium; on leaving,
    no error in its console (nor an uncaught one, which page_of checks)."""
    with page_of(chromium) as page:
        console: list[str] = []
        page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
        if how == "served":
            with serving(run) as url:
                page.goto(url)
                page.wait_for_selector("h2:has-text('Learning curves') ~ *, .problems", state="attached")
                yield page
        else:
            out = tmp_path / "page.html"
            result = CliRunner().invoke(cli(), ["view", str(run), "--out", str(out)])
            assert result.exit_code == 0, result.output
            page.goto(out.as_uri())
            page.wait_for_selector("h2:has-text('Learning curves') ~ *, .problems", state="attached")
            yield page
        assert console == [], f"errors in the page's console: {console}"


def check_charts(page, run, shapes: dict[str, list]) -> None:
    """Every panel of the run has its figure: a drawn chart with a few distinct y ticks inside its box
    and finite coordinates, or, where none of its values is finite, a note saying so."""
    assert "Could not" not in page.inner_text("main")
    panels = open_run(run).overview()["panels"]
    assert {p["name"] for p in panels} >= set(shapes)
    assert page.locator("figure.plot").count() == len(panels)
    for panel in panels:
        figure = page.locator(f"figure.plot[data-panel='{panel['name']}']")
        assert figure.count() == 1, panel
        finite = [
            k for k in panel["keys"] if any(isinstance(v, float) and math.isfinite(v) for v in shapes.get(k, [0.0]))
        ]
        if not finite:
            assert "Nothing to draw" in figure.locator(".plot-note").inner_text(), panel
            assert figure.locator("svg").count() == 0
            continue
        assert figure.locator(".plot-note").count() == 0, panel
        assert figure.locator("path.series, circle").count() >= 1, panel
        labels = figure.locator("svg text.tick-y").all_text_contents()
        assert 2 <= len(labels) <= 6 and len(set(labels)) == len(labels), (panel, labels)
        for y in figure.locator("svg line.grid").evaluate_all("lines => lines.map(l => l.getAttribute('y1'))"):
            assert TOP - 0.5 <= float(y) <= BOTTOM + 0.5, (panel, y)
        for d in figure.locator("path.series").evaluate_all("paths => paths.map(p => p.getAttribute('d'))"):
            numbers = [float(x) for x in re.findall(r"[-+0-9.eE]+|NaN|Infinity", d)]
            assert numbers and all(0 <= x <= WIDTH for x in numbers[0::2]), (panel, d)
            assert all(TOP - 0.5 <= y <= BOTTOM + 0.5 for y in numbers[1::2]), (panel, d)


@pytest.mark.parametrize("how", ["served", "saved"])
def test_every_metric_shape_is_drawn(chromium, tmp_path, how):
    run = tmp_path / "run"
    write_run(run, SHAPES, steps=6)
    with overview(chromium, run, how, tmp_path) as page:
        check_charts(page, run, SHAPES)
        assert "(no finite value)" in page.inner_text("figure.plot[data-panel=never_finite] .legend")
        # a NaN or infinity breaks the line: steps 1 to 2, then step 4 alone
        line = page.get_attribute("figure.plot[data-panel=with_nonfinite] path.series", "d")
        assert (line.count("M"), line.count("L")) == (2, 1), line


@pytest.mark.parametrize("how", ["served", "saved"])
def test_a_run_of_one_step_draws_a_point_per_metric(chromium, tmp_path, how):
    # never_finite: NaN at its only step; logged_once is not logged
    shapes = {key: values[:1] for key, values in SHAPES.items() if values[0] is not None}
    run = tmp_path / "run"
    write_run(run, shapes, steps=1)
    with overview(chromium, run, how, tmp_path) as page:
        check_charts(page, run, shapes)
        assert page.locator("figure.plot[data-panel=pg_ratio_mean] circle").count() == 1


def test_a_near_constant_metric_of_one_env_is_drawn_by_env(chromium, tmp_path):
    """A run over two envs: the per-env chart of a metric that varies only in its last bit is drawn."""
    grid, arith = "gridworld", "reasoning-gym:basic_arithmetic"
    shapes = {
        "success": [1.0, 1.0, 1.0],
        f"success/{grid}": [1.0, 1.0, 0.9999999999999998],
        f"success/{arith}": [1.0, NAN, 1.0],
        f"episodes/{grid}": [3.0] * 3,
        f"episodes/{arith}": [3.0] * 3,
    }
    run = tmp_path / "run"
    write_run(run, shapes, steps=3)
    with overview(chromium, run, "served", tmp_path) as page:
        assert "Could not" not in page.inner_text("main")
        chart = page.locator(".by-env figure.plot")
        chart.locator("path.series").first.wait_for(state="attached")
        assert chart.locator("path.series").count() == 3  # the overall curve and one per env
        labels = chart.locator("svg text.tick-y").all_text_contents()
        assert 2 <= len(labels) <= 6 and len(set(labels)) == len(labels), labels
