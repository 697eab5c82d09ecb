"""The plugin manager: loads every plugin in the ``omrl`` entry-point group.

Built-ins (``plugins/``) and third-party packages load the same way. Set
``OMRL_PLUGINS`` to a comma-separated list of distribution names to load only
those (``OMRL_PLUGINS=omrl`` loads the built-ins alone; tests use it so that
installed third-party plugins cannot leak in). Set ``OMRL_TRACE_HOOKS=1`` to
print every hook call.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import os
import sys
import traceback
from types import TracebackType

import pluggy

from omrl import hookspecs
from omrl.errors import PluginError

ENTRY_POINT_GROUP = "omrl"

pm = pluggy.PluginManager("omrl")
pm.add_hookspecs(hookspecs)

# plugin name -> distribution name, for provenance in `omrl plugins` and errors
_distributions: dict[str, str] = {}
#: the top-level packages of omrl's own code, its built-in plugins included
OWN_PACKAGES = ("omrl", "omrl_plugins", "omrl_configs")
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
    found = [  # (distribution, its omrl entry points), in the order they load
        (dist_name, [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP])
        for dist in importlib.metadata.distributions()
        for dist_name in [(dist.metadata["Name"] or "").lower().replace("_", "-")]
        if allowed is None or dist_name in allowed
    ]
    others = sorted({name for name, eps in found if eps})
    if allowed is not None and allowed - set(others):  # a misspelt name would leave its plugins out, silently
        installed = sorted(
            {(d.metadata["Name"] or "").lower().replace("_", "-") for d in importlib.metadata.distributions()
             if any(ep.group == ENTRY_POINT_GROUP for ep in d.entry_points)}
        )  # fmt: skip
        unknown = sorted(allowed - set(others))
        close = difflib.get_close_matches(unknown[0], installed, n=1)
        raise PluginError(
            f"OMRL_PLUGINS names {', '.join(unknown)}, which no installed distribution with omrl plugins is"
            f"{f' (did you mean {close[0]}?)' if close else ''}; installed: {', '.join(installed)}"
        )
    for dist_name, eps in found:
        for ep in eps:
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
                    f"plugin {ep.name!r} from {dist_name} failed to import: {type(exc).__name__}: {exc}; "
                    + go_on(dist_name, others)
                ) from exc
            try:
                pm.register(module, name=ep.name)
            except pluggy.PluginValidationError as exc:
                if pm.is_registered(module):
                    pm.unregister(module)
                raise PluginError(
                    f"plugin {ep.name!r} ({dist_name}): {wrong_arguments(module) or _one_line(exc)}; "
                    + go_on(dist_name, others)
                ) from exc
            unheard = unheard_hooks(module)
            if unheard:
                pm.unregister(module)
                raise PluginError(f"plugin {ep.name!r} ({dist_name}): {unheard}; " + go_on(dist_name, others))
            _distributions[ep.name] = dist_name
    try:
        pm.check_pending()  # a hook of no spec (a misspelt name) would never be called
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        dist_name = _distributions.get(name, "-")
        unknown = sorted(
            hook
            for hook, caller in vars(pm.hook).items()
            if not hook.startswith("_")
            and not caller.has_spec()
            and any(impl.plugin is exc.plugin for impl in caller.get_hookimpls())
        )
        close = difflib.get_close_matches(unknown[0], HOOKS, n=1) if unknown else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PluginError(
            f"plugin {name!r} ({dist_name}) implements {', '.join(map(repr, unknown)) or 'a hook'}, which omrl "
            f"does not call{hint}; valid hooks: {', '.join(HOOKS)}; " + go_on(dist_name, others)
        ) from exc
    if os.environ.get("OMRL_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


#: the hooks a plugin may implement (omrl.hookspecs)
HOOKS = [name for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and hasattr(fn, "omrl_spec")]


def go_on(dist_name: str, loaded: list[str]) -> str:
    """How to run omrl without the distribution ``dist_name``: load the others alone, or uninstall it."""
    rest = [name for name in loaded if name != dist_name]
    keep = f"OMRL_PLUGINS={','.join(rest)} (loads those alone), or " if rest else ""
    return f"to go on without it: {keep}pip uninstall {dist_name}"


def wrong_arguments(plugin: object) -> str | None:
    """What a hook of ``plugin`` takes that its spec does not pass (``register_envs(reg)``), or None."""
    for name in HOOKS:
        impl = getattr(plugin, name, None)
        if impl is None or pm.parse_hookimpl_opts(plugin, name) is None:
            continue
        spec = list(inspect.signature(getattr(hookspecs, name)).parameters)
        taken = [p for p in inspect.signature(impl).parameters if p != "self"]
        wrong = [p for p in taken if p not in spec]
        if wrong:
            return (
                f"its hook {name}({', '.join(taken)}) takes {', '.join(map(repr, wrong))}, which omrl does "
                f"not pass; valid: {name}({', '.join(spec)})"
            )
    return None


def unheard_hooks(plugin: object) -> str | None:
    """A hook of ``plugin`` that omrl would never hear from, or None: a function of a hook's name without
    ``@hookimpl`` (pluggy passes over it), or one that takes nothing and so can give omrl nothing."""
    for name in HOOKS:
        impl = getattr(plugin, name, None)
        if not callable(impl):
            continue
        spec = list(inspect.signature(getattr(hookspecs, name)).parameters)
        if pm.parse_hookimpl_opts(plugin, name) is None:
            return (
                f"its {name} is not marked as a hook, so omrl never calls it; decorate it with @hookimpl "
                "(from omrl.hookspecs import hookimpl)"
            )
        if not [p for p in inspect.signature(impl).parameters if p != "self"]:
            return f"its hook {name}() takes nothing, so it can give omrl nothing; valid: {name}({', '.join(spec)})"
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def distribution_of(plugin_name: str) -> str:
    """The distribution that provides a plugin ('-' for one registered in code)."""
    return _distributions.get(plugin_name, "-")


def plugin_site(exc: BaseException | None) -> str:
    """`` (in plugin NAME (DISTRIBUTION) at FILE:LINE)`` where a third-party plugin's code raised ``exc``
    (:func:`plugin_in_traceback`): where its author looks first; else ""."""
    where = plugin_in_traceback(exc.__traceback__) if exc is not None else None
    return f" (in {where})" if where else ""


def plugin_in_traceback(tb: TracebackType | None) -> str | None:
    """``plugin NAME (DISTRIBUTION) at FILE:LINE``: the innermost frame of ``tb`` in the package of a
    plugin that is not omrl's own (a built-in's error is omrl's), or None when no such frame ran. Where a
    package holds several plugins, the one whose module holds the frame (or is above it) is named; a frame
    in a module of none of them names the distribution's plugins together."""
    plugins: dict[str, list[tuple[str, str]]] = {}  # top-level package -> (module, plugin name) of each
    for name, plugin in pm.list_name_plugin():
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        top = module.partition(".")[0]
        if top not in OWN_PACKAGES:
            plugins.setdefault(top, []).append((module, name))
    for frame, line in reversed(list(traceback.walk_tb(tb))):
        where = str(frame.f_globals.get("__name__", ""))
        found = plugins.get(where.partition(".")[0])
        if not found:
            continue
        holding = [(module, name) for module, name in found if where == module or where.startswith(module + ".")]
        names = [max(holding, key=lambda held: len(held[0]))[1]] if holding else sorted(name for _, name in found)
        return (
            f"plugin {' or '.join(map(repr, names))} ({distribution_of(names[0])}) at {frame.f_code.co_filename}:{line}"
        )
    return None


def import_from_here() -> None:
    """Let a module beside the user import by name, as ``python -m`` finds it: a user's agent, reward or
    environment module named in a run's options (``mypkg.agent:run``, ``plugins.verifiers.module``)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
