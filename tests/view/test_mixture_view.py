"""``omrl view`` and ``omrl plot`` of a run over several envs: episodes filtered by env (the API, the
page in a real Chromium, a saved page), a curve per env beside the overall one, and a one-env run
left as it was."""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest
from typer.testing import CliRunner

from omrl.view import open_run
from omrl.view.metrics import env_panels, panels
from omrl.view.page import write_page
from omrl.view.plot import draw, plan, plot_run, require_matplotlib
from omrl.view.server import make_server
from tests.helpers import serving_in_a_thread

from .conftest import _omrl, make_episode, write_metrics
from .test_browser import page_of, serving
from .test_page_and_server import _get, cli

GRID, ARITH = "gridworld", "reasoning-gym:basic_arithmetic"  # the second's name holds a ':'


@pytest.fixture(scope="session")
def mixed_run(tmp_path_factory):
    """A real run: 2 GRPO steps of the tiny model on a mixture of gridworld and an arithmetic env (~15 s)."""
    run = tmp_path_factory.mktemp("mixed") / "run"
    _omrl(
        *f"train --algo grpo --model tiny --env {GRID}:0.5,{ARITH}:0.5 --steps 2 --output-dir".split(),
        str(run),
        *"env.max_turns=2 generation.max_new_tokens=8 generation.max_context=512 tasks_per_step=4".split(),
        *"group_size=2 eval_tasks=1 eval_every=1 logging.tensorboard=false".split(),
    )
    return run


