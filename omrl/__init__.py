"""omrl: train LLM agents with reinforcement learning in multi-turn environments."""

import os

__version__ = "0.1.0"

# OpenMP threads that spin while waiting make torch many times slower on small, busy CPU
# machines; this only takes effect when omrl is imported before torch, and never overrides a user's value.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from omrl.moved import MOVED, alias_moved_modules  # noqa: E402  (after the environment default above)

alias_moved_modules(MOVED)
