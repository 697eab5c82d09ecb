"""The plugin system: entry-point loading, lazy registries, errors that name names."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omrl import hookspecs, registry
from omrl.envs import Env, Observation, StepResult
from omrl.errors import PluginError, UnknownNameError
from omrl.hookspecs import hookimpl

REPO = Path(__file__).resolve().parents[1]


class FakeEnv(Env):
    """A fake env for plugin tests."""

    def task_ids(self, split):
        return range(3)

    def reset(self, task_id):
        return Observation("start", "do it")

    def step(self, action):
        return StepResult("end", 1.0, True, {"won": True, "score": 1.0})


class FakeEnvPlugin:
    @hookimpl
    def register_envs(self, register):
        register("fake-env", FakeEnv)


def test_registered_plugin_is_found_and_gone_after(register_plugin):
    register_plugin(FakeEnvPlugin(), name="fake-env-plugin")
    component = registry.envs.component("fake-env")
    assert component.obj is FakeEnv
    assert component.plugin == "fake-env-plugin"
    assert component.description == "A fake env for plugin tests."
    assert "fake-env" in registry.envs.names()


def test_fixture_unregisters():
    assert "fake-env" not in registry.envs.names()


def test_unknown_name_lists_valid_names_and_suggests(register_plugin):
    register_plugin(FakeEnvPlugin(), name="fake-env-plugin")
    with pytest.raises(UnknownNameError) as info:
        registry.envs.get("fake-evn")
    message = str(info.value)
    assert "unknown env 'fake-evn'" in message
    assert "Did you mean 'fake-env'?" in message
    assert "fake-env" in message.split("Valid:")[1]


def test_a_member_its_family_leaves_out_gets_the_familys_reason_not_a_near_name(register_plugin, monkeypatch):
    """`gem:game:Wordle-v0` was answered "Did you mean 'gem:game:Crosswords-v0-hard'?": the family's
    LEFT_OUT (in the module of the classes it registers) knew why it is not there."""
    import types

    family = types.ModuleType("fake_family_module")
    family.LEFT_OUT = {"game:Wordle-*": "downloads a word list", "composite": "mixes the others"}
    monkeypatch.setitem(sys.modules, "fake_family_module", family)
    member = type("FamMember", (FakeEnv,), {"__module__": "fake_family_module"})

    class FamilyPlugin:
        @hookimpl
        def register_envs(self, register):
            register("fam:game:Wordle-v1-easy", member)
            register("fam:game:Sudoku-v0", member)

    register_plugin(FamilyPlugin(), name="fake-family")
    for name, why in [("fam:game:Wordle-v0", "downloads a word list"), ("fam:composite", "mixes the others")]:
        with pytest.raises(UnknownNameError) as info:
            registry.envs.get(name)
        message = str(info.value)
        assert f"env {name!r} is left out of fam: {why}. Valid: fam:* (2)" in message, message
        assert "Did you mean" not in message
    with pytest.raises(UnknownNameError, match=r"unknown env 'fam:game:Sudoku-v1'. Did you mean 'fam:game:Sudoku-v0'"):
        registry.envs.get("fam:game:Sudoku-v1")  # not left out: a near name still helps


@pytest.mark.parametrize(
    "name, why",
    [
        ("gem:game:Wordle-v0", "downloads NLTK's `words` corpus"),
        ("reasoning-gym:composite", "it only mixes other datasets"),
    ],
)
def test_the_builtin_families_left_out_members_are_explained(name, why):
    with pytest.raises(UnknownNameError) as info:
        registry.envs.get(name)
    assert f"env {name!r} is left out of {name.split(':')[0]}: {why}" in str(info.value)


def test_duplicate_names_fail_naming_both_plugins(register_plugin):
    register_plugin(FakeEnvPlugin(), name="first-plugin")
    register_plugin(FakeEnvPlugin(), name="second-plugin")
    with pytest.raises(PluginError) as info:
        registry.envs.get("fake-env")
    assert "'first-plugin'" in str(info.value) and "'second-plugin'" in str(info.value)


def test_plugin_raising_while_registering_is_named(register_plugin):
    class Broken:
        @hookimpl
        def register_rewards(self, register):
            raise RuntimeError("boom")

    register_plugin(Broken(), name="broken-plugin")
    with pytest.raises(PluginError, match=r"'broken-plugin'.*register_rewards: RuntimeError: boom"):
        registry.rewards.names()


def test_algorithm_kinds_are_checked(register_plugin):
    class BadKind:
        @hookimpl
        def register_algorithms(self, register):
            register("x", lambda d, c: None, kind="optimizer")

    register_plugin(BadKind(), name="bad-kind")
    with pytest.raises(PluginError, match="unknown kind 'optimizer'.*advantage, policy_loss, kl"):
        registry.algorithms.names()


class LazyRewardPlugin:
    """Registers a reward by its import path (a module of this test file's package)."""

    def __init__(self, path: str):
        self.path = path

    @hookimpl
    def register_rewards(self, register):
        register("lazy-reward", self.path)


def test_a_component_registered_by_its_import_path_is_listed_unimported_and_loaded_on_use(
    register_plugin, tmp_path, monkeypatch
):
    module = tmp_path / "lazy_reward_module.py"
    module.write_text(
        'import sys\nsys.modules["lazy_reward_module_imported"] = sys\n\n\n'
        'def reward(episodes):\n    """A reward listed from source."""\n    return [[1.0] for _ in episodes]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    register_plugin(LazyRewardPlugin("lazy_reward_module:reward"), name="lazy-plugin")
    component = registry.rewards.component("lazy-reward")
    assert component.description == "A reward listed from source."
    assert "lazy_reward_module_imported" not in sys.modules  # listing read the source only
    assert registry.rewards.get("lazy-reward")([object()]) == [[1.0]]
    assert "lazy_reward_module_imported" in sys.modules
    sys.modules.pop("lazy_reward_module_imported")
    sys.modules.pop("lazy_reward_module")


def test_an_import_path_that_does_not_import_is_named(register_plugin):
    register_plugin(LazyRewardPlugin("no_such_module_here:reward"), name="lazy-plugin")
    assert registry.rewards.component("lazy-reward").description == ""
    with pytest.raises(PluginError, match="registered reward 'lazy-reward' as 'no_such_module_here:reward'"):
        registry.rewards.get("lazy-reward")


def test_a_string_that_is_no_import_path_is_refused(register_plugin):
    register_plugin(LazyRewardPlugin("just a name"), name="lazy-plugin")
    with pytest.raises(PluginError, match="must be an import path 'package.module:attribute'"):
        registry.rewards.names()


def test_hookimpl_may_take_fewer_arguments(register_plugin):
    class NoArgs:
        @hookimpl
        def register_templates(self):
            pass  # a plugin written against a hook that later grew an argument

    register_plugin(NoArgs(), name="no-args")
    registry.templates.names()  # must not raise


def test_every_hook_is_documented_and_tested():
    hooks = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("register_")]
    assert set(hooks) == {
        "register_envs",
        "register_rewards",
        "register_templates",
        "register_algorithms",
        "register_rollout_strategies",
        "register_commands",
    }
    tests_text = "\n".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
    for name in hooks:
        assert inspect.getdoc(getattr(hookspecs, name)), f"{name} has no docstring"
        assert f"def {name}(" in tests_text, f"no test implements {name}"


def test_builtins_register_through_the_entry_point_group():
    eps = [ep for ep in importlib.metadata.entry_points(group="omrl") if ep.dist.name == "omrl"]
    names = {ep.name for ep in eps}
    assert {"omrl.envs.webshop", "omrl.rewards", "omrl.templates", "omrl.algos", "omrl.strategies"} <= names
    assert all(ep.name.startswith("omrl.") for ep in eps), "entry-point names must be namespaced"
    assert all(ep.value.startswith("omrl_plugins.") for ep in eps)


def _omrl(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "omrl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_env_var_limits_which_distributions_load():
    result = _omrl("plugins", "--json", env={"OMRL_PLUGINS": ""})  # none: not even omrl's own
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    misspelt = _omrl("plugins", "--json", env={"OMRL_PLUGINS": "omrll"})  # it left every plugin out, silently
    assert misspelt.returncode == 2
    assert "OMRL_PLUGINS names omrll, which no installed distribution with omrl plugins is (did you mean omrl?)" in (
        " ".join(misspelt.stderr.split())
    )


def test_register_commands_adds_a_cli_command(tmp_path):
    plugin = tmp_path / "hello_cmd.py"
    plugin.write_text(
        "from omrl.hookspecs import hookimpl\n"
        "@hookimpl\n"
        "def register_commands(cli):\n"
        "    @cli.command()\n"
        "    def hello(name: str = 'world'):\n"
        "        '''Say hello.'''\n"
        "        print(f'hello {name}')\n"
    )
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import hello_cmd\n"
        "from omrl.plugins import load_plugins\n"
        "load_plugins().register(hello_cmd, name='hello-cmd')\n"
        "from omrl.cli import main\n"
        "main(['hello', '--name', 'omrl'])\n"
    ) % str(tmp_path)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "hello omrl", result.stderr
