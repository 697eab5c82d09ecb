"""Finding installed verifiers environment packages from package metadata, nothing imported: each is registered
as ``verifiers:<module>``."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re

NAME = "verifiers"  # the env's name, the PyPI package's and the extra's


def module_name(env_id: str) -> str:
    """The module of an environment id, as verifiers names it: ``owner/vf-wordle`` -> ``vf_wordle``."""
    return env_id.replace("-", "_").split("/")[-1]


@functools.cache
def installed_environments() -> tuple[str, ...]:
    """The modules of installed verifiers environment packages, read from package metadata (nothing imported):
    distributions that need ``verifiers`` (not as an extra) whose top-level module names ``load_environment``.
    Read once per process."""
    found = set()
    for dist in importlib.metadata.distributions():
        if any(_needs_verifiers(line) for line in dist.requires or []):
            found.update(module for module in _top_modules(dist) if _mentions_load_environment(dist, module))
    return tuple(sorted(found))


def _needs_verifiers(requirement: str) -> bool:
    """Whether a ``Requires-Dist`` line asks for verifiers itself (``verifiers>=0.3``), not for an extra."""
    spec, _, marker = requirement.partition(";")
    return re.split(r"[\s\[(<>=!~]", spec.strip(), maxsplit=1)[0].lower() == NAME and "extra" not in marker


def _top_modules(dist: importlib.metadata.Distribution) -> list[str]:
    """A distribution's top-level modules: its ``top_level.txt``, its files, or (an editable install) its name."""
    listed = (dist.read_text("top_level.txt") or "").split()
    files = [str(path) for path in dist.files or []]
    listed += [f[:-3] for f in files if "/" not in f and f.endswith(".py")]
    listed += [f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith("/__init__.py")]
    return sorted(set(listed)) or [module_name(dist.metadata["Name"] or "")]


def _mentions_load_environment(dist: importlib.metadata.Distribution, module: str) -> bool:
    for relative in (f"{module}.py", f"{module}/__init__.py"):
        path = dist.locate_file(relative)
        if path.is_file():
            return "load_environment" in path.read_text(encoding="utf-8", errors="replace")
    try:  # an editable install: the module is elsewhere on the path
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8", errors="replace") as source:
        return "load_environment" in source.read()
