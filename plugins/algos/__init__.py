"""Built-in RL algorithms: advantage estimators, policy losses, KL estimators and rollout corrections.

Registered through the ``register_algorithms`` hook, exactly as a third-party package
registers its own (calling conventions in :mod:`omrl.algos`); the recipes reach them by
name through :data:`omrl.registry.algorithms`.
"""

from __future__ import annotations

from omrl.hookspecs import hookimpl

# registered by import path: each module is imported when its function is used, so listing them
# (`omrl plugins`, `omrl --help`) never loads torch
FUNCTIONS = {
    "advantage": {
        "advantages": ("gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus"),
        "baselines": ("reinforce_plus_plus_baseline", "opo", "pass_at_k", "remax"),
        "gigpo": ("gigpo",),
        "tree": ("tree_grpo",),
    },
    "policy_loss": {
        "policy_losses": ("ppo_clip", "dual_clip", "clip_higher"),
        "sequence_losses": ("gspo", "gmpo"),
        "token_weighted_losses": ("cispo", "sapo", "reinforce"),
        "covariance_losses": ("clip_cov", "kl_cov"),
    },
    "kl": {"kl": ("k1", "k2", "k3", "abs_kl", "k1_plus", "k3_plus")},
    "rollout_correction": {"rollout_correction": ("none", "token_tis", "seq_tis", "token_mask", "seq_mask")},
}
#: registry names that are not the function's own
NAMES = {"abs_kl": "abs", "k1_plus": "k1+", "k3_plus": "k3+"}
#: what an estimator needs beyond the rollout, and the policy losses under which a row whose advantages
#: are all 0 adds nothing (each row's loss is its own, and 0 with a 0 gradient there; see omrl.algos)
ROW_LOCAL_LOSSES = ("ppo_clip", "dual_clip", "clip_higher", "gspo", "gmpo", "cispo", "sapo", "reinforce")
TRAITS = {
    "remax": {"needs": ("greedy_scores",)},
    "tree_grpo": {"reads_trees": True},
    **{loss: {"zero_advantage_rows_add_nothing": True} for loss in ROW_LOCAL_LOSSES},
}


@hookimpl
def register_algorithms(register):
    for kind, modules in FUNCTIONS.items():
        for module, functions in modules.items():
            for function in functions:
                path = f"omrl_plugins.algos.{module}:{function}"
                register(NAMES.get(function, function), path, kind=kind, **TRAITS.get(function, {}))
