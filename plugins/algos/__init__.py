"""Built-in RL algorithms: advantage estimators, policy losses and KL estimators.

Registered through the ``register_algorithms`` hook, exactly as a third-party package
registers its own (calling conventions in :mod:`omrl.algos`); the recipes reach them by
name through :data:`omrl.registry.algorithms`.
"""

from __future__ import annotations

from omrl.hookspecs import hookimpl
from omrl_plugins.algos.advantages import dr_grpo, gae, grpo, reinforce_plus_plus, rloo
from omrl_plugins.algos.gigpo import gigpo
from omrl_plugins.algos.kl import k1, k2, k3
from omrl_plugins.algos.policy_losses import clip_higher, dual_clip, ppo_clip
from omrl_plugins.algos.tree import tree_grpo

ADVANTAGES = {
    "gae": gae,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "gigpo": gigpo,
    "tree_grpo": tree_grpo,
}
POLICY_LOSSES = {"ppo_clip": ppo_clip, "dual_clip": dual_clip, "clip_higher": clip_higher}
KL_ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


@hookimpl
def register_algorithms(register):
    for kind, functions in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES), ("kl", KL_ESTIMATORS)):
        for name, fn in functions.items():
            register(name, fn, kind=kind)
