"""``openenv``: envs served by Meta's OpenEnv (:mod:`.env`), played over a session that survives
reconnects (:mod:`.session`)."""

from omrl_plugins.envs.openenv.env import OpenEnvEnv, action_spec, register_envs, render_observation, to_action

__all__ = ["OpenEnvEnv", "action_spec", "render_observation", "register_envs", "to_action"]
