"""Loading a verifiers environment: importing ``verifiers.legacy`` with its process hooks turned off, then calling
a module's ``load_environment(**args)``, each failure a ConfigError naming what is wrong.

verifiers' ``Environment`` installs SIGINT/SIGTERM handlers and an atexit teardown for every instance: omrl
keeps its own handlers (those would replace them, and fail off the main thread) and runs the teardown at
``close`` (or at exit).
"""

from __future__ import annotations

import atexit
import importlib
import signal
from typing import Any

from omrl.envs import check_arguments
from omrl.errors import ConfigError, short_repr
from omrl.plugins import import_from_here
from omrl_plugins.envs.engines.common import require
from omrl_plugins.envs.verifiers.installed import NAME, installed_environments


class _Inert:
    """A module as verifiers' environment module sees it: ``signal.signal`` and ``atexit.register`` do nothing."""

    def __init__(self, module: Any):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def signal(self, *args: Any) -> None:
        return None

    def register(self, *args: Any, **kwargs: Any) -> None:
        return None


def import_verifiers(env_name: str) -> Any:
    """``verifiers.legacy`` (the classic environments), with its per-instance process hooks turned off."""
    require("verifiers", env_name, NAME)
    try:
        vf = importlib.import_module("verifiers.legacy")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{env_name}: the installed verifiers has no classic environments (verifiers.legacy: {exc}); omrl plays "
            "verifiers 0.3.1's SingleTurnEnv, MultiTurnEnv and ToolEnv: pip install 'omrl[verifiers]'"
        ) from exc
    environment = importlib.import_module("verifiers.legacy.envs.environment")
    if not isinstance(environment.signal, _Inert):
        environment.signal, environment.atexit = _Inert(signal), _Inert(atexit)
    return vf


def load(module: str, args: dict[str, Any], env_name: str) -> Any:
    """``module.load_environment(**args)``; ConfigError naming what is wrong."""
    import_from_here()  # a module of the user's, beside them, as an agent's is
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ConfigError(
                f"{env_name}: no module {module!r} (install the environment's package, or run omrl from the folder "
                f"that holds its module); installed verifiers environments: {', '.join(installed_environments()) or '(none)'}"
            ) from exc
        raise ConfigError(f"{env_name}: module {module!r} needs a package that is not installed: {exc}") from exc
    load_environment = getattr(loaded, "load_environment", None)
    if not callable(load_environment):
        raise ConfigError(f"{env_name}: module {module!r} has no load_environment(); a verifiers environment has one")
    check_arguments(load_environment, args, f"{env_name}: load_environment", "args")
    try:
        env = load_environment(**args)
    except Exception as exc:
        raise ConfigError(
            f"{env_name}: load_environment({_arguments(args)}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    env.env_id = getattr(env, "env_id", "") or module
    env.env_args = getattr(env, "env_args", None) or dict(args)
    return env


def _arguments(args: dict[str, Any]) -> str:
    return ", ".join(f"{key}={short_repr(value)}" for key, value in args.items())
