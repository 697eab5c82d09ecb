"""Training recipes and the pieces they share.

- :mod:`omrl.training.sft`: the ``omrl sft`` recipe.
- :mod:`omrl.training.checkpoint`: atomic checkpoints with exact resume.
- :mod:`omrl.training.metrics`: ``MetricsLogger`` (metrics.jsonl, TensorBoard, wandb, progress bar).
- :mod:`omrl.training.optim`: AdamW and the learning-rate schedule.
- :mod:`omrl.training.packing`: conversations -> shifted labels, packed rows, micro-batches.
"""
