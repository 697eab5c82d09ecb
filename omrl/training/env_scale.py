"""Per-env reward scaling for mixtures: one env's reward scale must not dominate the update.

With ``reward.per_env_scale=std`` each env's composed rewards are divided, every step, by the
standard deviation of that env's episode rewards in the step (over every process), so each env
contributes rewards of unit spread whatever its range: a 0-10 score beside a 0/1 success. GRPO's
group normalisation already does this within a task; the estimators that do not divide by a group's
spread (dr_grpo, rloo, ppo's GAE, reinforce++) are where it matters.
"""

from __future__ import annotations

import math
from typing import Any

from omrl import registry
from omrl.errors import ConfigError
from omrl.rewards import TOTAL

SCALES = ("none", "std")
#: below this spread an env's rewards are left as they are (all alike: nothing to scale)
MIN_STD = 1e-6


def check(cfg: Any) -> None:
    """A known scale, and a run whose advantages come from the scaled rewards alone."""
    scale = cfg.reward.per_env_scale
    if scale not in SCALES:
        raise ConfigError(f"unknown reward.per_env_scale {scale!r}; valid: {', '.join(SCALES)}")
    if scale == "none":
        return
    if cfg.algorithm.name == "dpo":
        raise ConfigError(
            "reward.per_env_scale is for the grpo and ppo recipes: dpo pairs one task's replies by their "
            "reward, which scaling an env's rewards does not change"
        )
    needs = registry.algorithms.component(cfg.algorithm.advantage, kind="advantage").traits.get("needs", ())
    if needs:
        raise ConfigError(
            f"reward.per_env_scale={scale} scales the sampled episodes' rewards, but algorithm.advantage="
            f"{cfg.algorithm.advantage} compares them with {', '.join(needs)} it plays apart, which would stay "
            "unscaled; use reward.per_env_scale=none with it"
        )


def scale_per_env(episodes: list[Any], envs: list[str], strategy: Any) -> dict[str, float]:
    """Divide each episode's per-turn composed rewards (``rewards["total"]``) by its env's reward std
    over the step (episodes that failed in the env are not counted, nor scaled). Returns each env's
    divisor as ``reward_scale/<env>``."""
    sums = []
    for env in envs:
        totals = [ep.total_reward for ep in episodes if ep.env == env and ep.end_reason != "env_error"]
        sums += [len(totals), sum(totals), sum(t * t for t in totals)]
    sums = strategy.sum(sums)
    metrics = {}
    for i, env in enumerate(envs):
        n, total, squares = sums[3 * i : 3 * i + 3]
        std = math.sqrt(max(0.0, squares / n - (total / n) ** 2)) if n else 0.0
        divisor = std if std > MIN_STD else 1.0
        metrics[f"reward_scale/{env}"] = divisor
        for ep in episodes:
            if ep.env == env and ep.end_reason != "env_error" and TOTAL in ep.rewards:
                ep.rewards[TOTAL] = [value / divisor for value in ep.rewards[TOTAL]]
    return metrics
