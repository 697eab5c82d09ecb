"""The KL coefficient of a run: fixed, or steered toward a target KL (``algorithm.kl_target``)."""

from __future__ import annotations

import math

from omrl.algos import AlgoConfig
from omrl.errors import ConfigError

#: the proportional error is clipped to +-this, so one odd step cannot swing the coefficient
MAX_ERROR = 0.2


class AdaptiveKL:
    """Ziegler et al. 2019's adaptive KL controller ("Fine-Tuning Language Models from Human
    Preferences", arXiv:1909.08593, section 2.2), as TRL and verl implement it.

    After each step that updated, with the KL per token ``kl`` (the mean over the trained tokens,
    ``kl_token_mean``, whatever loss_agg_mode) over ``samples`` episodes:

        error = clip(kl / kl_target - 1, -0.2, 0.2)
        coef  = coef * (1 + error * samples / kl_horizon)

    so the coefficient grows while the policy drifts further from the reference than the target,
    and shrinks while it stays closer. ``kl_target`` 0 keeps ``kl_coef`` fixed. The coefficient is
    part of a checkpoint (:meth:`state_dict`), so a resumed run goes on with the value it reached.
    """

    def __init__(self, algo: AlgoConfig):
        if algo.kl_target < 0:
            raise ConfigError(f"algorithm.kl_target must be >= 0 (0: a fixed kl_coef), got {algo.kl_target}")
        if algo.kl_target > 0 and not algo.kl_coef > 0:
            raise ConfigError(
                f"algorithm.kl_target={algo.kl_target:g} adapts kl_coef, which must then start above 0; "
                f"got kl_coef={algo.kl_coef:g} (try kl_coef=0.05)"
            )
        if algo.kl_target > 0 and algo.kl_horizon < 1:
            raise ConfigError(f"algorithm.kl_horizon must be >= 1, got {algo.kl_horizon}")
        self.target, self.horizon, self.coef = algo.kl_target, algo.kl_horizon, algo.kl_coef

    @property
    def adaptive(self) -> bool:
        return self.target > 0

    def update(self, kl: float, samples: int) -> None:
        """Move the coefficient after a step that measured ``kl`` per token over ``samples`` episodes;
        a KL that is not finite (a step whose loss was not) leaves it as it is."""
        if self.adaptive and math.isfinite(kl):
            error = min(max(kl / self.target - 1.0, -MAX_ERROR), MAX_ERROR)
            self.coef *= 1.0 + error * samples / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.coef} if self.adaptive else {}

    def load_state_dict(self, state: dict) -> None:
        if self.adaptive and "kl_coef" in state:
            coef = float(state["kl_coef"])
            if not (math.isfinite(coef) and coef > 0):
                raise ConfigError(f"the checkpoint's adaptive kl_coef is {coef}; it must be a number > 0")
            self.coef = coef
