"""MkDocs hook: the repository's CONTRIBUTING.md becomes the site's ``contributing.md`` page.

CONTRIBUTING.md lives at the root, where GitHub shows it, and links the docs as ``docs/<page>.md``;
on the site those pages sit beside it, so ``](docs/`` becomes ``](``. Any other relative link in it
would point outside the site, and the strict build fails on it.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

SOURCE = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def on_files(files, config):
    text = SOURCE.read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "contributing.md", content=text))
    return files
