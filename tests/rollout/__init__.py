"""Tests of the rollout, the generation backends, evaluation and the rollout/eval commands."""
