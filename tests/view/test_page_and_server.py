"""The page's HTML, its JSON endpoints, and the two commands (without a browser)."""

from __future__ import annotations

import http.client
import json
import re
import sys

import pytest
import typer
from typer.testing import CliRunner

from omrl.cli import plot_cmd, view_cmd
from omrl.errors import OmrlError
from omrl.view import open_run
from omrl.view.page import dumps, embedded_data, render, script_json
from omrl.view.server import make_server
from tests.helpers import serving_in_a_thread

from .conftest import SCRIPT


def cli() -> typer.Typer:
    """The two commands on an app of their own (the lead registers them on omrl's)."""
    app = typer.Typer()
    app.callback()(lambda: None)
    view_cmd.add_to(app)
    plot_cmd.add_to(app)
    return app


def test_the_page_loads_nothing_from_elsewhere():
    html = render()
    assert "Content-Security-Policy" in html and "connect-src 'self'" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "<script src" not in html and "<link" not in html


def test_embedded_json_cannot_close_its_script_element():
    text = script_json({"observation": SCRIPT + "</script><!--"})
    assert "<" not in text and ">" not in text
    assert json.loads(text)["observation"].startswith("<script>")


def test_saved_page_holds_a_bounded_number_of_episodes(small_run):
    store = open_run(small_run)
    data = embedded_data(store, max_episodes=4)
    assert len(data["summaries"]) == 4 and sorted(data["details"]) == ["0", "1", "2", "3"]
    assert "holds the first 4 of the run's 6 episodes" in data["run"]["embedded_note"]
    assert embedded_data(store, max_episodes=50)["run"]["embedded_note"] == ""


@pytest.fixture
def server(small_run):
    with serving_in_a_thread(make_server(open_run(small_run), "127.0.0.1", 0)) as srv:
        yield srv


