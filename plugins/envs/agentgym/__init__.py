"""``agentgym``: envs played on an AgentGym-style HTTP server (:mod:`.env`), the requests and
answers of each known server (:mod:`.dialects`), and the retrying HTTP client (:mod:`.transport`)."""

from omrl_plugins.envs.agentgym.env import AgentGymEnv, parse_splits, register_envs

__all__ = ["AgentGymEnv", "parse_splits", "register_envs"]
