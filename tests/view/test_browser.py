"""The page in a real headless Chromium: a real tiny-model run, filters, an episode, its trained
tokens, the plots, escaping of model and env text, and bad input. Screenshots are kept under
pytest's temporary directory (their paths are printed and recorded as test properties)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from omrl.view import open_run
from omrl.view.page import write_page
from omrl.view.server import make_server
from tests.helpers import serving_in_a_thread

from .conftest import SCRIPT, make_episode, small_episodes, write_metrics

pytestmark = pytest.mark.slow  # a real training run and a browser: about a minute and a half


@contextmanager
def serving(path, **kwargs):
    with serving_in_a_thread(make_server(open_run(path, **kwargs), "127.0.0.1", 0)) as server:
        yield server.url


@contextmanager
def page_of(chromium):
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        page.close()
    assert errors == [], f"script errors on the page: {errors}"


def keep_screenshot(page, name: str, folder: Path, record_property) -> Path:
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    record_property(name, str(path))
    return path


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("view-screenshots")


def test_a_real_run(tiny_run, chromium, screenshots, record_property):
    store = open_run(tiny_run)
    first_of_task_1 = store.query({"task": "1"})["items"][0]
    with serving(tiny_run) as url, page_of(chromium) as page:
        # overview: config and learning curves drawn from metrics.jsonl
        page.goto(url)
        page.wait_for_selector("figure.plot path.series", state="attached")
        assert page.locator("figure.plot[data-panel=reward] path.series").count() >= 1
        assert page.get_attribute("figure.plot[data-panel=reward] path.series >> nth=0", "d").count("L") >= 1
        assert "algorithm:" in page.inner_text("pre.config")
        keep_screenshot(page, "overview.png", screenshots, record_property)

        # the list, then a filter that narrows it
        page.click("header.top nav a[data-view=episodes]")
        page.wait_for_selector("table.list tbody tr")
        assert page.locator("table.list tbody tr").count() == 8
        page.fill("input[name=task]", "1")
        page.press("input[name=task]", "Tab")  # change fires when the field is left
        page.wait_for_selector("text=2 of 8 episodes match")
        assert page.locator("table.list tbody tr").count() == 2

        # one episode: turns, and the trained tokens marked
        page.click("table.list tbody tr >> nth=0")
        page.wait_for_selector(".tokens .tok")
        assert page.locator(".turn").count() == first_of_task_1["turns"]
        trained = page.locator(".tokens .tok.trained")
        assert trained.count() == first_of_task_1["generated"] > 0
        assert page.locator(".tokens .tok").count() == first_of_task_1["tokens"]
        trained.nth(0).hover()
        tip = page.inner_text(".tip")
        assert "generated (loss mask 1)" in tip and "log-prob" in tip  # `omrl rollout`'s: not trained on
        page.locator(".tokens .tok.context").nth(0).hover()
        assert "context (loss mask 0)" in page.inner_text(".tip")
        keep_screenshot(page, "episode.png", screenshots, record_property)

        # its group: the samples side by side
        page.click("text=its group")
        page.wait_for_selector(".columns .member")
        assert page.locator(".columns .member").count() == 2


def test_model_and_env_text_shows_as_text(chromium, tmp_path, screenshots, record_property):
    from omrl.data.trajectory import write_episodes

    episodes = [make_episode(0, 0, True, 1.0, observation=SCRIPT), make_episode(0, 1, False, 0.0, observation=SCRIPT)]
    episodes[0].turns[0].response = "</pre><script>window.__pwned = 3</script>"
    episodes[0].instruction = "<i>" + SCRIPT
    write_episodes(episodes, tmp_path / "xss.parquet")
    write_page(open_run(tmp_path / "xss.parquet", tokenizer="tiny"), tmp_path / "saved.html")
    with serving(tmp_path / "xss.parquet", tokenizer="tiny") as url, page_of(chromium) as page:
        for address in (url + "#/episode/0", (tmp_path / "saved.html").as_uri() + "#/episode/0"):
            page.goto(address)
            page.wait_for_selector(".turn pre.observation")
            assert page.inner_text(".turn pre.observation >> nth=0") == SCRIPT
            assert page.inner_text(".turn pre.response >> nth=0") == "</pre><script>window.__pwned = 3</script>"
            assert page.inner_text("pre.instruction") == "<i>" + SCRIPT
            assert page.evaluate("window.__pwned") is None
            assert page.locator("main img, main b, main i, main script").count() == 0
            page.goto(address.replace("#/episode/0", "#/group/0:0"))
            page.wait_for_selector(".columns .member")
            assert page.evaluate("window.__pwned") is None
        keep_screenshot(page, "escaped.png", screenshots, record_property)


def test_bad_files_are_named_and_the_rest_is_shown(small_run, chromium):
    from omrl.data.trajectory import write_episodes

    write_metrics(small_run / "metrics.jsonl", steps=3, tail='{"step": 4, "rew')
    write_episodes(small_episodes(), small_run / "step-2.parquet")
    data = (small_run / "step-2.parquet").read_bytes()
    (small_run / "step-2.parquet").write_bytes(data[:300])
    with serving(small_run) as url, page_of(chromium) as page:
        page.goto(url)
        page.wait_for_selector("figure.plot path.series", state="attached")  # the three intact steps are plotted
        errors = page.inner_text("[data-problems='problems']")
        assert "step-2.parquet" in errors and "truncated, damaged or not a parquet file" in errors
        warnings = page.inner_text("[data-problems='problems warnings']")
        assert "metrics.jsonl" in warnings and "half-written" in warnings
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        assert page.locator("table.list tbody tr").count() == 6  # rollout.parquet's episodes


def test_saved_page_opens_offline(small_run, chromium, tmp_path):
    out, kept = write_page(open_run(small_run), tmp_path / "report.html", max_episodes=4)
    assert kept == 4
    with page_of(chromium) as page:
        # offline: any request that leaves the file fails
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        page.goto(out.as_uri() + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        assert page.locator("table.list tbody tr").count() == 4
        assert "holds the first 4 of the run's 6 episodes" in page.inner_text(".note")
        page.select_option("select[name=success]", "won")
        page.wait_for_selector("text=1 of the 4 episodes this saved page holds match (the run has 6)")
        page.click("table.list tbody tr >> nth=0")
        page.wait_for_selector(".tokens .tok.trained")
        assert page.locator(".tokens .tok.trained").count() == 6
        page.goto(out.as_uri() + "#/episode/5")  # not in the file: said so
        page.wait_for_selector(".problems")
        assert "not in this saved page" in page.inner_text("main")


def test_an_episode_split_into_rows_shows_where(chromium, tmp_path):
    """chat.history=as_template splits an episode where the template rewrote earlier turns: the page
    says how many rows, which turn opens one, and marks the break among the tokens."""
    from omrl.data.trajectory import write_episodes

    split = make_episode(0, 0, True, 1.0)
    split.row_starts = [13]  # the second turn's prompt is a whole new row
    write_episodes([split, make_episode(0, 1, False, 0.0)], tmp_path / "rows.parquet")
    with serving(tmp_path / "rows.parquet", tokenizer="tiny") as url, page_of(chromium) as page:
        page.goto(url + "#/episode/0")
        page.wait_for_selector(".tokens .tok")
        assert page.locator(".tokens .row-break").count() == 1
        assert page.locator("main > .row-break").all_inner_texts() == ["row 2 (new prompt)"]
        assert "(chat.history=as_template)" in page.inner_text("tr[data-fact=rows]")
        page.goto(url + "#/episode/1")
        page.wait_for_selector(".tokens .tok")
        assert page.locator(".row-break, tr[data-fact=rows]").count() == 0


def test_a_large_task_id_shows_whole(chromium, tmp_path):
    """Task ids of a million and more (gridworld's seeds, a dataset's row numbers) read as numbers, not 1.23e+6."""
    from omrl.data.trajectory import write_episodes

    write_episodes(
        [make_episode(1_234_567, 0, True, 1.0), make_episode(1_234_567, 1, False, 0.0)], tmp_path / "big.parquet"
    )
    with serving(tmp_path / "big.parquet", tokenizer="tiny") as url, page_of(chromium) as page:
        page.goto(url + "#/episode/0")
        page.wait_for_selector("table.facts")
        assert "1234567" in page.inner_text("table.facts") and "e+" not in page.inner_text("table.facts")


def test_a_stuck_runs_stages_show_from_its_heartbeat(small_run, chromium):
    import json

    beat = {
        "time": 1.7e9,
        "step": 4,
        "stages": {"generate": {"done": 9, "seconds": 12.5, "stalled": 0, "last_done": 1.7e9}},
        "open": [
            {
                "stage": "env_step",
                "step": 4,
                "env": "webshop",
                "episode": "task 17 sample 2",
                "for_s": 312.0,
                "stalled": True,
            }
        ],
    }
    (small_run / "heartbeat.json").write_text(json.dumps(beat))
    with (small_run / "metrics.jsonl").open("a") as metrics:  # a heartbeat line among the steps: not a bad line
        metrics.write(json.dumps({"heartbeat": beat, "time": beat["time"]}) + "\n")
    with serving(small_run) as url, page_of(chromium) as page:
        page.goto(url)
        stages = page.inner_text("[data-stages]", timeout=30_000)
        assert "heartbeat of step 4" in stages and "generate" in stages and "12.5" in stages
        assert "env_step for 312 s, env webshop, task 17 sample 2 (past its deadline)" in stages
        assert page.locator("[data-problems='problems warnings']").count() == 0


def test_a_narrow_window_scrolls_a_wide_table_within_itself_not_the_page(small_run, chromium):
    """At 420 px the episode list pushed the page sideways and cut its last columns off."""
    with serving(small_run) as url:
        page = chromium.new_page(viewport={"width": 420, "height": 800})
        try:
            page.goto(url + "#/episodes")
            page.wait_for_selector("table.list tbody tr")
            assert page.evaluate("document.documentElement.scrollWidth") <= 420
            table = page.locator("table.list")
            assert table.evaluate("t => t.scrollWidth > t.clientWidth")  # its columns are all there, scrolled to
        finally:
            page.close()
