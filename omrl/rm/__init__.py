"""Agent reward models: outcome (ORM) and process (PRM) models trained from trajectories.

- :mod:`omrl.rm.labels`: which tokens are labelled, with what (success, score, Monte
  Carlo value, step reward, pairs); :mod:`omrl.rm.labels_mc`: Monte Carlo process labels from
  search trees; :mod:`omrl.rm.data`: the training rows and pairs.
- :mod:`omrl.rm.model`: the model (a token-classification head with one label) and
  :class:`RewardModel`, which scores episodes and search nodes.
- :mod:`omrl.rm.train`: the ``omrl rm train`` recipe; :mod:`omrl.rm.evaluate`: ``omrl rm eval``, with
  :mod:`omrl.rm.metrics` (how good the scores are on held-out labels).
"""

from omrl.rm.model import RewardModel, RewardModelError, cached_reward_model

__all__ = ["RewardModel", "RewardModelError", "cached_reward_model"]
