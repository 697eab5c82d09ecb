"""``openenv``: envs served by Meta's OpenEnv (:mod:`.env`), played over a session that survives
reconnects (:mod:`.session`), on servers whose URLs are checked and asked whether they answer (:mod:`.servers`)."""

from omrl_plugins.envs.openenv.env import OpenEnvEnv, action_spec, register_envs, render_observation, to_action

__all__ = ["OpenEnvEnv", "action_spec", "render_observation", "register_envs", "to_action"]
