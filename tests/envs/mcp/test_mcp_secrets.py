"""An MCP server's secrets (an ``--api-key`` in ``plugins.mcp.command``, the values of ``plugins.mcp.env``)
reach no file omrl writes (issue 50, point 5): config.yaml, a checkpoint's state.json, the eval report, the
episode files (whose env_error quotes the command) and the viewer's page."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from omrl.config import REDACTED, load_config, redact, to_dict, to_yaml
from omrl.config.options import EvalRunConfig
from omrl.errors import ConfigError
from omrl.training import checkpoint as ckpt
from omrl.training.resume import resume_checkpoint
from tests.helpers import cli_exit

API_KEY, PAT, DB_PASSWORD = "sk-live-4a7f19", "ghp_9c2e4b7d1f", "pw-6b3d8e"
DATABASE_URL = f"postgres://shop:{DB_PASSWORD}@db.internal/shop"
SECRETS = (API_KEY, PAT, DB_PASSWORD)
# a server that cannot start, and says why with its token: the run stops, its error quoting the command
FAILING = f"""{shlex.quote(sys.executable)} -c 'import os, sys; sys.stderr.write("token " + os.environ["GITHUB_PAT"]); sys.exit(2)' --api-key {API_KEY}"""
SECRET_ENV = (f"plugins.mcp.env.GITHUB_PAT={PAT}", f"plugins.mcp.env.DATABASE_URL={DATABASE_URL}")
OVERRIDES = (f"plugins.mcp.command={FAILING}", *SECRET_ENV)
# a server that starts once, then cannot start again and says why with its token: every episode is an env_error
ONCE = f"{shlex.quote(sys.executable)} {Path(__file__).with_name('once_server.py')} --api-key {API_KEY}"


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def written_text(path) -> str:
    """A file's text; a parquet file's rows as JSON (its pages may be compressed)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return json.dumps(pq.read_table(path).to_pylist(), default=str)
    return path.read_text(encoding="utf-8", errors="replace")


@pytest.mark.parametrize(
    "text, redacted",
    [
        ("srv --api-key sk-1 --port 8", f"srv --api-key {REDACTED} --port 8"),
        ("srv --token=abc -v", f"srv --token={REDACTED} -v"),
        ('srv --password "two words"', f"srv --password {REDACTED}"),
        ("GITHUB_TOKEN=ghp_x srv", f"GITHUB_TOKEN={REDACTED} srv"),
        ("https://h/mcp?api_key=abc&x=1", f"https://h/mcp?api_key={REDACTED}&x=1"),
        ("postgres://me:pw@db/x", f"postgres://me:{REDACTED}@db/x"),
        ('{"password": "pw", "user": "me"}', f'{{"password": {REDACTED}, "user": "me"}}'),
        ("Authorization: Bearer abcdefgh12345", f"Authorization: Bearer {REDACTED}"),
        ("srv --max-tokens 8 --db-path my.db https://h/mcp", "srv --max-tokens 8 --db-path my.db https://h/mcp"),
    ],
)
def test_secret_looking_arguments_are_redacted_in_text(text, redacted):
    from omrl.config import redact_text

    assert redact_text(text) == redacted
    assert redact_text(redacted) == redacted  # redacting twice changes nothing


def test_env_values_and_argv_secrets_are_redacted_in_config_data():
    data = {
        "env": {"name": "mcp", "split": "test"},  # the env section, at the top: not an environment
        "plugins": {
            "mcp": {
                "command": ["srv", "--api-key", API_KEY, "--port", "8"],
                "env": {"GITHUB_PAT": PAT, "DATABASE_URL": DATABASE_URL, "EMPTY": ""},
            }
        },
    }
    assert redact(data) == {
        "env": {"name": "mcp", "split": "test"},
        "plugins": {
            "mcp": {
                "command": ["srv", "--api-key", REDACTED, "--port", "8"],
                "env": {"GITHUB_PAT": REDACTED, "DATABASE_URL": REDACTED, "EMPTY": ""},
            }
        },
    }


def test_config_yaml_and_state_json_hold_no_server_secret(tmp_path, tiny_model):
    cfg = load_config(EvalRunConfig, None, list(OVERRIDES))
    assert leaks(to_yaml(cfg)) == []  # what a run writes as config.yaml
    model, _ = tiny_model
    ckpt.save_checkpoint(tmp_path, 1, model, config=to_dict(cfg))
    state = (ckpt.latest_checkpoint(tmp_path) / "state.json").read_text()
    assert leaks(state) == [] and json.loads(state)["config"]["plugins"]["mcp"]["env"]["GITHUB_PAT"] == REDACTED
    assert cfg.plugins["mcp"]["env"]["GITHUB_PAT"] == PAT  # what the server is started with


