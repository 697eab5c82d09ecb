"""The core's shape: omrl/ reaches built-in plugins only through the registry, as it reaches
third-party ones, so a built-in can be removed or replaced like any installed plugin; omrl/chat/'s
modules are layered, each importing only those below it; and no module of omrl/ or plugins/ grows past
400 lines (past that it is two things, and should be two modules)."""

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


MAX_MODULE_LINES = 400


def test_no_module_grows_past_400_lines():
    too_long = [
        f"{path.relative_to(CORE.parent)}: {lines} lines"
        for root in (CORE, CORE.parent / "plugins")
        for path in sorted(root.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not too_long, f"split these modules (at most {MAX_MODULE_LINES} lines each):\n" + "\n".join(too_long)


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


# omrl/chat/'s modules, bottom first: each imports only modules listed before it (issue 52), so an env
# observation's way to its trained ids only ever goes down: history, increments, pieces, render, encoding
CHAT_ORDER = (
    # text only: no template, no tokenizer
    "bounded_render",
    "template_check",
    "tool_formats",
    "tool_literals",
    "tool_calls",
    # text to ids, messages to text, and what is learned by rendering
    "encoding",
    "render",
    "replies",
    # a turn: its text, its ids, the history it extends
    "pieces",
    "increments",
    "history",
    # whole conversations, and `omrl check-template`
    "conversation",
    "probe",
    "conformance",
)
CHAT = CORE / "chat"


def _chat_imports(path: Path) -> list[tuple[int, str]]:
    """The modules of omrl.chat that the module at ``path`` (inside omrl/chat/) imports, anywhere in it, by
    their names there (``__init__``: the package itself)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = "omrl.chat" if node.level == 1 else "omrl" if node.level == 2 else ""
            base = ".".join(part for part in (package, node.module or "") if part)
            # `from omrl.chat import pieces` imports a module; `from omrl.chat import render`'s module too
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}".removeprefix("omrl.chat.") in CHAT_ORDER else base
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            targets = [str(node.args[0].value)]
        for target in targets:
            if target == "omrl.chat":
                found.append((node.lineno, "__init__"))
            elif target.startswith("omrl.chat."):
                found.append((node.lineno, target.split(".")[2]))
    return found


def _chat_layer_offenders(path: Path, name: str) -> list[str]:
    """Each import in omrl/chat/``name``.py of a module not below it in :data:`CHAT_ORDER` (the package's
    own ``__init__`` is above every module)."""
    rank = CHAT_ORDER.index(name)
    return [
        f"omrl/chat/{name}.py:{line} imports omrl.chat{'' if target == '__init__' else '.' + target}"
        for line, target in _chat_imports(path)
        if target not in CHAT_ORDER[:rank]
    ]


def test_every_chat_module_has_a_layer():
    modules = {path.stem for path in CHAT.glob("*.py")} - {"__init__"}
    assert modules == set(CHAT_ORDER), "place each omrl/chat module in CHAT_ORDER, bottom first"


def test_chat_layers_import_only_downwards():
    offenders = [line for name in CHAT_ORDER for line in _chat_layer_offenders(CHAT / f"{name}.py", name)]
    assert not offenders, "an omrl/chat module imports one at or above its layer:\n" + "\n".join(offenders)


def test_the_chat_layer_check_sees_every_kind_of_import(tmp_path):
    sample = tmp_path / "pieces.py"
    sample.write_text(
        "from omrl.chat.render import render\n"
        "import omrl.chat.increments\n"
        "from omrl.chat import encoding, next_prompt\n"
        "from . import history\n"
        "from .conversation import conversation_rows\n"
        "def late():\n"
        "    from omrl.chat.probe import check_template\n"
        "    importlib.import_module('omrl.chat.conformance')\n"
    )
    assert sorted(_chat_layer_offenders(sample, "pieces")) == [
        "omrl/chat/pieces.py:2 imports omrl.chat.increments",
        "omrl/chat/pieces.py:3 imports omrl.chat",  # the package: next_prompt, not a module
        "omrl/chat/pieces.py:4 imports omrl.chat.history",
        "omrl/chat/pieces.py:5 imports omrl.chat.conversation",
        "omrl/chat/pieces.py:7 imports omrl.chat.probe",
        "omrl/chat/pieces.py:8 imports omrl.chat.conformance",
    ]
