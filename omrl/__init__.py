"""omrl: train LLM agents with reinforcement learning in multi-turn environments.

The plugin kinds' calling conventions: :mod:`omrl.envs` (environments; what they answer and its checks
in :mod:`omrl.env_results`, its prompt's worked example in :mod:`omrl.env_examples`), :mod:`omrl.templates` (action templates), :mod:`omrl.rewards` (reward
components, composed and placed on tokens), :mod:`omrl.algos` (advantage estimators, policy losses, KL
estimators, rollout corrections). How plugins are found: :mod:`omrl.hookspecs` (the hooks),
:mod:`omrl.plugins` (the plugin manager), :mod:`omrl.registry` (lazy registries by name),
:mod:`omrl.plugin_options` (a plugin's options checked against its signature, one way for every kind). Across the
packages: :mod:`omrl.mixture` (several envs in one run), :mod:`omrl.evaluation` (eval metrics and
report), :mod:`omrl.env_errors` (episodes that failed in the world, not the model), :mod:`omrl.supervisor` (a deadline for every stage of a run), :mod:`omrl.clock` (where a step's
time goes), :mod:`omrl.outputs` (where a command may write), :mod:`omrl.atomic` (crash-safe writes),
:mod:`omrl.home` (``$OMRL_HOME``), :mod:`omrl.threads` (torch's threads), :mod:`omrl.processes` (which process of a launch this is), :mod:`omrl.errors` (one-line
errors), :mod:`omrl.moved` (old import paths) and ``__main__`` (``python -m omrl``).
The packages: ``config``, ``models``, ``data``, ``chat``, ``backends``, ``rollout``, ``search``,
``training``, ``parallel``, ``rm``, ``gateway``, ``serve``, ``sandbox``, ``view``, ``cli``; every
module is mapped in docs/layout.md.
"""

import os

__version__ = "0.1.0"

# OpenMP threads that spin while waiting make torch many times slower on small, busy CPU
# machines; this only takes effect when omrl is imported before torch, and never overrides a user's value.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from omrl.moved import MOVED, alias_moved_modules  # noqa: E402  (after the environment default above)

alias_moved_modules(MOVED)
