"""MkDocs hook: fill docs/layout.md's ``<!-- module-map -->`` with every module of ``omrl/``, package by
package, each with the first sentence of its own docstring. The map is read from the code each time
the site is built, so it never misses a module (``tests/docs/test_module_map.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

MARKER = "<!-- module-map -->"
CORE = Path(__file__).resolve().parents[2] / "omrl"


def first_sentence(docstring: str) -> str:
    """The docstring's first sentence, its RST roles and literals as plain code."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`(:])", paragraph, maxsplit=1)[0]
    sentence = re.sub(r":(?:mod|func|class|meth|data|attr):`~?([^`]+)`", r"`\1`", sentence)
    return sentence.replace("``", "`").replace("|", "\\|")


def module_map(core: Path = CORE) -> str:
    """One table per package: module, and what it is."""
    out = []
    for package in sorted({p.parent for p in core.rglob("*.py") if "assets" not in p.parts}):
        rows = []
        for path in sorted(package.glob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            rows.append(f"| `{path.name}` | {first_sentence(doc)} |")
        name = package.relative_to(core.parent).as_posix()
        out.append(f"### `{name}/`\n\n| module | what it is |\n|---|---|\n" + "\n".join(rows))
    return "\n\n".join(out)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return markdown.replace(MARKER, module_map()) if MARKER in markdown else markdown
