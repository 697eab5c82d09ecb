"""Built-in RL algorithms: advantage estimators, policy losses, KL estimators and rollout corrections.

Registered through the ``register_algorithms`` hook, exactly as a third-party package
registers its own (calling conventions in :mod:`omrl.algos`); the recipes reach them by
name through :data:`omrl.registry.algorithms`.
"""

from __future__ import annotations

from omrl.hookspecs import hookimpl


@hookimpl
def register_algorithms(register):
    # imported here, not at the top: loading the plugins (for `omrl --help`, `env list`...) must not load torch
    from omrl_plugins.algos.advantages import dr_grpo, gae, grpo, reinforce_plus_plus, rloo
    from omrl_plugins.algos.baselines import opo, pass_at_k, reinforce_plus_plus_baseline, remax
    from omrl_plugins.algos.covariance_losses import clip_cov, kl_cov
    from omrl_plugins.algos.gigpo import gigpo
    from omrl_plugins.algos.kl import abs_kl, k1, k1_plus, k2, k3, k3_plus
    from omrl_plugins.algos.policy_losses import clip_higher, dual_clip, ppo_clip
    from omrl_plugins.algos.rollout_correction import none, seq_mask, seq_tis, token_mask, token_tis
    from omrl_plugins.algos.sequence_losses import gmpo, gspo
    from omrl_plugins.algos.token_weighted_losses import cispo, reinforce, sapo
    from omrl_plugins.algos.tree import tree_grpo

    advantages = {
        "gae": gae,
        "grpo": grpo,
        "dr_grpo": dr_grpo,
        "rloo": rloo,
        "reinforce_plus_plus": reinforce_plus_plus,
        "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
        "opo": opo,
        "pass_at_k": pass_at_k,
        "gigpo": gigpo,
        "tree_grpo": tree_grpo,
    }
    policy_losses = {
        "ppo_clip": ppo_clip,
        "dual_clip": dual_clip,
        "clip_higher": clip_higher,
        "gspo": gspo,
        "gmpo": gmpo,
        "cispo": cispo,
        "sapo": sapo,
        "clip_cov": clip_cov,
        "kl_cov": kl_cov,
        "reinforce": reinforce,
    }
    kl_estimators = {"k1": k1, "k2": k2, "k3": k3, "abs": abs_kl, "k1+": k1_plus, "k3+": k3_plus}
    corrections = {
        "none": none,
        "token_tis": token_tis,
        "seq_tis": seq_tis,
        "token_mask": token_mask,
        "seq_mask": seq_mask,
    }
    kinds = (("advantage", advantages), ("policy_loss", policy_losses), ("kl", kl_estimators))
    for kind, functions in (*kinds, ("rollout_correction", corrections)):
        for name, fn in functions.items():
            register(name, fn, kind=kind)
    register("remax", remax, kind="advantage", needs=("greedy_scores",))  # the recipe plays a greedy episode
