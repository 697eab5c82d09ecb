"""The core's shape: omrl/ reaches built-in plugins only through the registry, as it reaches
third-party ones, so a built-in can be removed or replaced like any installed plugin."""

from __future__ import annotations

import ast
from pathlib import Path

import omrl

CORE = Path(omrl.__file__).parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_no_core_module_imports_a_built_in_plugin():
    offenders = [
        f"{path.relative_to(CORE.parent)}:{line} imports {module}"
        for path in sorted(CORE.rglob("*.py"))
        for line, module in _imported_modules(path)
        if module == "omrl_plugins" or module.startswith("omrl_plugins.")
    ]
    assert not offenders, "the core must reach plugins through the registry:\n" + "\n".join(offenders)


def test_the_check_sees_every_kind_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import omrl_plugins.algos\nfrom omrl_plugins.algos import gae\nimportlib.import_module('omrl_plugins.envs')\n"
    )
    assert [m for _, m in _imported_modules(sample)] == [
        "omrl_plugins.algos",
        "omrl_plugins.algos",
        "omrl_plugins.envs",
    ]
