"""The plugin manager: loads every plugin in the ``omrl`` entry-point group.

Built-ins (``plugins/``) and third-party packages load the same way. Set
``OMRL_PLUGINS`` to a comma-separated list of distribution names to load only
those (``OMRL_PLUGINS=omrl`` loads the built-ins alone; tests use it so that
installed third-party plugins cannot leak in). Set ``OMRL_TRACE_HOOKS=1`` to
print every hook call.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

import pluggy

from omrl import hookspecs
from omrl.errors import PluginError

ENTRY_POINT_GROUP = "omrl"

pm = pluggy.PluginManager("omrl")
pm.add_hookspecs(hookspecs)

# plugin name -> distribution name, for provenance in `omrl plugins` and errors
_distributions: dict[str, str] = {}
_loaded = False


def allowed_distributions() -> set[str] | None:
    """The distributions OMRL_PLUGINS allows, or None when it is unset (all)."""
    value = os.environ.get("OMRL_PLUGINS")
    if value is None:
        return None
    return {name.strip().lower().replace("_", "-") for name in value.split(",") if name.strip()}


def load_plugins() -> pluggy.PluginManager:
    """Load the entry-point plugins once and return the plugin manager."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    allowed = allowed_distributions()
    for dist in importlib.metadata.distributions():
        dist_name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if allowed is not None and dist_name not in allowed:
            continue
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP:
                continue
            if ep.name in _distributions:
                if _distributions[ep.name] == dist_name:
                    continue  # the same distribution seen twice on sys.path
                raise PluginError(
                    f"two distributions declare the omrl plugin {ep.name!r}: "
                    f"{_distributions[ep.name]} and {dist_name}; uninstall one"
                )
            try:
                module = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {ep.name!r} from {dist_name} failed to import: {type(exc).__name__}: {exc}"
                ) from exc
            pm.register(module, name=ep.name)
            _distributions[ep.name] = dist_name
    if os.environ.get("OMRL_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


def distribution_of(plugin_name: str) -> str:
    """The distribution that provides a plugin ('-' for one registered in code)."""
    return _distributions.get(plugin_name, "-")