def _get(srv, path: str, host: str | None = None):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    conn.request("GET", path, headers={"Host": host} if host else {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, response.getheader("Content-Type"), body


def test_endpoints(server):
    status, kind, body = _get(server, "/")
    assert status == 200 and kind.startswith("text/html") and b"omrl view" in body
    run = json.loads(_get(server, "/api/run")[2])
    assert run["episodes"] == 6 and run["panels"][0]["title"] == "Reward"
    page = json.loads(_get(server, "/api/episodes?success=won&sort=-reward")[2])
    assert page["total"] == 2
    episode = json.loads(_get(server, "/api/episode/1")[2])
    assert episode["summary"]["id"] == 1 and len(episode["tokens"]["ids"]) == 20
    assert json.loads(_get(server, "/api/group/0%3A1")[2])["size"] == 2
    status, _, body = _get(server, "/api/episode/99")
    assert status == 404 and "no episode 99" in json.loads(body)["error"]
    assert _get(server, "/api/tree/0%3A0")[0] == 404  # no search in this run


def test_an_episode_id_that_is_not_a_short_ascii_number_is_not_found(server):
    for arg in ("%C2%B2", "9" * 5000, "-1", "1.0"):  # "²" is a digit to str.isdigit; int() refuses 5000 digits
        status, _, body = _get(server, "/api/episode/" + arg)
        assert status == 404, (arg[:20], body[:200])


def test_a_partial_saved_page_quotes_the_command_that_serves_all(small_run):
    run = small_run.rename(small_run.parent / "my run")
    note = embedded_data(open_run(run), max_episodes=4)["run"]["embedded_note"]
    assert f"`omrl view '{run}'` serves them all" in note


def test_loopback_server_refuses_other_host_names(server):
    """A page elsewhere that rebinds its own name to 127.0.0.1 must not read the run."""
    assert _get(server, "/api/run", host="evil.example:8765")[0] == 403
    assert _get(server, "/api/run", host=f"localhost:{server.server_address[1]}")[0] == 200


def test_a_taken_port_named_by_the_user_is_an_error(small_run, server):
    with pytest.raises(OmrlError, match=r"is in use; pass another --port"):
        make_server(open_run(small_run), "127.0.0.1", server.server_address[1])


def test_view_out_writes_one_file(small_run, tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli(), ["view", str(small_run), "--out", str(out), "--max-episodes", "3"])
    assert result.exit_code == 0, result.output
    assert "3 of 6 episodes; opens offline" in result.output
    html = out.read_text()
    assert 'id="omrl-data"' in html and "connect-src 'none'" in html


def test_printed_paths_with_brackets_are_not_read_as_markup(small_run, tmp_path):
    out = tmp_path / "page[v2].html"
    result = CliRunner().invoke(cli(), ["view", str(small_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out} (6 of 6 episodes; opens offline)" in result.output
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots[/x]"
    result = CliRunner().invoke(cli(), ["plot", str(small_run), "--out", str(plots), "-m", "kl"])
    assert result.exit_code == 0, result.output
    assert f"wrote {plots / 'kl.png'}" in result.output


def test_an_int_too_large_for_a_float_is_a_gap_in_view_and_plot(small_run, tmp_path):
    with (small_run / "metrics.jsonl").open("a") as metrics:
        metrics.write(f'{{"step": 4, "grad_norm": 1{"0" * 400}}}\n{{"step": 5, "grad_norm": 3}}\n')
    result = CliRunner().invoke(cli(), ["view", str(small_run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(cli(), ["plot", str(small_run), "--out", str(tmp_path / "p"), "-m", "grad_norm"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["grad_norm.png"]


def test_view_reports_problems_on_the_console(small_run, tmp_path):
    (small_run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "re')
    result = CliRunner().invoke(cli(), ["view", str(small_run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0
    assert "warning: metrics.jsonl: the last line is half-written" in result.output


def test_view_of_a_path_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(cli(), ["view", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert isinstance(result.exception, OmrlError) and "is not an omrl run" in str(result.exception)


def test_plot_writes_pngs(small_run, tmp_path):
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(cli(), ["plot", str(small_run), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == ["entropy.png", "kl.png", "reward.png", "success.png", "throughput.png", "time.png"]
    assert (tmp_path / "plots" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    only = CliRunner().invoke(cli(), ["plot", str(small_run), "--out", str(tmp_path / "kl"), "-m", "kl"])
    assert only.exit_code == 0 and [p.name for p in (tmp_path / "kl").iterdir()] == ["kl.png"]


def test_plot_of_a_missing_path_asks_for_what_plot_reads(tmp_path):
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(cli(), ["plot", str(tmp_path / "nosuch")])
    assert isinstance(result.exception, OmrlError)
    assert "no such file or directory; give a run directory of omrl train or sft" in str(result.exception)
    assert "trajectory" not in str(result.exception)  # what omrl view reads, and plot does not


def test_plot_without_matplotlib_names_the_extra(small_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(cli(), ["plot", str(small_run)])
    assert isinstance(result.exception, OmrlError)
    assert "pip install 'omrl[plot]'" in str(result.exception)


def test_the_page_assets_are_package_data():
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    assert "omrl.view" in setuptools["packages"]
    assert "assets/*" in setuptools["package-data"].get("omrl.view", [])


def _long_run(tmp_path, episodes: int = 6, chars: int = 300_000, tokens: int = 40_000):
    """A run whose episodes each hold a ``chars``-long observation and reply, an error as long, and
    ``tokens`` tokens: what made a 493 MB saved page of 200 episodes."""
    from omrl.data.trajectory import write_episodes

    from .conftest import make_episode

    made = []
    for i in range(episodes):
        episode = make_episode(i, 0, False, 0.0, observation="o" * chars)
        episode.turns[0].response = "r" * chars
        episode.error = "e" * chars
        extra = tokens - len(episode.token_ids)
        episode.token_ids += [7] * extra
        episode.loss_mask += [0] * extra
        episode.logprobs += [0.0] * extra
        made.append(episode)
    run = tmp_path / "long"
    run.mkdir()
    write_episodes(made, run / "rollout.parquet")
    return open_run(run, tokenizer="tiny")


def test_long_texts_and_token_lists_are_cut_with_a_note(tmp_path):
    from omrl.view.bounds import MAX_GROUP_TEXT, MAX_TEXT, MAX_TOKENS

    store = _long_run(tmp_path)
    episode = store.episode(0)
    for text in (episode["turns"][0]["observation"], episode["turns"][0]["response"], episode["summary"]["error"]):
        assert text.startswith("o" * 100) or text.startswith("r" * 100) or text.startswith("e" * 100)
        assert len(text) < MAX_TEXT + 300 and "[omrl view cut 280,000 more characters here" in text
    tokens = episode["tokens"]
    assert all(len(tokens[name]) == MAX_TOKENS for name in ("ids", "mask", "logprob", "text"))
    assert tokens["cut"].startswith(f"the first {MAX_TOKENS:,} of this episode's 40,000 tokens are shown")
    assert len(dumps(episode)) < 2_000_000  # the answer for 40,000 tokens and 900,000 characters of text
    member = store.group("0:0")["members"][0]
    assert len(member["turns"][0]["observation"]) < MAX_GROUP_TEXT + 300
    assert "tk.cut" in render()  # the page shows the token note


@pytest.mark.slow
def test_a_saved_page_stops_embedding_episodes_at_its_byte_bound(tmp_path):
    store = _long_run(tmp_path)
    whole = len(script_json(embedded_data(store)))
    assert whole < 6 * 2_500_000  # cut texts and tokens: no episode embeds its 900,000 characters
    data = embedded_data(store, max_bytes=3 * 1024 * 1024)
    assert 0 < len(data["details"]) < 6 and len(data["summaries"]) == len(data["details"])
    assert len(script_json({k: data[k] for k in ("details", "groups", "trees")})) <= 3 * 1024 * 1024
    assert (
        f"holds the first {len(data['details'])} of the run's 6 episodes (past them its 3 MiB bound on "
        "embedded episodes would be crossed)"
    ) in data["run"]["embedded_note"]
