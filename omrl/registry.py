"""Registries of components (envs, rewards, templates, algorithms, rollout strategies), built lazily from hooks.

Each lookup asks the plugins again, so a plugin registered in a test fixture is
seen at once and gone once it is unregistered.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import importlib
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import PluginError, UnknownNameError, short_repr
from omrl.plugins import distribution_of, load_plugins

#: what a plugin may register instead of an object: its import path, imported on first use
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

ALGORITHM_KINDS = ("advantage", "policy_loss", "kl", "rollout_correction")
STRATEGY_KINDS = ("strategy", "scorer")
#: what an unknown name of a kind is called, where the kind's own name would not say it
KIND_LABELS = {"advantage": "advantage estimator", "kl": "KL estimator"}
#: the kinds whose components read their options from the config's ``plugins.<name>`` block
OPTION_KINDS = ("env", "reward", "template", "strategy", "scorer")
#: what an advantage estimator may ask the recipe to fill beyond the rollout (``needs=``)
NEEDS = ("greedy_scores",)
_FLAG = (lambda value: isinstance(value, bool), "True or False")
#: the traits a kind may declare, ``register(name, obj, kind=KIND, **traits)``: each trait's check and what
#: it takes (omrl.algos documents the algorithms', omrl.search.StrategyTraits the strategies')
TRAITS: dict[str, dict[str, tuple[Any, str]]] = {
    "advantage": {
        "needs": (
            lambda value: isinstance(value, (tuple, list)) and all(need in NEEDS for need in value),
            f"a tuple of {', '.join(NEEDS)}",
        ),
        "reads_trees": _FLAG,
    },
    "policy_loss": {"zero_advantage_rows_add_nothing": _FLAG},
    "strategy": {"group_in_one_tree": _FLAG, "batched_without_budget": _FLAG},
    "scorer": {
        "check_options": (
            callable,
            "a function that takes the scorer's options as keywords and raises ConfigError for a bad one, "
            "without scoring (omrl.cli.play_checks.check_search_blocks)",
        ),
    },
    "reward": {
        "check_options": (
            callable,
            "a function that takes the reward's options as keywords and raises ConfigError for a bad one, "
            "without scoring (omrl.rewards.check_options)",
        ),
        "check_tokenizer": (
            callable,
            "a function that takes the policy's tokenizer, then the reward's options as keywords, and raises "
            "ConfigError when the reward cannot score that tokenizer's token ids (omrl.rewards.check_tokenizer)",
        ),
        "check_reachable": (
            callable,
            "a function that takes the reward's options as keywords and raises EnvFailure when the service it "
            "calls cannot be reached, before the first rollout is played (omrl.rewards.check_reachable)",
        ),
    },
}
#: the class a component of these kinds subclasses (imported when one is checked)
BASES = {"env": "omrl.envs:Env", "template": "omrl.templates:Template"}


@dataclass(frozen=True)
class Component:
    """One registered thing and where it came from.

    ``target`` is the object, or an import path ``"package.module:attribute"`` that :attr:`obj`
    imports on first use: a plugin whose objects need a heavy import (torch) registers paths, so
    that listing it (``omrl plugins``) reads their docstrings from source and imports nothing.
    """

    kind: str  # env, reward, template, advantage, policy_loss, kl, rollout_correction, strategy, scorer
    name: str
    target: Any
    plugin: str
    distribution: str
    traits: dict[str, Any] = field(default_factory=dict)  # what the plugin declared of it (``register(..., **traits)``)

    @property
    def obj(self) -> Any:
        """The registered object (imported now when it was registered by its path)."""
        if not isinstance(self.target, str):
            return self.target
        module, _, attribute = self.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"plugin {self.plugin!r} ({self.distribution}) registered {self.kind} {self.name!r} as "
                f"{self.target!r}, which does not import: {type(exc).__name__}: {exc}"
            ) from exc
        check_object(self.kind, self.name, obj, f"plugin {self.plugin!r} ({self.distribution})", self.target)
        return obj

    @property
    def description(self) -> str:
        """The first paragraph of the object's docstring as plain text (for a path, read from its source, not
        imported)."""
        doc = source_docstring(self.target) if isinstance(self.target, str) else inspect.getdoc(self.obj)
        return plain_text((doc or "").strip().split("\n\n")[0])


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`name` -> name


def plain_text(rst: str) -> str:
    """A docstring's reStructuredText as one line of plain text: roles and ``literals`` unwrapped."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], rst)
    return " ".join(text.replace("``", "").split())


