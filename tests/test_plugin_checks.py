"""A plugin's registration mistakes are refused where they are made, naming the plugin and what would
be valid: a hook omrl does not call, a hook parameter it does not pass, an env or template that is no
concrete subclass of its base, a trait its kind does not know, a name another kind that reads
``plugins.<name>`` options already has, and an import that fails (with how to go on without it)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pluggy
import pytest

from omrl import hookspecs, plugins, registry
from omrl.envs import Env
from omrl.errors import PluginError
from omrl.hookspecs import hookimpl
from omrl.registry import OPTION_KINDS
from tests.fakes import ActionTemplate
from tests.test_plugins import FakeEnv


class Incomplete(Env):  # forgot step
    """Starts, never steps."""

    def task_ids(self, split):
        return range(1)

    def reset(self, task_id):
        raise NotImplementedError


def registers(hook: str, *entries):
    """A plugin whose hook ``hook`` registers each ``(name, obj, traits)`` of ``entries``."""

    def impl(self, register):
        for name, obj, *traits in entries:
            register(name, obj, **(traits[0] if traits else {}))

    impl.__name__ = hook
    return type("Plugin", (), {hook: hookimpl(impl)})()


@pytest.mark.parametrize(
    "hook, obj, problem",
    [
        ("register_envs", dict, "as the class dict, which is not a subclass of Env"),
        ("register_envs", FakeEnv(), "as an instance of FakeEnv, not a class (register the class itself)"),
        ("register_envs", Incomplete, "as the class Incomplete, which is abstract: it does not define step"),
        ("register_templates", FakeEnv, "as the class FakeEnv, which is not a subclass of Template"),
        ("register_templates", ActionTemplate(), "as an instance of ActionTemplate, not a class"),
    ],
)
def test_an_env_or_template_that_is_no_concrete_subclass_is_refused_as_registered(register_plugin, hook, obj, problem):
    register_plugin(registers(hook, ("odd", obj)), name="odd-plugin")
    kind = hook.removeprefix("register_").removesuffix("s")
    base = "omrl.envs.Env that defines reset, step, task_ids" if kind == "env" else "omrl.templates.Template"
    with pytest.raises(PluginError) as info:
        registry.ALL[kind].names()
    message = str(info.value)
    assert message.startswith(f"plugin 'odd-plugin' (-) registered {kind} 'odd' {problem}"), message
    assert f"; valid: a subclass of {base}" in message


def test_a_class_registered_by_its_import_path_is_checked_when_imported(register_plugin):
    register_plugin(registers("register_envs", ("odd", "tests.fakes:ActionTemplate")), name="odd-plugin")
    assert "odd" in registry.envs.names()  # listed from source, not imported
    with pytest.raises(PluginError, match=r"registered env 'odd' as the class ActionTemplate, which is not a sub"):
        registry.envs.get("odd")


def test_a_function_kind_must_be_callable(register_plugin):
    register_plugin(registers("register_rewards", ("odd", 1.5)), name="odd-plugin")
    with pytest.raises(PluginError, match=r"registered reward 'odd' as 1.5, which is not callable"):
        registry.rewards.names()


def test_builtin_and_test_envs_and_templates_pass(fake_plugins):
    assert {"gridworld", "keys"} <= set(registry.envs.names()) and "action" in registry.templates.names()


@pytest.mark.parametrize(
    "hook, kind, traits, message",
    [
        (
            "register_algorithms",
            "policy_loss",
            {"zero_advantage_row_add_nothing": True},
            "with traits zero_advantage_row_add_nothing; valid: zero_advantage_rows_add_nothing",
        ),
        ("register_algorithms", "advantage", {"need": ("greedy_scores",)}, "with traits need; valid: needs"),
        (
            "register_algorithms",
            "advantage",
            {"needs": ("greedy_score",)},
            "with needs=('greedy_score',); valid: a tuple of greedy_scores",
        ),
        ("register_algorithms", "kl", {"needs": ()}, "with traits needs; valid: none (a kl declares no traits)"),
        (
            "register_rollout_strategies",
            "strategy",
            {"group_in_one_tree": "yes"},
            "with group_in_one_tree='yes'; valid: True or False",
        ),
        ("register_templates", "template", {"colour": "blue"}, "with traits colour; valid: none"),
    ],
)
def test_an_unknown_trait_or_value_is_refused_naming_the_valid_ones(register_plugin, hook, kind, traits, message):
    obj = ActionTemplate if kind == "template" else (lambda *args: None)
    extra = {} if kind in ("template", "strategy") else {"kind": kind}
    register_plugin(registers(hook, ("odd", obj, {**extra, **traits})), name="odd-plugin")
    with pytest.raises(PluginError) as info:
        registry.all_components()
    assert str(info.value).startswith(f"plugin 'odd-plugin' registered {kind} 'odd' {message}"), str(info.value)


def test_the_builtin_traits_are_accepted():
    traits = {c.name: c.traits for c in registry.algorithms.components()}
    assert traits["remax"] == {"needs": ("greedy_scores",)}
    assert traits["ppo_clip"] == {"zero_advantage_rows_add_nothing": True}


def test_a_name_another_kind_that_reads_its_options_has_is_refused_naming_both(register_plugin):
    register_plugin(registers("register_rewards", ("gridworld", lambda episodes: [])), name="odd-plugin")
    for lookup in (lambda: registry.envs.get("gridworld"), lambda: registry.rewards.get("gridworld")):
        with pytest.raises(PluginError) as info:
            lookup()
        assert str(info.value).startswith(
            "env 'gridworld' (plugin 'omrl.envs.gridworld', omrl) and reward 'gridworld' (plugin 'odd-plugin', -) "
            "share a name, so plugins.gridworld would configure both; valid: a name no other env, reward, "
            "template, strategy or scorer has"
        ), str(info.value)
    registry.algorithms.get("grpo", kind="advantage")  # algorithms read no plugins.<name> block


def test_one_plugin_may_give_one_block_to_two_kinds(register_plugin):
    plugin = registers("register_envs", ("shared", FakeEnv))
    plugin.register_templates = hookimpl(lambda register: register("shared", ActionTemplate))
    register_plugin(plugin, name="one-plugin")
    assert registry.envs.get("shared") is FakeEnv and registry.templates.get("shared") is ActionTemplate


def test_no_two_builtins_of_different_distributions_share_an_options_block():
    owners: dict[str, set[str]] = {}
    for component in registry.all_components():
        if component.kind in OPTION_KINDS:
            owners.setdefault(component.name, set()).add(component.distribution)
    assert all(len(dists) == 1 for dists in owners.values())
    registry.rewards.get("rm"), registry.strategies.get("rm", kind="scorer")  # one distribution's shared block


# -- loading: a fresh plugin manager over distributions written to a temporary site folder ----------------


def distribution(site: Path, name: str, source: str) -> None:
    """A distribution ``name`` (its dist-info as pip writes it) whose module ``name`` is its omrl plugin."""
    module = name.replace("-", "_")
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[omrl]\n{name} = {module}\n")


@pytest.fixture
def load(tmp_path, monkeypatch):
    """``load(**sources)``: load_plugins over a site folder of one distribution per source, alone."""
    found = importlib.metadata.distributions
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: found(path=[str(tmp_path)]))
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh = pluggy.PluginManager("omrl")
    fresh.add_hookspecs(hookspecs)
    monkeypatch.setattr(plugins, "pm", fresh)
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "_distributions", {})
    monkeypatch.delenv("OMRL_PLUGINS", raising=False)

    def run(**sources: str):
        for name, source in sources.items():
            distribution(tmp_path, name.replace("_", "-"), source)
        try:
            return plugins.load_plugins()
        finally:
            for name in sources:
                sys.modules.pop(name, None)

    return run


HEAD = "from omrl.hookspecs import hookimpl\n@hookimpl\n"


def test_a_misspelt_hook_is_refused_naming_the_valid_ones(load):
    with pytest.raises(PluginError) as info:
        load(
            good_dist=HEAD + "def register_envs(register): pass\n",
            typo_dist=HEAD + "def register_reward(register): pass\n",
        )
    assert str(info.value) == (
        "plugin 'typo-dist' (typo-dist) implements 'register_reward', which omrl does not call (did you mean "
        "'register_rewards'?); valid hooks: register_envs, register_rewards, register_templates, "
        "register_algorithms, register_rollout_strategies, register_commands; to go on without it: "
        "OMRL_PLUGINS=good-dist (loads those alone), or pip uninstall typo-dist"
    )


def test_a_hook_parameter_omrl_does_not_pass_is_refused(load):
    with pytest.raises(PluginError) as info:
        load(wrong_arg=HEAD + "def register_envs(reg): pass\n")
    assert str(info.value) == (
        "plugin 'wrong-arg' (wrong-arg): its hook register_envs(reg) takes 'reg', which omrl does not pass; "
        "valid: register_envs(register); to go on without it: pip uninstall wrong-arg"
    )
    assert not plugins.pm.has_plugin("wrong-arg")


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "def register_envs(register): pass\n",
            "its register_envs is not marked as a hook, so omrl never calls it; decorate it with @hookimpl "
            "(from omrl.hookspecs import hookimpl)",
        ),
        (HEAD + "def register_envs(): pass\n", "its hook register_envs() takes nothing, so it can give omrl nothing; "
         "valid: register_envs(register)"),
    ],
)  # fmt: skip
def test_a_hook_omrl_would_never_hear_from_is_refused(load, source, message):
    """Pluggy passes over a function without @hookimpl, and calls one without ``register`` with nothing to
    register with: the plugin loaded, registered nothing, and its env was an unknown name."""
    with pytest.raises(PluginError) as info:
        load(unheard=source)
    assert str(info.value) == f"plugin 'unheard' (unheard): {message}; to go on without it: pip uninstall unheard"
    assert not plugins.pm.has_plugin("unheard")


def test_a_plugin_that_fails_to_import_says_how_to_go_on(load):
    with pytest.raises(PluginError) as info:
        load(fine_dist=HEAD + "def register_envs(register): pass\n", broken_dist="import not_a_module_xyz\n")
    assert str(info.value) == (
        "plugin 'broken-dist' from broken-dist failed to import: ModuleNotFoundError: No module named "
        "'not_a_module_xyz'; to go on without it: OMRL_PLUGINS=fine-dist (loads those alone), or pip "
        "uninstall broken-dist"
    )


def test_well_formed_plugins_load(load):
    pm = load(fine_dist=HEAD + "def register_envs(register):\n    pass\n")
    assert pm.has_plugin("fine-dist") and plugins.distribution_of("fine-dist") == "fine-dist"
