"""``omrl env serve``: one registered env behind AgentGym's HTTP protocol (:mod:`.app`), the envs
it holds for its clients (:mod:`.store`), how it checks what they answer (:mod:`.answers`), who may
reach it (:mod:`.guard`), and how it reads a request's fields (:mod:`.fields`)."""

from omrl.serve.app import ENV_IDX_PREFIX, background_server, create_app, open_env, run_server
from omrl.serve.guard import INSTANCE_HEADER, TOKEN_ENV, exposure_warning, is_loopback

__all__ = [
    "ENV_IDX_PREFIX",
    "INSTANCE_HEADER",
    "TOKEN_ENV",
    "background_server",
    "create_app",
    "exposure_warning",
    "is_loopback",
    "open_env",
    "run_server",
]