def source_docstring(path: str) -> str | None:
    """The docstring of ``"package.module:attribute"`` (a function or class defined at the module's
    top level), read from the module's source without importing it; None when not found there."""
    module, _, attribute = path.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):  # using it will say what is wrong
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attribute:
            return ast.get_docstring(node)
    return None


def _collect(hook_name: str, default_kind: str, kinds: tuple[str, ...]) -> list[Component]:
    pm = load_plugins()
    hook = getattr(pm.hook, hook_name)
    found: dict[tuple[str, str], Component] = {}
    # pluggy calls the most recently registered first; reverse for a stable, install-order listing
    for impl in reversed(hook.get_hookimpls()):
        plugin = impl.plugin_name

        def register(name: str, obj: Any, kind: str = default_kind, _plugin: str = plugin, **traits: Any) -> None:
            if kind not in kinds:
                raise PluginError(
                    f"plugin {_plugin!r} registered {name!r} with unknown kind {kind!r}; "
                    f"valid kinds: {', '.join(kinds)}"
                )
            if not isinstance(name, str) or not name:
                raise PluginError(f"plugin {_plugin!r} registered a component without a name")
            if isinstance(obj, str) and not IMPORT_PATH.fullmatch(obj):
                raise PluginError(
                    f"plugin {_plugin!r} registered {kind} {name!r} as the string {obj!r}; a string must be "
                    "an import path 'package.module:attribute' (or register the object itself)"
                )
            who = f"plugin {_plugin!r} ({distribution_of(_plugin)})"
            check_traits(kind, name, traits, _plugin)
            if not isinstance(obj, str):  # an import path is checked when it is imported (Component.obj)
                check_object(kind, name, obj, who)
            key = (kind, name)
            if key in found:
                other = found[key]
                raise PluginError(
                    f"{kind} {name!r} is registered twice: by plugin {other.plugin!r} "
                    f"({other.distribution}) and by plugin {_plugin!r} ({distribution_of(_plugin)})"
                )
            found[key] = Component(kind, name, obj, _plugin, distribution_of(_plugin), dict(traits))

        try:
            impl.function(**{arg: register for arg in impl.argnames})  # pluggy checked the names at load
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin!r} ({distribution_of(plugin)}) failed in {hook_name}: {type(exc).__name__}: {exc}"
            ) from exc
    return list(found.values())


def check_traits(kind: str, name: str, traits: dict[str, Any], plugin: str) -> None:
    """PluginError naming the valid traits of ``kind`` (:data:`TRAITS`) when ``traits`` has another, or
    a value a trait does not take: a misspelt trait would otherwise be ignored, silently."""
    valid = TRAITS.get(kind, {})
    unknown = sorted(set(traits) - set(valid))
    dist = distribution_of(plugin)
    origin = f" (distribution {dist})" if dist != "-" else ""
    if unknown:
        raise PluginError(
            f"plugin {plugin!r} registered {kind} {name!r} with traits {', '.join(unknown)}; valid: "
            f"{', '.join(valid) or f'none (a {kind} declares no traits)'}{origin}"
        )
    for trait, value in traits.items():
        ok, takes = valid[trait]
        if not ok(value):
            raise PluginError(
                f"plugin {plugin!r} registered {kind} {name!r} with {trait}={value!r}; valid: {takes}{origin}"
            )