def test_a_checkpoint_with_the_servers_secrets_in_clear_still_resumes(tmp_path, tiny_model):
    model, _ = tiny_model
    clear = {"seed": 0, "plugins": {"mcp": {"command": f"srv --api-key {API_KEY}", "env": {"GITHUB_PAT": PAT}}}}
    ckpt.save_checkpoint(tmp_path, 1, model, config=clear)  # a run made before the redaction
    now = {"seed": 0, "plugins": {"mcp": {"command": f"srv --api-key {REDACTED}", "env": {"GITHUB_PAT": REDACTED}}}}
    assert resume_checkpoint(tmp_path, now).name == "step-00000001"


def test_the_error_of_a_server_that_cannot_start_holds_no_server_secret(tmp_path, tasks, capsys):
    code, _, err = cli_exit(capsys, "rollout", "--expert", "--env", "mcp", *OVERRIDES, f"plugins.mcp.path={tasks}",
                            "-o", str(tmp_path / "out.parquet"))  # fmt: skip
    assert code == 2 and "could not start" in err and f"--api-key {REDACTED}" in err.replace("'", ""), err
    assert f"token {REDACTED}" in err and leaks(err) == []


def test_the_report_the_episodes_and_the_page_hold_no_server_secret(tmp_path, tasks, capsys):
    out = tmp_path / "eval"
    once = f"plugins.mcp.env.MCP_TEST_ONCE_FILE={tmp_path / 'ran'}"
    code, _, err = cli_exit(capsys, "eval", "--model", "tiny", "--env", "mcp", "--num-tasks", "2",
                            f"plugins.mcp.command={ONCE}", *SECRET_ENV, once, f"plugins.mcp.path={tasks}",
                            f"plugins.mcp.test_path={tasks}", "max_env_error_rate=1.0", "--output-dir", str(out))  # fmt: skip
    assert code == 2 and leaks(err) == [], err  # every episode failed in the env: no result, its report written
    report = json.loads((out / "report.json").read_text())
    assert [ep["end_reason"] for ep in report["episodes"]] == ["env_error", "env_error"]
    error = report["episodes"][0]["error"]
    assert f"--api-key {REDACTED}" in error.replace("'", "") and f"token {REDACTED}" in error, error
    code, _, err = cli_exit(capsys, "view", str(out), "--out", str(tmp_path / "page.html"))
    assert code in (0, None), err
    written = {path.name: written_text(path) for path in out.iterdir()}
    assert {"report.json", "episodes.parquet", "episodes.jsonl"} <= set(written)
    written["page.html"] = (tmp_path / "page.html").read_text()
    assert {name: leaks(text) for name, text in written.items()} == {name: [] for name in written}


def test_the_page_of_episodes_written_before_redaction_hides_their_secrets(tmp_path, capsys):
    run = tmp_path / "old"
    run.mkdir()
    error = f"reset failed: ServerLost: MCP server `srv --api-key {API_KEY} {DATABASE_URL}`: could not start"
    episode = {"task_id": 0, "env": "mcp", "end_reason": "env_error", "error": error, "turns": []}
    (run / "episodes.jsonl").write_text(json.dumps(episode) + "\n")
    (run / "config.yaml").write_text(f"seed: 0\nplugins:\n  mcp:\n    env:\n      GITHUB_PAT: {PAT}\n")
    code, _, err = cli_exit(capsys, "view", str(run), "--out", str(tmp_path / "page.html"))
    assert code in (0, None), err
    assert leaks((tmp_path / "page.html").read_text()) == []


def test_a_config_read_back_asks_for_the_secrets_it_does_not_hold(tmp_path):
    """A resumed run starts from its config.yaml: a server must not be started with ``<redacted>`` for a key."""
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config(EvalRunConfig, None, list(OVERRIDES))))
    with pytest.raises(ConfigError, match=r"plugins.mcp.command is .*<redacted>.*give it again on the command line"):
        load_config(EvalRunConfig, str(saved), [])
    again = [f"plugins.mcp.command={FAILING}", f"plugins.mcp.env.GITHUB_PAT={PAT}"]
    with pytest.raises(ConfigError, match=r"plugins.mcp.env.DATABASE_URL is '<redacted>'"):
        load_config(EvalRunConfig, str(saved), again)
    cfg = load_config(EvalRunConfig, str(saved), [*again, f"plugins.mcp.env.DATABASE_URL={DATABASE_URL}"])
    assert cfg.plugins["mcp"]["env"] == {"GITHUB_PAT": PAT, "DATABASE_URL": DATABASE_URL}
