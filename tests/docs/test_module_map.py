"""The module map (docs/layout.md, built from the code) and the package docstrings name every module of
``omrl/``: a module added anywhere is described where a contributor looks for it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import omrl

CORE = Path(omrl.__file__).parent
HOOK = CORE.parent / "docs" / "hooks" / "module_map.py"


def _hook():
    spec = importlib.util.spec_from_file_location("module_map_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _modules():
    return [p for p in sorted(CORE.rglob("*.py")) if "assets" not in p.parts]


def test_every_module_says_what_it_is_in_its_first_sentence():
    hook = _hook()
    vague = []
    for path in _modules():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        sentence = hook.first_sentence(doc)
        if not 15 <= len(sentence) <= 400:
            vague.append(f"{path.relative_to(CORE.parent)}: {sentence!r}")
    assert not vague, "give each module a first sentence that says what it is:\n" + "\n".join(vague)


def test_the_layout_page_maps_every_module():
    page = (CORE.parent / "docs" / "layout.md").read_text()
    built = _hook().on_page_markdown(page)
    assert "<!-- module-map -->" in page and "<!-- module-map -->" not in built
    missing = [str(p.relative_to(CORE.parent)) for p in _modules() if f"| `{p.name}` |" not in built]
    assert not missing, missing
    # a table per package, the training scaffold described from its docstring
    assert "### `omrl/training/`" in built and "| `recipe.py` | The one scaffold of every training recipe" in built


def test_each_package_docstring_names_every_module_of_the_package():
    """A package's own map (its __init__ docstring) is complete: ``name`` or ``name.py`` for each module,
    and the command modules of ``omrl/cli`` as ``<command>_cmd.py``."""
    missing = []
    for init in sorted(CORE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for path in sorted(init.parent.glob("*.py")):
            if path.name == "__init__.py" or (path.stem.endswith("_cmd") and "<command>_cmd.py" in doc):
                continue
            if path.stem not in doc:
                missing.append(f"{init.parent.relative_to(CORE.parent)}: {path.stem}")
    assert not missing, "name these modules in their package's docstring:\n" + "\n".join(missing)
