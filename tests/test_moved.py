"""Modules that moved keep their old import paths: the same module object, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from omrl.moved import MOVED

PLUGIN_MOVES = {
    "omrl_plugins.envs.agentgym_dialects": "omrl_plugins.envs.agentgym.dialects",
    "omrl_plugins.envs.agentgym_http": "omrl_plugins.envs.agentgym.transport",
    "omrl_plugins.envs.openenv_session": "omrl_plugins.envs.openenv.session",
}


@pytest.mark.parametrize("old, new", sorted({**MOVED, **PLUGIN_MOVES}.items()))
def test_an_old_path_gives_the_moved_module_with_a_warning(old, new):
    code = (
        f"import warnings, importlib; warnings.simplefilter('error')\n"
        f"try:\n    importlib.import_module({old!r})\n"
        f"except DeprecationWarning as w:\n    assert {new!r} in str(w), w\nelse:\n    raise SystemExit('no warning')\n"
        f"warnings.simplefilter('ignore')\n"
        f"assert importlib.import_module({old!r}) is importlib.import_module({new!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_names_users_import_still_import():
    from omrl.config import load_config, to_yaml  # noqa: F401
    from omrl.config.options import TrainRunConfig
    from omrl.models import load_model, load_tokenizer, resolve_model_path  # noqa: F401
    from omrl.sandbox import run_sandboxed  # noqa: F401
    from omrl.serve import background_server, create_app  # noqa: F401
    from omrl_plugins.envs.agentgym import AgentGymEnv, parse_splits  # noqa: F401
    from omrl_plugins.envs.openenv import OpenEnvEnv  # noqa: F401

    with pytest.warns(DeprecationWarning, match="omrl.options moved to omrl.config.options"):
        sys.modules.pop("omrl.options", None)
        old = importlib.import_module("omrl.options")
    assert old.TrainRunConfig is TrainRunConfig
