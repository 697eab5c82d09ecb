"""The page's HTML, its JSON endpoints, and the two commands (without a browser)."""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading

import pytest
import typer
from typer.testing import CliRunner

from omrl.cli import plot_cmd, view_cmd
from omrl.errors import OmrlError
from omrl.view import open_run
from omrl.view.page import embedded_data, render, script_json
from omrl.view.server import make_server
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
    srv = make_server(open_run(small_run), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


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


def test_plot_without_matplotlib_names_the_extra(small_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(cli(), ["plot", str(small_run)])
    assert isinstance(result.exception, OmrlError)
    assert "pip install 'omrl[plot]'" in str(result.exception)


def test_the_page_assets_are_package_data():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    assert "omrl.view" in setuptools["packages"]
    assert "assets/*" in setuptools["package-data"].get("omrl.view", [])
