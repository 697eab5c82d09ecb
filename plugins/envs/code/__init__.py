"""The ``code`` env family: a sandboxed Python tool beside any env (see :mod:`.env`)."""

from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.reasoning_gym import DATASETS


@hookimpl
def register_envs(register):
    from omrl_plugins.envs.code.env import CodeEnv, code_variant

    register("code", CodeEnv)
    for dataset in DATASETS:
        register(
            f"code:reasoning-gym:{dataset}", code_variant(f"reasoning-gym:{dataset}", "reasoning-gym", "reasoning-gym")
        )
