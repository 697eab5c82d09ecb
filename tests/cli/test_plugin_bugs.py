"""An exception from a third-party plugin's code is that plugin's bug: the one-line error names the
plugin, its distribution and the line that raised, so its author, not omrl, gets the report (exit 1,
as for any bug). A bug of omrl's own code, built-in plugins included, is still called omrl's."""

from __future__ import annotations

from omrl.hookspecs import hookimpl


def broken(ctx, tasks):
    """A strategy with a bug in it."""
    return {}["budget"]


class BrokenStrategy:
    @hookimpl
    def register_rollout_strategies(self, register):
        register("broken", broken)


ROLLOUT = ("rollout", "--env", "gridworld", "--model", "tiny", "--num-tasks", "1", "--strategy", "broken")


def test_a_third_party_strategy_that_raises_is_named_as_the_bug(register_plugin, omrl_main, tmp_path):
    register_plugin(BrokenStrategy(), name="broken-strategies")
    code, _, err = omrl_main(*ROLLOUT, "-o", str(tmp_path / "x.parquet"))
    line = broken.__code__.co_firstlineno + 2
    assert code == 1, err
    assert f"KeyError: 'budget' (raised in plugin 'broken-strategies' (-) at {__file__}:{line}: a bug in" in err, err
    assert "bug in omrl" not in err


def test_a_bug_in_omrls_own_code_is_still_called_omrls(register_plugin, omrl_main, tmp_path, monkeypatch):
    register_plugin(BrokenStrategy(), name="broken-strategies")  # loaded, but not the one that raised

    # a function of omrl's: its frame is omrl's module, as the real code's would be
    failing = eval("lambda *args, **kwargs: 1 / 0", {"__name__": "omrl.rollout.session"})
    monkeypatch.setattr("omrl.rollout.session.RolloutSession.from_config", failing)
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--model", "tiny", "-o", str(tmp_path / "x.parquet"))
    assert code == 1 and "(this is a bug in omrl or a plugin;" in err, err


class GridworldReward:
    """A reward named as the built-in env is: one ``plugins.gridworld`` block would configure both."""

    @hookimpl
    def register_rewards(self, register):
        register("gridworld", lambda episodes: [[0.0] * len(ep.turns) for ep in episodes])


def test_omrl_plugins_lists_then_names_a_clash_across_kinds(register_plugin, omrl_main):
    """It listed both rows and exited 0; the clash showed only when a run used either (a gridworld run
    reading the built-in react template, for a plugin's env named react)."""
    register_plugin(GridworldReward(), name="odd-plugin")
    code, out, err = omrl_main("plugins")
    assert code == 2 and "reward  gridworld  -" in out, err  # listed first
    assert (
        "env 'gridworld' (plugin 'omrl.envs.gridworld', omrl) and reward 'gridworld' (plugin 'odd-plugin', -) "
        "share a name"
    ) in " ".join(err.split())
    assert omrl_main("plugins", "--json")[0] == 2


def test_of_several_plugins_in_one_package_the_one_whose_module_raised_is_named(register_plugin):
    """A distribution with one entry point a kind (countup.env, countup.reward): an error in env.py was
    named as the first plugin of the package, whichever it was."""
    from omrl.plugins import plugin_in_traceback

    for kind in ("reward", "env"):
        register_plugin(type("Plugin", (), {"__module__": f"countup.{kind}"})(), name=f"countup.{kind}")

    def raised_in(module: str) -> str | None:
        fails = eval("lambda: 1 / 0", {"__name__": module})
        try:
            fails()
        except ZeroDivisionError as exc:
            return plugin_in_traceback(exc.__traceback__)
        return None

    assert raised_in("countup.env").startswith("plugin 'countup.env' (-) at ")
    assert raised_in("countup.env.game").startswith("plugin 'countup.env' (-) at ")  # a module below it
    assert raised_in("countup.rules").startswith("plugin 'countup.env' or 'countup.reward' (-) at ")
