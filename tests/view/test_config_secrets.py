"""A run's config.yaml never shows a secret on the page or in a saved one: not when it does not parse as
YAML, not in a comment, not in a file that parses to something other than a mapping."""

from __future__ import annotations

import pytest

from omrl.view import open_run
from omrl.view.configtext import redact_lines
from omrl.view.page import write_page

from .conftest import write_metrics

BROKEN = (
    "model:\n  name: tiny\nplugins:\n  judge:\n    api_key: sk-SECRETVALUE123\n"
    "    url: https://me:hunter2pass@example.com/v1\n\tbad_indent: [\n"
)
COMMENTED = "model:\n  name: tiny\n# judge api_key: sk-COMMENTSECRET999 (old key)\nplugins: {}\n"
NOT_A_MAPPING = "# token: sk-LISTSECRET777\n- a\n- b\n"


def run_with_config(folder, text):
    folder.mkdir()
    (folder / "config.yaml").write_text(text)
    write_metrics(folder / "metrics.jsonl")
    return folder


@pytest.mark.parametrize(
    "text, secrets",
    [
        (BROKEN, ("sk-SECRETVALUE123", "hunter2pass")),
        (COMMENTED, ("sk-COMMENTSECRET999",)),
        (NOT_A_MAPPING, ("sk-LISTSECRET777",)),
    ],
    ids=["not-yaml", "in-a-comment", "not-a-mapping"],
)
def test_no_secret_of_the_config_reaches_the_page(tmp_path, text, secrets):
    store = open_run(run_with_config(tmp_path / "run", text))
    shown = store.overview()["config"]
    saved, _ = write_page(store, tmp_path / "page.html")
    for secret in secrets:
        assert secret not in shown
        assert secret not in saved.read_text()
    assert "name: tiny" in shown or "- a" in shown  # the rest is still shown


def test_a_config_that_does_not_parse_is_named_and_shown_redacted(tmp_path):
    store = open_run(run_with_config(tmp_path / "run", BROKEN))
    assert any("not valid YAML" in p.message for p in store.problems)
    assert "    api_key: <redacted>\n    url: https://me:<redacted>@example.com/v1\n" in store.overview()["config"]


def test_a_config_omrl_wrote_is_shown_as_written(tmp_path):
    import yaml

    written = yaml.safe_dump(
        {"model": {"name": "tiny"}, "algorithm": {"advantage": "grpo", "eps": 1e-6}}, sort_keys=False
    )
    store = open_run(run_with_config(tmp_path / "run", written))
    assert store.overview()["config"] == written


def test_lines_below_a_secret_key_and_an_env_mapping_are_redacted():
    text = "a:\n  token: |\n    sk-BLOCK\n  mcp:\n    env:\n      DATABASE_URL: pg://x\n  b: [\n"
    shown = redact_lines(text)
    assert "sk-BLOCK" not in shown and "pg://x" not in shown
    assert "      DATABASE_URL: <redacted>\n  b: [\n" in shown
