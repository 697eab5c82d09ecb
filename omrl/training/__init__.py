"""Training recipes and the pieces they share.

Recipes (each reads top to bottom: setup, train, cleanup):

- :mod:`omrl.training.sft`: ``omrl sft``, supervised fine-tuning on agent conversations.
- :mod:`omrl.training.rl`: ``omrl train`` with grpo or ppo (advantages from registered estimators);
  :func:`omrl.training.rl.run_rl` runs whichever recipe ``algorithm.name`` names.
- :mod:`omrl.training.dpo`: ``omrl train`` with dpo (pairs from each rollout).

The scaffold every recipe calls (it inherits nothing): :mod:`omrl.training.recipe`. The online
recipes hold an :class:`~omrl.training.online_run.OnlineRun` (:mod:`omrl.training.online_run`: the
rollout, its replays, evaluation, weight sync, and the steps both take alike), built from
:mod:`omrl.training.online` (models, sessions, evaluation), :mod:`omrl.training.config_checks` (the
train config's checks, torch-free, run before anything loads), :mod:`omrl.training.algo_probe`
(the algorithms' results checked, before the first rollout and on each), :mod:`omrl.training.rollout_step`
(one step's rollout and its metrics), :mod:`omrl.training.rollout_health` (what the rollouts could not
play), :mod:`omrl.training.tool_health` (tool-call health) and :mod:`omrl.training.async_generation`
(generation in a process of its own, ahead of the trainer).

Pieces:

- :mod:`omrl.training.rl_data`: episodes -> the tensors an update reads; the task order;
  :mod:`omrl.training.tree_batch`: search trees -> update rows.
- :mod:`omrl.training.policy`, :mod:`omrl.training.logits`: the policy's forward (log-probs, entropy,
  values); :mod:`omrl.training.shared_prefix`: a group's shared prompt run once; :mod:`omrl.training.critic`:
  PPO's critic.
- :mod:`omrl.training.losses`: the micro-batch loss, value and DPO losses, KL in the reward.
- One technique each: :mod:`omrl.training.kl_control` (adaptive KL), :mod:`omrl.training.dynamic_sampling`
  (DAPO), :mod:`omrl.training.greedy_baseline` (ReMax), :mod:`omrl.training.distillation` (a teacher's
  reward), :mod:`omrl.training.env_scale` (per-env reward scaling), :mod:`omrl.training.rollout_correction`
  (the sampler's gap).
- :mod:`omrl.training.common`: seeding and skipped-update accounting for every recipe.
- :mod:`omrl.training.checkpoint`: atomic checkpoints, :mod:`omrl.training.checkpoint_marker` the marker that
  says one is whole and lists its files' digests; :mod:`omrl.training.resume`: where a run resumes;
  :mod:`omrl.training.stopped`: what a run that stops early kept, and how to go on.
- :mod:`omrl.training.metrics`: ``MetricsLogger`` (metrics.jsonl, TensorBoard, wandb, progress bar);
  :mod:`omrl.training.board`: TensorBoard events, a failure to write them named as any file's.
- :mod:`omrl.training.optim`: AdamW and the learning-rate schedule.
- :mod:`omrl.training.packing`: conversations -> shifted labels, packed rows, micro-batches.
- :mod:`omrl.training.model_setup`: loading the trained model; saving the final one;
  :mod:`omrl.training.lora_merge`: a LoRA run's checkpoint merged into a whole model.

How processes share the work is :mod:`omrl.parallel`'s business: a recipe talks to one strategy.
"""
