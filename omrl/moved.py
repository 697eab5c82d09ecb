"""Old import paths of modules that moved, kept working with a :class:`DeprecationWarning`.

``import omrl.options`` still gives the module now at ``omrl.config.options`` (the same object,
so a patch through either name reaches both). :func:`alias_moved_modules` is how a package
declares its own moves; omrl declares the core's here and the built-in plugins declare theirs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "omrl.options": "omrl.config.options",
    "omrl.model_delta": "omrl.models.delta",
    "omrl.builtin_models": "omrl.models.builtin",
    "omrl.serve_store": "omrl.serve.store",
    "omrl.serve_guard": "omrl.serve.guard",
    "omrl.sandbox_child": "omrl.sandbox.child",
    "omrl.datasets": "omrl.data.conversations",
    "omrl.chat_cache": "omrl.chat.pieces",
    "omrl.chat_template_check": "omrl.chat.template_check",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: dict[str, str]):
        self.moved = moved

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in self.moved else None

    def create_module(self, spec):
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module):
        new = self.moved[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        # The import system returns what sys.modules holds under the old name once this returns.
        sys.modules[module.__name__] = importlib.import_module(new)


def alias_moved_modules(moved: dict[str, str]) -> None:
    """Make each old module name in ``moved`` import the module at its new name, with a warning."""
    sys.meta_path.append(_MovedFinder(moved))
