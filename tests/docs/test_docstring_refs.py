"""Every Sphinx-style cross-reference in a docstring of ``omrl/`` or ``plugins/`` (``:func:`x```,
``:class:`~omrl.y.Z```...) names something that exists: a function that moves or goes leaves no
docstring pointing at it."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "omrl").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])
REFERENCE = re.compile(r":(?:meth|func|class|mod|attr|data|exc):`~?([A-Za-z_][\w.]*)(?:\(\))?`")


def _defines(text: str, name: str) -> bool:
    """Whether ``text`` (a module's or a class's source) defines, assigns or imports ``name``."""
    pattern = rf"(def {name}\b|class {name}\b|^\s*{name}\s*[:=]|self\.{name}\s*[:=]|import .*\b{name}\b)"
    return re.search(pattern, text, re.M) is not None


def _absolute(target: str) -> bool | None:
    """Whether the dotted ``target`` resolves from the longest module prefix that imports (an attribute
    set in ``__init__`` counts when its class's source assigns it); None when no prefix is a module."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for index, part in enumerate(parts[cut:], start=cut):
            if not hasattr(found, part):
                last = index == len(parts) - 1
                return last and inspect.isclass(found) and _defines(inspect.getsource(found), part)
            found = getattr(found, part)
        return True
    return None


def _all_source() -> str:
    return "\n".join(path.read_text() for path in SOURCES)


def test_every_cross_reference_in_a_docstring_names_something_that_exists():
    everything = _all_source()
    unresolved = []
    for path in SOURCES:
        text = path.read_text()
        for match in REFERENCE.finditer(text):
            target = match[1]
            head, *rest = target.split(".")
            found = _absolute(target) if head in ("omrl", "omrl_plugins") or rest else None
            if found is None:  # a name of this module (or imported into it), then perhaps its member
                found = _defines(text, head) and (not rest or _defines(everything, rest[-1]))
            if not found:
                line = text.count("\n", 0, match.start()) + 1
                unresolved.append(f"{path.relative_to(ROOT)}:{line}: {match[0]}")
    assert not unresolved, (
        "docstring references to nothing (write the full path, e.g. :func:`~omrl.x.f`):\n" + "\n".join(unresolved)
    )


@pytest.mark.parametrize(
    "text, expected",
    [(":func:`~omrl.chat.encoding.encode_reply`", True), (":func:`omrl.chat.specials.encode_reply`", False)],
)
def test_a_reference_to_a_function_that_moved_is_caught(text, expected):
    assert _absolute(REFERENCE.search(text)[1]) is expected