def two_env_run(folder):
    """A hand-made run: 3 episodes of each env, and metrics with per-env keys."""
    from omrl.data.trajectory import write_episodes

    episodes = [make_episode(task, 0, task == 0, float(task == 0)) for task in range(6)]
    for ep in episodes[3:]:
        ep.env = ARITH
    folder.mkdir()
    write_episodes(episodes, folder / "rollout.parquet")
    lines = [
        {"step": s, "success": s / 4, f"success/{GRID}": s / 2, f"success/{ARITH}": 0.0, "kl": 0.1}
        | {f"episodes/{GRID}": 3, f"episodes/{ARITH}": 3}
        for s in (1, 2)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


@pytest.fixture
def server_of():
    with ExitStack() as servers:
        yield lambda path: servers.enter_context(serving_in_a_thread(make_server(open_run(path), "127.0.0.1", 0)))


def _api(srv, path):
    status, _, body = _get(srv, path)
    assert status == 200, body
    return json.loads(body)


@pytest.mark.slow  # a training run (the mixed_run fixture)
def test_the_episode_api_filters_by_env(mixed_run, server_of):
    srv = server_of(mixed_run)
    run = _api(srv, "/api/run")
    assert run["facets"]["env"] == sorted([GRID, ARITH])
    counts = {e["env"]: e["episodes"] for e in run["envs"]}
    assert set(counts) == {GRID, ARITH} and sum(counts.values()) == run["episodes"]
    for env in (GRID, ARITH):
        page = _api(srv, "/api/episodes?env=" + env.replace(":", "%3A") + "&limit=500")
        assert page["total"] == counts[env] > 0
        assert {e["env"] for e in page["items"]} == {env}
    both = _api(srv, f"/api/episodes?env={GRID}&success=lost&limit=500")  # with the other filters
    assert {e["env"] for e in both["items"]} == {GRID} and all(not e["won"] for e in both["items"])
    assert _api(srv, "/api/episodes?env=textcraft")["total"] == 0
    assert _api(srv, "/api/episodes?env=")["total"] == run["episodes"]  # an empty filter passes all


@pytest.mark.slow  # a training run (the mixed_run fixture)
def test_a_real_mixture_runs_curves_per_env(mixed_run):
    run = open_run(mixed_run).overview()
    keys = list(run["metrics"]["series"])
    assert f"success/{GRID}" in keys and f"success/{ARITH}" in keys
    by_env = {p["metric"]: p for p in run["env_panels"]}
    assert by_env["success"]["keys"] == ["success", f"success/{GRID}", f"success/{ARITH}"]
    assert by_env["success"]["labels"] == ["success (all envs)", GRID, ARITH]
    assert by_env["episodes"]["keys"] == [f"episodes/{GRID}", f"episodes/{ARITH}"]  # no overall count is logged
    shown = [key for panel in run["panels"] for key in panel["keys"]]
    assert "success" in shown and not [k for k in shown if k.endswith((f"/{GRID}", f"/{ARITH}"))]


def test_per_env_keys_leave_the_ordinary_panels_and_a_one_env_run_is_as_before():
    one_env = ["reward", "reward_goal", "success", "eval_success", "kl", "turns", "reward/goal"]
    assert env_panels(one_env) == []  # without episodes/<env> no key is per env
    assert [p["keys"] for p in panels(one_env)][:2] == [
        ["reward", "reward_goal", "reward/goal"],
        ["success", "eval_success"],
    ]
    mixed = [*one_env, f"success/{GRID}", f"episodes/{GRID}", f"success/{ARITH}", f"episodes/{ARITH}", f"turns/{GRID}"]
    assert panels(mixed) == panels(one_env)
    assert [(p["title"], p["keys"]) for p in env_panels(mixed)] == [
        ("success by env", ["success", f"success/{GRID}", f"success/{ARITH}"]),
        ("turns by env", ["turns", f"turns/{GRID}"]),
        ("episodes by env", [f"episodes/{GRID}", f"episodes/{ARITH}"]),
    ]


@pytest.mark.slow  # a training run (the mixed_run fixture)
def test_plot_draws_success_and_a_line_per_env(mixed_run, tmp_path):
    plt = require_matplotlib()
    result = CliRunner().invoke(cli(), ["plot", str(mixed_run), "--out", str(tmp_path / "p"), "-m", "success"])
    assert result.exit_code == 0, result.output
    written = sorted(str(p.relative_to(tmp_path / "p")) for p in (tmp_path / "p").rglob("*.png"))
    assert written == ["by-env/success.png", "success.png"]
    assert (tmp_path / "p" / "by-env" / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    curves = open_run(mixed_run).overview()["metrics"]
    files = dict(plan(list(curves["series"]), ["success"]))
    figure = draw(files["by-env/success.png"], curves, plt)
    axes = figure.axes[0]
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert legend == ["success (all envs)", GRID, ARITH]
    assert [line.get_label() for line in axes.get_lines()] == legend  # each drawn, not only named
    assert axes.get_lines()[0].get_linestyle() == "--"  # the overall curve stands out from the envs'
    plt.close(figure)
    one = dict(plan(list(curves["series"]), [f"success/{ARITH}"]))  # a per-env key picks its metric's panel
    assert list(one) == ["by-env/success.png"]
    everything = [name for name, _ in plan(list(curves["series"]))]
    assert "reward.png" in everything and "by-env/reward.png" in everything and "by-env/episodes.png" in everything


def test_plot_of_a_one_env_run_writes_no_by_env_folder(small_run, tmp_path):
    require_matplotlib()
    written, _ = plot_run(small_run, tmp_path / "p")
    assert written and all(p.parent == tmp_path / "p" for p in written)
    assert not (tmp_path / "p" / "by-env").exists()


def test_a_mixture_eval_report_names_each_episodes_env(tmp_path):
    report = {
        "metrics": {"success_rate": 0.5},
        "per_env": {GRID: {"success_rate": 1.0}, ARITH: {"success_rate": 0.0}},
        "macro": {"success_rate": 0.5},
        "micro": {"success_rate": 0.5},
        "config": {"env": {"name": f"{GRID},{ARITH}", "split": "test"}},
        "episodes": [{"env": GRID, "task_id": 0, "won": True}, {"env": ARITH, "task_id": 0, "won": False}],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    store = open_run(tmp_path / "report.json")
    assert [e["env"] for e in store.summaries] == [GRID, ARITH]
    assert store.query({"env": ARITH})["total"] == 1
    shown = store.overview()["reports"][0]
    assert shown["per_env"][ARITH] == {"success_rate": 0.0} and shown["macro"] == {"success_rate": 0.5}


@pytest.mark.slow
def test_the_page_of_a_mixture_filters_and_plots_by_env(mixed_run, chromium):
    store = open_run(mixed_run)
    arith = store.query({"env": ARITH, "limit": "500"})["total"]
    with serving(mixed_run) as url, page_of(chromium) as page:
        page.goto(url)
        page.wait_for_selector(".by-env figure.plot path.series", state="attached")
        assert page.inner_text(".by-env figcaption") == "success by env"
        legend = page.locator(".by-env .legend span").all_inner_texts()
        assert legend == ["success (all envs)", GRID, ARITH]
        assert page.locator(".by-env path.series").count() >= 2  # drawn, not only listed
        assert page.locator(".by-env path.series.overall").get_attribute("data-key") == "success"
        page.select_option("select[name=env-metric]", "reward")
        page.wait_for_selector(".by-env figcaption:text-is('reward by env')")
        assert page.locator(".by-env .legend span").all_inner_texts() == ["reward (all envs)", GRID, ARITH]
        assert f"{ARITH} ({arith})" in page.inner_text(".envs")

        page.click(f".envs a:text-is('{ARITH}')")  # the overview's link to one env's episodes
        page.wait_for_selector(f"text={arith} of {len(store.summaries)} episodes match")
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        options = page.locator("select[name=env] option").evaluate_all("els => els.map(e => e.value)")
        assert options == ["", *sorted([GRID, ARITH])]
        page.select_option("select[name=env]", ARITH)
        page.wait_for_selector(f"text={arith} of {len(store.summaries)} episodes match")
        assert page.locator("table.list td.env").all_inner_texts() == [ARITH] * min(arith, 50)
        page.click("table.list tbody tr >> nth=0")
        page.wait_for_selector("table.facts")
        assert ARITH in page.inner_text("table.facts")


@pytest.mark.slow
def test_a_saved_page_filters_by_env_offline(tmp_path, chromium):
    run = two_env_run(tmp_path / "run")
    out, _ = write_page(open_run(run), tmp_path / "saved.html")
    with page_of(chromium) as page:
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        page.goto(out.as_uri() + "#/episodes")
        page.wait_for_selector("select[name=env]")
        page.select_option("select[name=env]", GRID)
        page.wait_for_selector("text=3 of 6 episodes match")
        assert page.locator("table.list td.env").all_inner_texts() == [GRID] * 3


@pytest.mark.slow
def test_the_page_of_a_one_env_run_has_no_env_control(small_run, chromium):
    write_metrics(small_run / "metrics.jsonl")
    with serving(small_run) as url, page_of(chromium) as page:
        page.goto(url)
        page.wait_for_selector("figure.plot path.series", state="attached")
        assert page.locator(".by-env, .envs").count() == 0
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        assert page.locator("select[name=env]").count() == 0 and page.locator("table.list td.env").count() == 0
        assert "env" not in page.locator("table.list thead th").all_inner_texts()


def test_a_mixture_report_groups_each_env_s_tasks_apart():
    from omrl.view.readers import ReportEpisodes

    episodes = [
        {"env": env, "task_id": 1_000_000, "sample": sample, "won": False}
        for env in ("gridworld", "reasoning-gym:basic_arithmetic")
        for sample in (0, 1)
    ]
    groups = [row["group"] for row in ReportEpisodes({"episodes": episodes}, "report").summaries]
    assert groups[0] == groups[1] != groups[2] == groups[3]  # the same task id, two envs: two groups
    single = ReportEpisodes({"episodes": [{"task_id": 7, "sample": 0}]}, "report").summaries
    assert single[0]["group"] == 7  # a one-env report keeps the task id as its group
