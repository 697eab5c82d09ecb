"""docs/templates.md's worked example runs as written: a tiny Qwen3 with Qwen3's own chat template,
trained and evaluated with thinking off and on, each run's option reaching its eval's prompts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from omrl.data.trajectory import read_episodes
from omrl.models import load_tokenizer
from tests.docs.commands import run_each

DOC = Path(__file__).resolve().parents[2] / "docs" / "templates.md"


def block(name: str) -> str:
    """The code block under the page's ``<!-- doc-test: NAME -->`` (a fence's info string takes a language
    alone: the site's renderer shows a fence with more as plain text)."""
    pattern = rf"^<!-- doc-test: {re.escape(name)} -->\n```\w+\n(.*?)^```"
    (found,) = re.findall(pattern, DOC.read_text(encoding="utf-8"), flags=re.S | re.M)
    return found


def test_no_fence_of_the_docs_carries_more_than_a_language():
    """```python tiny_qwen3.py rendered as a paragraph of text, its line breaks lost."""
    pages = [*DOC.parent.glob("*.md"), DOC.parents[1] / "README.md", DOC.parents[1] / "CONTRIBUTING.md"]
    bad = [
        f"{page.name}: {line}" for page in pages for line in page.read_text().splitlines() if re.match(r"```\w+ ", line)
    ]
    assert not bad, bad


@pytest.mark.slow  # a model built, two trains and two evals
def test_the_thinking_example_runs_and_each_eval_prompts_as_its_run_trained(tmp_path):
    (tmp_path / "tiny_qwen3.py").write_text(block("tiny_qwen3.py"), encoding="utf-8")
    commands = [line for line in block("thinking-example").splitlines() if line.strip()]
    assert len(commands) == 6 and sum("enable_thinking=" in line for line in commands) == 2
    run_each(commands, tmp_path)
    tokenizer = load_tokenizer(str(tmp_path / "tiny-qwen3"))
    for name, thinking in (("qwen3-no-thinking", False), ("qwen3-thinking", True)):
        config = yaml.safe_load((tmp_path / "runs" / name / "config.yaml").read_text())
        assert config["chat"]["template_kwargs"] == {"enable_thinking": thinking}
        episodes = read_episodes(tmp_path / "evals" / name / "episodes.parquet")
        prompts = [tokenizer.decode(ep.token_ids[: ep.prompt_length]) for ep in episodes]
        assert len(prompts) == 2
        for prompt in prompts:
            assert prompt.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")), prompt
