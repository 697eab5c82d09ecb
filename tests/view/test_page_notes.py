"""What the page says of what it does not hold, in a real Chromium: a report's unknown token counts, the
advantages a step rollout saved before omrl recorded them lacks, and a saved page's episodes past its cut."""

from __future__ import annotations

import json

import pytest

from omrl.view import open_run
from omrl.view.page import write_page

from .conftest import small_episodes, write_metrics
from .test_browser import page_of, serving
from .test_eval_view import eval_folder

pytestmark = pytest.mark.slow  # a browser


def test_a_reports_unknown_token_counts_show_as_unknown(chromium, tmp_path):
    folder = eval_folder(tmp_path / "evals" / "A", [[True, False]])
    alone = tmp_path / "report.json"  # away from its episodes: the report's summary lines only
    alone.write_text(json.dumps(json.loads((folder / "report.json").read_text())))
    with serving(alone) as url, page_of(chromium) as page:
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        headers = page.locator("table.list thead th").all_inner_texts()
        cells = page.locator("table.list tbody tr >> nth=0").locator("td")
        assert [cells.nth(headers.index(c)).inner_text() for c in ("tokens", "generated")] == ["–", "–"]
        page.goto(url + "#/episode/0")
        page.wait_for_selector("table.facts")
        assert page.inner_text("tr[data-fact='tokens (generated)'] td") == "– (–)"


def test_a_step_rollout_without_recorded_advantages_says_so(chromium, tmp_path):
    from omrl.data.trajectory import write_episodes

    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    write_metrics(run / "metrics.jsonl")
    import pyarrow.parquet as pq

    written = write_episodes(small_episodes(), tmp_path / "new.parquet")
    table = pq.read_table(written).drop_columns(["advantages", "returns", "values"])  # as episode/4 wrote it
    pq.write_table(table.replace_schema_metadata({b"omrl.schema": b"episode/4"}),
                   run / "rollouts" / "step-00000001.parquet")  # fmt: skip
    with serving(run) as url, page_of(chromium) as page:
        page.goto(url + "#/overview")
        page.wait_for_selector("[data-advantage]")
        assert "advantages not recorded" in page.inner_text("[data-advantage]")
        page.goto(url + "#/group/0:0")
        page.wait_for_selector(".columns .member")
        assert "advantages not recorded" in page.inner_text("main")


def test_a_saved_page_links_and_counts_only_the_episodes_it_holds(small_run, chromium, tmp_path):
    out, kept = write_page(open_run(small_run), tmp_path / "page.html", max_episodes=3)
    assert kept == 3
    with page_of(chromium) as page:
        page.goto(out.as_uri() + "#/episode/2")  # the last one it holds: no "next" to one it does not
        page.wait_for_selector("table.facts")
        links = page.locator("main p >> nth=0").inner_text()
        assert "previous" in links and "next" not in links
        page.goto(out.as_uri() + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        assert page.inner_text(".pager .count") == "3 of the run's 6 episodes (those this saved page holds)"
