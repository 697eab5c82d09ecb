"""WebShop's search index leaves jax alone: bm25s would start it at import, and on a GPU machine a started
JAX takes 75% of the GPU's memory (seen on an H100 by scripts/gpu_check.sh: 60 GiB gone)."""

from __future__ import annotations

import subprocess
import sys


def test_the_search_index_never_imports_jax(tmp_path):
    fake = tmp_path / "jax"
    fake.mkdir()
    marker = tmp_path / "jax-started"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (fake / "lax.py").write_text("def top_k(scores, k):\n    return scores[:k], list(range(k))\n")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from omrl_plugins.envs.webshop.catalog import Product\n"
        "from omrl_plugins.envs.webshop.search import SearchIndex\n"
        "shoe = Product('A1', 'red running shoe', 'shoes', 'shoe', 'shoes', 9.0, '$9.0', {}, (), 'light', (), '5', ())\n"
        "print(SearchIndex([shoe]).search('running shoes'))\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "('A1',)" in run.stdout
    assert not marker.exists(), "bm25s imported jax"
