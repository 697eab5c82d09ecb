"""The documentation site builds with warnings as errors (broken links, missing pages, a broken hook), with
its generated pages: the CLI reference and CONTRIBUTING.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.docs.commands import REPO


@pytest.mark.slow  # builds the whole site in a fresh interpreter (CONTRIBUTING.md's docs command)
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "OMRL_PLUGINS": "omrl"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (site / "cli" / "index.html").read_text(encoding="utf-8")
    # the hook filled the page from the code: every command and every config class is there
    assert "<!-- cli-commands -->" not in reference and "<!-- config-keys -->" not in reference
    for anchor in ("omrl-train", "omrl-rm-train", "omrl-env-serve", "omrl-checkpoint-trust", "config-keys", "rm-train"):
        assert f'id="{anchor}"' in reference, anchor
    assert "optim.learning_rate" in reference
    # a help's <placeholder> reaches the page as text, not as a tag the browser hides ("runs/--")
    assert "runs/&lt;algo&gt;-&lt;env&gt;-&lt;time&gt;" in reference and "runs/<algo>" not in reference
    # CONTRIBUTING.md is a page of the site, its links to docs/ pages pointing at the site's own
    contributing = (site / "contributing" / "index.html").read_text(encoding="utf-8")
    assert "Layers: what may import what" in contributing
    assert 'href="../layout/"' in contributing and "docs/layout.md" not in contributing
    # every page works offline: no script or stylesheet from another host (the theme's highlight.js CDN)
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        fetched = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        assert not fetched, (page, fetched)
    assert 'class="codehilite"' in reference  # the code is coloured at build time
