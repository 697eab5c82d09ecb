"""Training recipes and the pieces they share.

Recipes (each reads top to bottom: setup, train, cleanup):

- :mod:`omrl.training.sft`: ``omrl sft``, supervised fine-tuning on agent conversations.
- :mod:`omrl.training.rl`: ``omrl train`` with grpo or ppo (advantages from registered estimators);
  :func:`omrl.training.rl.run_rl` runs whichever recipe ``algorithm.name`` names.
- :mod:`omrl.training.dpo`: ``omrl train`` with dpo (pairs from each rollout).

Pieces:

- :mod:`omrl.training.online`: what the grpo/ppo and dpo recipes share (models, rollout, eval, step end).
- :mod:`omrl.training.rl_data`: episodes -> the tensors an update reads; the task order.
- :mod:`omrl.training.policy`, :mod:`omrl.training.logits`: the policy's forward (log-probs, entropy, values).
- :mod:`omrl.training.losses`: the micro-batch loss, value and DPO losses, KL in the reward.
- :mod:`omrl.training.common`: seeding and skipped-update accounting for every recipe.
- :mod:`omrl.training.checkpoint`: atomic checkpoints with exact resume.
- :mod:`omrl.training.metrics`: ``MetricsLogger`` (metrics.jsonl, TensorBoard, wandb, progress bar).
- :mod:`omrl.training.optim`: AdamW and the learning-rate schedule.
- :mod:`omrl.training.packing`: conversations -> shifted labels, packed rows, micro-batches.
- :mod:`omrl.training.model_setup`: loading the trained model; saving the final one.

How processes share the work is :mod:`omrl.parallel`'s business: a recipe talks to one strategy.
"""
