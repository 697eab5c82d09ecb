"""An eval's output in the viewer: no training columns on episodes never trained on, the expected answer
beside the final one, each reward component on a group's cards, pass@k per task, and two evals compared
side by side (the data, the endpoints, the command, and the pages in a real Chromium, served and saved)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from omrl.errors import OmrlError
from omrl.view import open_run
from omrl.view.compare import Comparison
from omrl.view.page import write_page
from omrl.view.server import make_server
from tests.helpers import serving_in_a_thread

from .conftest import make_episode, small_episodes
from .test_browser import page_of, serving
from .test_page_and_server import _get, cli

# each task's samples, won or lost: A and B differ in task 0 sample 1, task 1 sample 2, task 2 sample 1
A = [[True, False, False, False], [False] * 4, [True] * 4]
B = [[True, True, False, False], [False, False, True, False], [True, False, True, True]]


def answered(task: int, sample: int, won: bool, truth: object = "42"):
    """An episode of the dataset env: its last action the answer, the accepted one in its info (as the env
    puts it), and two reward components beside the total."""
    ep = make_episode(task, sample, won, float(won))
    ep.env, ep.split = "dataset", "test"
    ep.turns[-1].action = "42" if won else "41"
    ep.turns[-1].info = {"won": won, "correct": won, "attempt": 1, "ground_truth": truth}
    ep.rewards = {"exact_match": [0.0, float(won)], "format": [0.1, 0.1], "total": [0.1, float(won) + 0.1]}
    return ep


def eval_folder(folder, outcomes):
    """What ``omrl eval --samples 4`` writes: the episodes parquet and the report beside it."""
    from omrl.data.trajectory import write_episodes
    from omrl.evaluation import evaluate, write_report

    episodes = [answered(task, sample, won) for task, wins in enumerate(outcomes) for sample, won in enumerate(wins)]
    folder.mkdir(parents=True)
    write_episodes(episodes, folder / "episodes.parquet")
    write_report(folder / "report.json", evaluate(episodes), episodes, {"env": {"name": "dataset", "split": "test"}})
    return folder


@pytest.fixture
def evals(tmp_path):
    return eval_folder(tmp_path / "evals" / "A", A), eval_folder(tmp_path / "evals" / "B", B)


def trained_file(path):
    """Step rollouts as ``omrl train`` saves them: with the advantages it computed."""
    from omrl.data.trajectory import write_episodes

    recorded = small_episodes()[:2]
    for ep, value in zip(recorded, (0.75, -0.75)):
        ep.advantages = [value if trained else 0.0 for trained in ep.loss_mask]
    write_episodes(recorded, path)
    return path


# ---- the data --------------------------------------------------------------------------------------


def test_an_evals_episodes_are_not_marked_as_trained_on(evals, tmp_path):
    store = open_run(evals[0])
    assert [e["trained"] for e in store.summaries] == [False] * 12
    assert store.overview()["facets"]["trained"] is False and store.group("0:0")["trained"] is False
    training = open_run(trained_file(tmp_path / "step-1.parquet"))
    assert [e["trained"] for e in training.summaries] == [True, True]
    assert training.overview()["facets"]["trained"] is True and training.group("0:0")["trained"] is True


def test_a_search_path_the_update_left_out_is_not_marked_as_trained_on(tmp_path):
    """Paths a search cut short are no rows of the update: listed as trained, with no advantage, they were."""
    from omrl.data.trajectory import write_episodes

    finished = make_episode(0, 0, True, 1.0, node_ids=(1, 2))
    cut = make_episode(0, 1, False, 0.2, node_ids=(1, 3), end="budget")
    finished.advantages = [0.5 * m for m in finished.loss_mask]
    (tmp_path / "rollouts").mkdir()
    write_episodes([finished, cut], tmp_path / "rollouts" / "step-00000001.parquet")
    store = open_run(tmp_path / "rollouts" / "step-00000001.parquet")
    assert [e["trained"] for e in store.summaries] == [True, False]
    assert "left_out" not in store.episode(0)
    assert (
        "a search path the search cut short (it ended budget) is no row of the update" in store.episode(1)["left_out"]
    )


def test_the_expected_answer_comes_with_the_final_one(evals, tmp_path):
    store = open_run(evals[0])
    lost = store.episode(1)  # task 0, sample 1
    assert (lost["final_answer"], lost["expected"]) == ("41", "42")
    assert store.group("0:0")["expected"] == "42"
    from omrl.data.trajectory import write_episodes

    several = answered(0, 0, True, truth=["42", "forty-two"])
    write_episodes([several, make_episode(1, 0, False, 0.0)], tmp_path / "several.parquet")
    store = open_run(tmp_path / "several.parquet")
    assert store.episode(0)["expected"] == ["42", "forty-two"]
    assert store.episode(1)["expected"] is None  # gridworld records no answer: nothing is made up


def test_a_groups_samples_carry_each_reward_component(evals):
    members = open_run(evals[0]).group("0:0")["members"]
    assert members[0]["rewards"] == pytest.approx({"exact_match": 1.0, "format": 0.2, "total": 1.2})
    assert members[1]["rewards"] == pytest.approx({"exact_match": 0.0, "format": 0.2, "total": 0.2})


def test_pass_at_k_per_task(evals, tmp_path):
    store = open_run(evals[0])
    tasks = store.overview()["tasks"]
    assert tasks["ks"] == [1, 2, 4] and tasks["tasks"] == 3
    first = tasks["rows"][0]
    assert (first["task"], first["n"], first["won"], first["group"]) == (0, 4, 1, "0:0")
    assert [p["value"] for p in first["pass"]] == pytest.approx([0.25, 0.5, 1.0])
    # the report's pass@k is the mean of the tasks'
    report = store.overview()["reports"][0]["metrics"]
    for column, k in enumerate(tasks["ks"]):
        mean = sum(row["pass"][column]["value"] for row in tasks["rows"]) / 3
        assert mean == pytest.approx(report[f"pass@{k}"])
    group = store.group("0:0")["passes"]  # every k from 1 to n
    assert [p["k"] for p in group["pass"]] == [1, 2, 3, 4]
    assert [p["value"] for p in group["pass"]] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # a training run's step rollouts: samples of one task from models of different steps, no table
    assert open_run(trained_file(tmp_path / "step-1.parquet")).overview()["tasks"] is None


def test_pass_at_k_leaves_env_errors_out(tmp_path):
    from omrl.data.trajectory import write_episodes

    episodes = [answered(0, 0, True), answered(0, 1, False), answered(0, 2, False)]
    episodes[2].end_reason = "env_error"
    write_episodes(episodes, tmp_path / "episodes.parquet")
    row = open_run(tmp_path / "episodes.parquet").overview()["tasks"]["rows"][0]
    assert (row["n"], row["won"], row["env_errors"]) == (2, 1, 1)
    assert [p["value"] for p in row["pass"]] == pytest.approx([0.5, 1.0])


def test_two_evals_compared(evals):
    c = Comparison(open_run(evals[0]), open_run(evals[1])).overview()
    assert c["kind"] == "compare" and c["title"] == "A vs B"
    metrics = {row["metric"]: row for row in c["metrics"]}
    assert metrics["success_rate"]["a"] == pytest.approx(5 / 12) and metrics["success_rate"]["b"] == 0.5
    assert metrics["success_rate"]["diff"] == pytest.approx(1 / 12)
    assert metrics["end_reasons: done"]["diff"] == 0
    assert c["tasks"] == {"both": 3, "only_a": 0, "only_b": 0, "changed": 3, "listed": 3}
    assert c["flips"] == {"won_to_lost": 1, "lost_to_won": 2, "other": 0}
    changed = {row["task"]: row["changed"] for row in c["changed"]}
    assert changed[0] == [{"sample": 1, "a": 1, "b": 1, "from": "lost", "to": "won"}]
    assert changed[2] == [{"sample": 1, "a": 9, "b": 9, "from": "won", "to": "lost"}]
    assert c["changed"][0]["a"] == {"won": 1, "n": 4, "group": "0:0"}


def test_a_comparison_without_reports_and_with_alike_names(tmp_path):
    """Two episode files named alike: each named by its folder, metrics computed from the episodes."""
    a, b = eval_folder(tmp_path / "x" / "A", A), eval_folder(tmp_path / "y" / "A", B)
    c = Comparison(open_run(a / "episodes.parquet"), open_run(b / "episodes.parquet")).overview()
    assert c["title"] == "x/A/episodes.parquet vs y/A/episodes.parquet"
    assert all("computed from its episodes" in note for note in c["metrics_from"])
    assert {row["metric"]: row["diff"] for row in c["metrics"]}["success_rate"] == pytest.approx(1 / 12)


def test_the_compare_endpoints(evals):
    with serving_in_a_thread(make_server(Comparison(open_run(evals[0]), open_run(evals[1])), "127.0.0.1", 0)) as srv:
        assert json.loads(_get(srv, "/api/run")[2])["kind"] == "compare"
        assert json.loads(_get(srv, "/api/a/run")[2])["episodes"] == 12
        assert json.loads(_get(srv, "/api/b/episode/9")[2])["summary"]["won"] is False
        assert json.loads(_get(srv, "/api/a/episode/9")[2])["summary"]["won"] is True
        assert json.loads(_get(srv, "/api/b/episodes?success=won")[2])["total"] == 6
        assert json.loads(_get(srv, "/api/b/group/0%3A1")[2])["passes"]["won"] == 1
        assert _get(srv, "/api/c/run")[0] == 404 and _get(srv, "/api/episodes")[0] == 404


def test_view_of_two_evals_writes_one_page(evals, tmp_path):
    out = tmp_path / "compare.html"
    result = CliRunner().invoke(cli(), ["view", str(evals[0]), str(evals[1]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "(24 of 24 episodes; opens offline)" in result.output
    html = out.read_text()
    assert '"kind": "compare"' in html and '"sides": {"a"' in html
    three = CliRunner().invoke(cli(), ["view", str(evals[0]), str(evals[1]), str(evals[0]), "--out", str(out)])
    assert isinstance(three.exception, OmrlError) and "one path, or two to compare" in str(three.exception)
    same = CliRunner().invoke(cli(), ["view", str(evals[0]), str(evals[1]), "--out", str(evals[1] / "report.json")])
    assert same.exit_code != 0 and (evals[1] / "report.json").read_text().startswith("{")


def test_comparing_folders_named_like_markup(tmp_path, monkeypatch):
    import omrl.view.server

    monkeypatch.setattr(omrl.view.server, "serve_forever", lambda server: server.server_close())
    a, b = eval_folder(tmp_path / "a[" / "x]", A), eval_folder(tmp_path / "b[" / "x]", B)
    result = CliRunner().invoke(cli(), ["view", str(a), str(b), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "(a[/x] vs b[/x]: 12 and 12 episodes; Ctrl-C stops)" in result.output


def test_a_saved_comparison_holds_the_changed_episodes_first(evals, tmp_path):
    _, kept = write_page(Comparison(open_run(evals[0]), open_run(evals[1])), tmp_path / "c.html", max_episodes=2)
    assert kept == 4
    html = (tmp_path / "c.html").read_text()
    data = json.loads(html.split('id="omrl-data">')[1].split("</script>")[0])
    assert sorted(data["sides"]["a"]["details"]) == ["1", "6"]  # the first two changed ones of A
    assert "those the comparison lists, then the first" in data["run"]["embedded_note"]


# ---- the pages ---------------------------------------------------------------------------------------


@contextmanager
def comparing(a, b):
    with serving_in_a_thread(make_server(Comparison(open_run(a), open_run(b)), "127.0.0.1", 0)) as server:
        yield server.url


@pytest.mark.slow
def test_the_page_shows_no_training_columns_for_an_eval(evals, chromium, tmp_path):
    with serving(evals[0]) as url, page_of(chromium) as page:
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        headers = page.locator("table.list thead th").all_inner_texts()
        assert "advantage" not in headers and "trained" not in headers and "generated" in headers
        page.goto(url + "#/episode/1")
        page.wait_for_selector("table.facts")
        assert page.locator("tr[data-fact=advantage]").count() == 0
        assert page.locator("tr[data-fact='tokens (generated)']").count() == 1
        assert "generated (loss mask 1, sampled by the model)" in page.inner_text("p.legend")
        page.goto(url + "#/group/0:0")
        page.wait_for_selector(".columns .member")
        assert "advantage" not in page.inner_text("main")

    trained = trained_file(tmp_path / "step-1.parquet")  # a training rollout keeps them
    with serving(trained, tokenizer="tiny") as url, page_of(chromium) as page:
        page.goto(url + "#/episodes")
        page.wait_for_selector("table.list tbody tr")
        headers = page.locator("table.list thead th").all_inner_texts()
        assert "advantage" in headers and "trained" in headers
        cells = page.locator("table.list tbody tr >> nth=0").locator("td")
        assert cells.nth(headers.index("advantage")).inner_text() == "+0.75"
        page.goto(url + "#/group/0:0")
        page.wait_for_selector(".columns .member")
        assert "advantage +0.75" in page.inner_text(".member[data-id='0']")
        assert "as the trainer recorded them" in page.inner_text("main")
        page.goto(url + "#/episode/0")
        page.wait_for_selector(".tokens .tok")
        assert "trained (loss mask 1, sampled by the model)" in page.inner_text("p.legend")


@pytest.mark.slow
def test_the_page_shows_the_expected_answer_beside_the_final_one(evals, chromium):
    with serving(evals[0]) as url, page_of(chromium) as page:
        page.goto(url + "#/episode/1")
        page.wait_for_selector("table.facts")
        assert page.inner_text("tr[data-fact='final answer'] td") == "41 · expected: 42"
        assert page.inner_text(".turn[data-turn='1'] .expected") == "expected: 42"
        page.goto(url + "#/group/0:0")
        page.wait_for_selector(".columns .member")
        assert page.inner_text("main > p.expected") == "expected: 42"


@pytest.mark.slow
def test_an_episode_without_its_turns_says_why(evals, chromium, monkeypatch, tmp_path):
    """A report without its episodes file keeps no turns, and a parquet row can be unreadable: the episode
    page shows its facts and the reason, not a script error."""
    from omrl.view.readers import ParquetEpisodes, Unreadable

    def unreadable(reader, index):
        raise Unreadable(f"{reader.label}: row {index} cannot be read (damaged)")

    alone = tmp_path / "report.json"  # copied away from the episodes.parquet omrl eval wrote beside it
    alone.write_bytes((evals[0] / "report.json").read_bytes())
    with serving(alone) as url, page_of(chromium) as page:
        page.goto(url + "#/episode/1")
        page.wait_for_selector("main .card.problems")
        assert "keeps one summary line per episode, not its turns" in page.inner_text("main .card.problems")
        assert page.inner_text("tr[data-fact=success] td") == "lost"
    monkeypatch.setattr(ParquetEpisodes, "row", unreadable)
    with serving(evals[0] / "episodes.parquet") as url, page_of(chromium) as page:
        page.goto(url + "#/episode/1")
        page.wait_for_selector("main .card.problems")
        assert page.inner_text("main .card.problems") == "episodes.parquet: row 1 cannot be read (damaged)"


@pytest.mark.slow
def test_a_group_card_shows_each_reward_component(evals, chromium):
    with serving(evals[0]) as url, page_of(chromium) as page:
        page.goto(url + "#/group/0:0")
        page.wait_for_selector(".columns .member")
        assert page.locator(".columns .member").count() == 4
        components = page.locator(".member[data-id='0'] [data-component]").all_inner_texts()
        assert components == ["exact_match 1", "format 0.2"]  # the total is the card's reward
        assert page.locator(".member[data-id='1'] [data-component]").all_inner_texts() == [
            "exact_match 0",
            "format 0.2",
        ]


@pytest.mark.slow
def test_the_page_shows_pass_at_k_per_task(evals, chromium):
    with serving(evals[0]) as url, page_of(chromium) as page:
        page.goto(url)
        page.wait_for_selector("[data-tasks] tbody tr")
        assert page.locator("[data-tasks] tbody tr").count() == 3
        first = page.locator("[data-tasks] tr[data-task='0']")
        assert [first.locator(f"td[data-k='{k}']").inner_text() for k in (1, 2, 4)] == ["0.25", "0.5", "1"]
        head = page.locator("[data-tasks] thead th").all_inner_texts()
        assert head == ["task", "samples", "won", "pass@1", "pass@2", "pass@4", "mean reward"]
        first.locator("a").click()  # to the task's samples side by side: pass@k for k = 1..4
        page.wait_for_selector("[data-passes]")
        passes = page.locator("[data-passes] [data-k]").all_inner_texts()
        assert passes == ["pass@1 0.25", "pass@2 0.5", "pass@3 0.75", "pass@4 1"]
        assert "won 1 of 4 samples" in page.inner_text("[data-passes]")


@pytest.mark.slow
def test_two_evals_side_by_side(evals, chromium, tmp_path):
    saved, _ = write_page(Comparison(open_run(evals[0]), open_run(evals[1])), tmp_path / "compare.html")
    with comparing(*evals) as url, page_of(chromium) as page:
        for address in (url, saved.as_uri()):
            page.goto(address)
            page.wait_for_selector("table.compare-metrics")
            row = page.locator("table.compare-metrics tr[data-metric=success_rate] td").all_inner_texts()
            assert row == ["success_rate", "0.4167", "0.5", "+0.0833"]
            assert (
                "3 task(s) in both; 3 with an episode whose outcome changed (2 lost → won, 1 won → lost)"
                in page.inner_text("[data-counts]")
            )
            assert page.locator("table.changed tbody tr").count() == 3
            flip = page.locator("table.changed tr[data-task='2'] li[data-sample='1']")
            assert flip.inner_text() == "sample 1: A won → B lost"

            # to A's episode, then B's: each side's own pages
            flip.locator("a[data-side=a]").click()
            page.wait_for_selector("table.facts")
            assert page.url.endswith("#/a/episode/9")
            assert page.inner_text("tr[data-fact=success] td") == "won"
            assert "A: A" in page.inner_text("[data-side=a].side")
            page.go_back()
            page.wait_for_selector("table.changed")
            page.locator("table.changed tr[data-task='2'] a[data-side=b]").click()
            page.wait_for_selector("table.facts")
            assert page.url.endswith("#/b/episode/9") and page.inner_text("tr[data-fact=success] td") == "lost"
            page.click("text=its group")
            page.wait_for_selector(".columns .member")
            assert page.url.endswith("#/b/group/0%3A2") or page.url.endswith("#/b/group/0:2")
            assert "won 3 of 4 samples" in page.inner_text("[data-passes]")

            # each side's list and overview from the header
            page.click("header.top nav a[data-view='b/episodes']")
            page.wait_for_selector("table.list tbody tr")
            assert page.locator("table.list tbody tr").count() == 12
            page.select_option("select[name=success]", "won")
            page.wait_for_selector("text=6 of 12 episodes match")
            assert "#/b/episodes?success=won" in page.url
            page.click("header.top nav a[data-view='a/overview']")
            page.wait_for_selector("[data-tasks] tbody tr")
            assert page.locator("header.top nav a.active").inner_text() == "A overview"
            page.click("header.top nav a[data-view=compare]")
            page.wait_for_selector("table.compare-metrics")


def test_two_sides_of_other_envs_are_said_to_compare_other_tasks(tmp_path):
    """gridworld against webshop showed a success difference as if the two measured one thing."""
    from omrl.data.trajectory import Episode, write_episodes

    def played(env):
        episodes = [Episode(env=env, task_id=i, split="test", instruction="", token_ids=[1, 2]) for i in range(2)]
        return open_run(write_episodes(episodes, tmp_path / f"{env}.parquet"))

    grid, shop = played("gridworld"), played("webshop")
    (problem,) = Comparison(grid, shop).problems()
    assert (
        problem.level == "warning" and "the two sides played other envs (A: gridworld; B: webshop)" in problem.message
    )
    assert problem.as_dict() in Comparison(grid, shop).overview()["problems"]
    assert Comparison(grid, played("gridworld")).problems() == []


@pytest.mark.parametrize("ends", [[], ["env_error", "env_error"]])
def test_a_side_with_nothing_measured_has_no_success_rate_not_0_percent(ends):
    """An SFT run's folder (no episodes) or episodes that all failed in their env measured nothing."""
    from types import SimpleNamespace

    from omrl.view.compare import side_metrics

    summaries = [{"end": end, "won": False, "score": 0.0, "reward": 0.0} for end in ends]
    computed, _ = side_metrics(SimpleNamespace(reports=[], summaries=summaries))
    assert computed["success_rate"] is computed["mean_score"] is computed["mean_reward"] is None
    assert computed["episodes"] == len(ends) and computed["env_errors"] == len(ends)