def check_object(kind: str, name: str, obj: Any, who: str, path: str = "") -> None:
    """PluginError when ``obj`` cannot be a ``kind``: an env or template not a concrete subclass of its
    base class (:data:`BASES`; an instance, another class, an abstract one), anything else not callable.
    ``who`` names the plugin; ``path``, the import path ``obj`` was registered by."""
    base_path = BASES.get(kind)
    as_what = f" (imported from {path!r})" if path else ""
    if base_path is None:
        if not callable(obj):
            raise PluginError(
                f"{who} registered {kind} {name!r} as {short_repr(obj)}{as_what}, which is not callable; "
                f"valid: a function of the {kind} calling convention"
            )
        return
    module, _, attribute = base_path.partition(":")
    base = getattr(importlib.import_module(module), attribute)
    abstract = sorted(getattr(base, "__abstractmethods__", ()))
    if isinstance(obj, base):
        problem = f"an instance of {type(obj).__name__}, not a class (register the class itself)"
    elif not inspect.isclass(obj) or not issubclass(obj, base):
        what = f"the class {obj.__name__}" if inspect.isclass(obj) else short_repr(obj)
        problem = f"{what}, which is not a subclass of {attribute}"
    elif inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        problem = f"the class {obj.__name__}, which is abstract: it does not define {missing}"
    else:
        return
    raise PluginError(
        f"{who} registered {kind} {name!r} as {problem}{as_what}; valid: a subclass of "
        f"{base_path.replace(':', '.')} that defines {', '.join(abstract)}"
    )


def check_one_reader(component: Component) -> None:
    """PluginError naming both plugins when another kind that reads ``plugins.<name>`` options has a
    component of ``component``'s name: one block would configure both, so neither could be configured.
    Components of one distribution (or of one plugin registered in code) may share a block on purpose
    (the built-in reward and scorer ``rm`` both take a reward model's path)."""
    if component.kind not in OPTION_KINDS:
        return
    for found in ALL.values():
        if not set(found.kinds) & set(OPTION_KINDS) - {component.kind}:
            continue  # (an env's own registry holds no other kind)
        for other in found.components():
            if other.name != component.name or other.kind == component.kind or other.kind not in OPTION_KINDS:
                continue
            same = other.plugin == component.plugin or other.distribution == component.distribution != "-"
            if not same:
                first, second = sorted((component, other), key=lambda c: OPTION_KINDS.index(c.kind))
                raise PluginError(
                    f"{first.kind} {first.name!r} (plugin {first.plugin!r}, {first.distribution}) and "
                    f"{second.kind} {second.name!r} (plugin {second.plugin!r}, {second.distribution}) share a name, "
                    f"so plugins.{first.name} would configure both; valid: a name no other env, reward, template, "
                    "strategy or scorer has (rename one, or uninstall one's distribution)"
                )


def name_clashes(components: list[Component]) -> list[str]:
    """What :func:`check_one_reader` would say of each of ``components`` whose name another kind's
    component of another plugin shares, once a clash (``omrl plugins`` shows them before a run fails)."""
    said = []
    for component in components:
        try:
            check_one_reader(component)
        except PluginError as clash:
            if str(clash) not in said:
                said.append(str(clash))
    return said


def short_list(names: list[str], kind: str, most: int = 20) -> str:
    """``names`` to read in one go: a family of ``family:member`` names as ``family:* (N)``, and past
    ``most`` entries a count and where the whole list is (330 env names once filled a screen)."""
    if not names:
        return "(none registered)"
    families: dict[str, int] = {}
    for name in names:
        if ":" in name:
            family = name.split(":", 1)[0]
            families[family] = families.get(family, 0) + 1
    shown: list[str] = []
    for name in names:
        family = name.split(":", 1)[0]
        if ":" not in name or families[family] == 1:
            shown.append(name)
        elif families[family]:
            shown.append(f"{family}:* ({families[family]})")
            families[family] = 0  # listed once
    if len(shown) > most:
        more = len(shown) - most
        shown = [*shown[:most], f"and {more} more (omrl plugins --kind {kind})"]
    return ", ".join(shown)


