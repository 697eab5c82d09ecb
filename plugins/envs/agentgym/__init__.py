"""``agentgym``: envs played on an AgentGym-style HTTP server (:mod:`.env`), the env id each client
holds there and the checks that it is still its own (:mod:`.held_env`, with the ledger of ids one
process's clients share in :mod:`.ids`), the task ids of the splits (:mod:`.splits`, as a server's
client reads and checks them: :mod:`.tasks`), the known servers and the shapes of their requests and
answers (:mod:`.servers`), which :mod:`.dialects` builds and reads, and the retrying HTTP client
(:mod:`.transport`)."""

from omrl_plugins.envs.agentgym.env import AgentGymEnv, register_envs
from omrl_plugins.envs.agentgym.splits import parse_splits

__all__ = ["AgentGymEnv", "parse_splits", "register_envs"]