def left_out(name: str, components: Any) -> tuple[str, str | None]:
    """The family of ``family:member`` and why it leaves ``member`` out on purpose, or None. A family
    declares what it leaves out as ``LEFT_OUT``, a dict of member names or ``fnmatch`` patterns
    (``game:Wordle-*``) to reasons, in the module of the objects it registers (read where that module
    is loaded, which a registered object's is; a family registered by import paths is not imported)."""
    family, colon, member = name.partition(":")
    if not colon:
        return family, None
    modules = {
        c.target.partition(":")[0] if isinstance(c.target, str) else getattr(c.target, "__module__", None)
        for c in components
        if c.name == family or c.name.startswith(f"{family}:")
    }
    for module in sorted(m for m in modules if m):
        reasons = getattr(sys.modules.get(module), "LEFT_OUT", None)
        if isinstance(reasons, dict):
            why = next((str(r) for key, r in reasons.items() if fnmatch.fnmatchcase(member, str(key))), None)
            if why:
                return family, why
    return family, None


class Registry:
    """A lazily built registry of one kind of component."""

    def __init__(self, label: str, hook_name: str, kinds: tuple[str, ...]):
        self.label = label
        self.hook_name = hook_name
        self.kinds = kinds

    def components(self, kind: str | None = None) -> list[Component]:
        items = _collect(self.hook_name, self.kinds[0], self.kinds)
        return [c for c in items if kind is None or c.kind == kind]

    def names(self, kind: str | None = None) -> list[str]:
        return sorted(c.name for c in self.components(kind))

    def component(self, name: str, kind: str | None = None) -> Component:
        kind = kind or self.kinds[0]
        items = {c.name: c for c in self.components(kind)}
        if name in items:
            check_one_reader(items[name])
            return items[name]
        valid = sorted(items)
        label = KIND_LABELS.get(kind) or (self.label if kind == self.kinds[0] else kind.replace("_", " "))
        members = [n for n in valid if name.endswith(":*") and n.startswith(name[:-1])]
        if members:  # the family as `omrl plugins` lists it: one of its members is meant
            raise UnknownNameError(
                f"{name!r} names a family of {len(members)} {label}s, not one; give one of them, e.g. "
                f"{members[0]!r} ({f'omrl env list {name!r}' if kind == 'env' else f'omrl plugins --kind {kind} --all'}"
                " lists them)"
            )
        family, why = left_out(name, items.values())
        if why:  # the family leaves the member out on purpose: its reason, not a near name
            members = [n for n in valid if n.startswith(f"{family}:")]
            raise UnknownNameError(
                f"{label} {name!r} is left out of {family}: {why}. Valid: {short_list(members, kind)} "
                f"(omrl plugins --kind {kind})"
            )
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"unknown {label} {name!r}.{hint} Valid: {short_list(valid, kind)}")

    def get(self, name: str, kind: str | None = None) -> Any:
        """The registered object for ``name``; an unknown name lists the valid ones."""
        return self.component(name, kind).obj


envs = Registry("env", "register_envs", ("env",))
rewards = Registry("reward", "register_rewards", ("reward",))
templates = Registry("template", "register_templates", ("template",))
algorithms = Registry("algorithm", "register_algorithms", ALGORITHM_KINDS)
strategies = Registry("rollout strategy", "register_rollout_strategies", STRATEGY_KINDS)

ALL = {"env": envs, "reward": rewards, "template": templates, "algorithm": algorithms, "strategy": strategies}


def all_components() -> list[Component]:
    """Every registered component of every kind."""
    return [c for registry in ALL.values() for c in registry.components()]
