"""A train config's checks, which need no torch: ``omrl train`` runs them before anything loads, and
``omrl config show`` runs the same, so that a config it prints is one ``omrl train`` takes.

Each refusal names the key and what is valid. What needs the run's processes (the tasks of a step
split across them) is checked by the recipe's setup, with its strategy."""

from __future__ import annotations

from typing import Any

from omrl import registry
from omrl.algos import RECIPES, check_settings
from omrl.backends.sync_settings import check_weight_sync
from omrl.config.options import ModelConfig, TrainRunConfig
from omrl.config.sections import check_schedule
from omrl.env_errors import check_max_env_error_rate
from omrl.envs import check_seats
from omrl.errors import ConfigError
from omrl.mixture import is_mixture, mix_members
from omrl.rollout.spec import check_generation
from omrl.search import plays_batched
from omrl.search.context import check_budget
from omrl.training import env_scale

#: the backends the generation process of ``rollout.async_generation`` can load each weight version into
ASYNC_BACKENDS = ("hf", "vllm")
#: what an advantage estimator's traits name when it compares each sample with a greedy episode (ReMax)
GREEDY_NEED = "greedy_scores"


def check_config(cfg: TrainRunConfig, world_size: int = 1) -> None:
    """Refuse values no online recipe can run with; ``world_size``: the training processes."""
    algo = cfg.algorithm
    if algo.name not in RECIPES:
        raise ConfigError(f"unknown algorithm.name {algo.name!r}; valid: {', '.join(RECIPES)}")
    for key in ("steps", "tasks_per_step", "group_size", "ppo_epochs", "optim.micro_batch_size"):
        value = cfg.optim.micro_batch_size if key == "optim.micro_batch_size" else getattr(cfg, key)
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    if cfg.mini_batch_size < 0:
        raise ConfigError(f"mini_batch_size must be >= 0 (0: the whole rollout), got {cfg.mini_batch_size}")
    if cfg.eval_samples_per_task < 1 or (cfg.eval_samples_per_task > 1 and cfg.eval_temperature <= 0):
        raise ConfigError(
            f"eval_samples_per_task={cfg.eval_samples_per_task} is invalid; valid: 1, or more "
            "with eval_temperature > 0 (greedy samples of a task are all the same)"
        )
    if cfg.train_tasks < 0:
        raise ConfigError(f"train_tasks must be >= 0 (0: the whole split), got {cfg.train_tasks}")
    check_generation(cfg.generation, cfg.env.max_turns)
    check_schedule(cfg.optim.lr_schedule)
    check_model_config(cfg.model)
    if algo.critic not in ("head", "model"):
        raise ConfigError(f"unknown algorithm.critic {algo.critic!r}; valid: head, model")
    check_settings(algo)
    ignored = [key for key, value in (("kl_target", algo.kl_target), ("teacher", algo.teacher)) if value]
    if algo.name == "dpo" and ignored:
        raise ConfigError(
            f"algorithm.{ignored[0]} is for the grpo and ppo recipes; dpo trains on pairs with a fixed beta "
            "and no reward to add to"
        )
    warn_unread_by_dpo(cfg)
    warn_unread_by_grpo_or_kl(cfg)
    warn_unread_sizes(cfg)
    check_rollout_strategy(cfg)
    warn_tree_estimator_on_chains(cfg)
    env_scale.check(cfg)
    if is_mixture(cfg.env):
        mix_members(cfg)  # names, weights and per-env keys, before any model loads
    check_max_env_error_rate(cfg.max_env_error_rate)
    check_async(cfg, world_size)
    check_weight_sync(cfg.generation, trains=True, lora_rank=cfg.model.lora_rank)
    check_dynamic_sampling(cfg)
    check_seated(cfg)


def check_model_config(cfg: ModelConfig) -> None:
    """Refuse model settings no recipe can train with (checked again as the model is made trainable)."""
    if cfg.lora_rank < 0:
        raise ConfigError(f"model.lora_rank must be >= 0 (0: full fine-tuning), got {cfg.lora_rank}")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(
            f"model.lora_dropout must be in [0, 1) (the chance each input of a LoRA adapter is dropped), "
            f"got {cfg.lora_dropout}"
        )
    if cfg.lora_rank > 0 and not cfg.lora_alpha > 0:  # the adapter's scale is alpha / rank: 0 trains nothing
        raise ConfigError(f"model.lora_alpha must be > 0 (the adapter's scale is alpha / rank), got {cfg.lora_alpha}")
    if cfg.lora_rank > 0 and not cfg.lora_target_modules:
        raise ConfigError(
            "model.lora_target_modules=[] names no module for LoRA (model.lora_rank > 0); valid: names of the "
            "model's linear modules, as [q_proj, k_proj, v_proj, o_proj]"
        )


def check_rollout_strategy(cfg: TrainRunConfig) -> None:
    """A known ``rollout.strategy`` and a budget of at least one reply (every recipe trains on trees)."""
    registry.strategies.get(cfg.rollout.strategy)  # unknown: names the valid ones
    check_budget(cfg.rollout.budget, cfg.generation.max_new_tokens)


def searched(cfg: TrainRunConfig) -> bool:
    """Whether a step's episodes are search paths (trained as trees), rather than the batched rollout's
    samples (trained as chains): the latter when the strategy declares it plays that rollout without a
    budget and the run gives none (:class:`omrl.search.StrategyTraits`)."""
    return not plays_batched(cfg.rollout.strategy, cfg.rollout.budget)


def check_async(cfg: Any, world_size: int) -> None:
    """Refuse what the generation process (:mod:`omrl.training.async_generation`) cannot do yet."""
    rollout = cfg.rollout
    if rollout.max_staleness < 0:
        raise ConfigError(f"rollout.max_staleness must be >= 0, got {rollout.max_staleness}")
    if rollout.generation_threads < 0:
        raise ConfigError(
            f"rollout.generation_threads must be >= 0 (0: torch's default), got {rollout.generation_threads}"
        )
    if not rollout.async_generation:
        if rollout.partial_rollouts:
            raise ConfigError(
                "rollout.partial_rollouts=true loads new weights between the turns of the generation process "
                "(rollout.async_generation=true); a synchronous run has no update in flight"
            )
        return
    problems = []
    if cfg.generation.backend not in ASYNC_BACKENDS:
        problems.append(f"generation.backend={cfg.generation.backend} (valid: {', '.join(ASYNC_BACKENDS)})")
    if world_size > 1:
        problems.append(f"{world_size} training processes (valid: one)")
    if cfg.model.lora_rank:
        problems.append(f"model.lora_rank={cfg.model.lora_rank} (valid: 0, full fine-tuning)")
    if problems:
        raise ConfigError(
            "rollout.async_generation=true runs the hf or vllm backend beside one training process of full weights; "
            f"this run has {', '.join(problems)}; set rollout.async_generation=false or change them"
        )


def check_dynamic_sampling(cfg: Any) -> None:
    """Refuse what dynamic sampling (:mod:`omrl.training.dynamic_sampling`) cannot run with."""
    algo = cfg.algorithm
    if not algo.dynamic_sampling:
        return
    if algo.dynamic_sampling_max_draws < 1:
        raise ConfigError(
            f"algorithm.dynamic_sampling_max_draws must be >= 1 (extra rollouts a step may draw), "
            f"got {algo.dynamic_sampling_max_draws}"
        )
    if cfg.group_size < 2:
        raise ConfigError(
            f"algorithm.dynamic_sampling keeps groups whose samples differ; group_size={cfg.group_size} "
            "makes groups of one, which never do: use group_size >= 2"
        )
    dense = [
        why
        for why, present in (
            ("a critic's values (ppo)", algo.name == "ppo"),
            ("the teacher's per-token reward (algorithm.teacher)", bool(algo.teacher)),
            ("the KL in the reward (algorithm.kl_in_reward)", algo.kl_in_reward and algo.kl_coef > 0),
        )
        if present
    ]
    if dense:
        raise ConfigError(
            "algorithm.dynamic_sampling drops groups whose samples got the same env reward, which carry no "
            f"signal only when the advantages come from that reward alone; here they also come from {dense[0]}"
        )
    if algo.name == "dpo" or cfg.rollout.async_generation or searched(cfg):  # search paths train as trees
        raise ConfigError(
            "algorithm.dynamic_sampling runs with the grpo recipe, the chain rollout and "
            f"synchronous generation; this run has algorithm.name={algo.name}, rollout.strategy="
            f"{cfg.rollout.strategy}, rollout.async_generation={cfg.rollout.async_generation}"
        )


def warn_tree_estimator_on_chains(cfg: Any) -> None:
    """An estimator that reads a search's trees (``reads_trees``) is its plain form on the chain rollout: say so."""
    import warnings

    traits = registry.algorithms.component(cfg.algorithm.advantage, kind="advantage").traits
    if traits.get("reads_trees") and not searched(cfg):
        warnings.warn(
            f"algorithm.advantage={cfg.algorithm.advantage} reads a search's trees, and this run plays chains "
            f"(rollout.strategy={cfg.rollout.strategy}, budget {cfg.rollout.budget}), so it is its plain form "
            "there and its tree settings change nothing; play a search (e.g. rollout.strategy=beam "
            "rollout.budget=N) to use them",
            stacklevel=2,
        )


def wants_greedy_baseline(cfg: Any) -> bool:
    """Whether the run's advantage estimator asks for greedy baselines
    (:mod:`omrl.training.greedy_baseline`); refuses what cannot give them."""
    traits = registry.algorithms.component(cfg.algorithm.advantage, kind="advantage").traits
    if GREEDY_NEED not in traits.get("needs", ()):
        return False
    if searched(cfg) or cfg.rollout.async_generation:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage} compares each sample with a greedy episode of its "
            "task, which this run cannot play beside its rollout: use a rollout.strategy that plays the "
            "batched rollout (chain) with no rollout.budget, and rollout.async_generation=false (got "
            f"{cfg.rollout.strategy}, budget {cfg.rollout.budget}, {cfg.rollout.async_generation})"
        )
    return True


def check_seated(cfg: TrainRunConfig) -> None:
    """An env of several seats (:attr:`omrl.envs.Env.seats`) trains on the batched rollout of its games,
    played here: a search strategy, async generation and a greedy baseline are refused by name."""
    if is_mixture(cfg.env) or not check_seats(registry.envs.get(cfg.env.name), cfg.env.name):
        return  # a mixture refuses seated envs when its session is built
    refused = {
        f"rollout.strategy={cfg.rollout.strategy} (budget {cfg.rollout.budget})": searched(cfg),
        "rollout.async_generation=true": cfg.rollout.async_generation,
        f"algorithm.advantage={cfg.algorithm.advantage} (a greedy episode per task)": wants_greedy_baseline(cfg),
    }
    for setting, on in refused.items():
        if on:
            raise ConfigError(
                f"env {cfg.env.name!r} has seats: its games play in the batched rollout on this process, so "
                f"{setting} cannot train on them; use rollout.strategy=chain, synchronous generation and a "
                "group estimator (grpo's default)"
            )


def warn_unread_by_dpo(cfg: TrainRunConfig) -> None:
    """Warn of ``algorithm.*`` keys (and ``ppo_epochs``) set away from their defaults that the dpo recipe does
    not read: it trains on pairs with its own loss and ``algorithm.dpo_beta``, so an estimator, a policy loss
    or a KL setting given beside it would do nothing, silently."""
    import dataclasses
    import warnings

    if cfg.algorithm.name != "dpo":
        return
    defaults = type(cfg.algorithm)()
    unread = [
        f"algorithm.{f.name}={getattr(cfg.algorithm, f.name)!r}"
        for f in dataclasses.fields(cfg.algorithm)
        if f.name not in ("name", "dpo_beta") and getattr(cfg.algorithm, f.name) != getattr(defaults, f.name)
    ]
    if cfg.ppo_epochs != type(cfg)().ppo_epochs:
        unread.append(f"ppo_epochs={cfg.ppo_epochs}")
    if unread:
        warnings.warn(
            f"the dpo recipe reads algorithm.dpo_beta alone of these settings, so {', '.join(unread)} "
            "change nothing (they are for grpo and ppo)",
            stacklevel=2,
        )


#: settings only the ppo recipe reads (its critic), and those only a KL to the reference reads
CRITIC_KEYS = ("critic", "value_coef", "value_clip")
KL_KEYS = ("kl_in_reward", "kl_estimator", "kl_horizon")


def warn_unread_by_grpo_or_kl(cfg: TrainRunConfig) -> None:
    """Warn of ``algorithm.*`` settings a grpo or ppo run would ignore, silently: a critic's under grpo (no
    critic is trained), and a KL's where ``kl_coef`` and ``kl_target`` are 0 (no KL is computed: verl's
    coefficient defaults above 0, omrl's to 0)."""
    import warnings

    algo, defaults = cfg.algorithm, type(cfg.algorithm)()
    changed = [key for key in (*CRITIC_KEYS, *KL_KEYS) if getattr(algo, key) != getattr(defaults, key)]
    critic = [key for key in changed if key in CRITIC_KEYS and algo.name != "ppo"]
    if algo.name != "dpo" and algo.dpo_beta != defaults.dpo_beta:
        warnings.warn(
            f"algorithm.dpo_beta={algo.dpo_beta:g} is the dpo recipe's, and this {algo.name} run does not read it",
            stacklevel=2,
        )
    kl = [key for key in changed if key in KL_KEYS and not algo.kl_coef and not algo.kl_target]
    if critic and algo.name != "dpo":  # dpo says its own
        warnings.warn(
            f"{', '.join(f'algorithm.{k}' for k in critic)} set the ppo recipe's critic, and this {algo.name} run trains "
            "none, so they change nothing (--algo ppo trains one)",
            stacklevel=2,
        )
    if kl and algo.name != "dpo":
        warnings.warn(
            f"{', '.join(f'algorithm.{k}' for k in kl)} shape a KL to the reference, which algorithm.kl_coef=0 turns "
            "off, so they change nothing: set algorithm.kl_coef > 0 (or kl_target) to use it",
            stacklevel=2,
        )


def warn_unread_sizes(cfg: TrainRunConfig) -> None:
    """Warn of batch sizes an online recipe would ignore, silently: ``optim.gradient_accumulation_steps``
    (the SFT and reward-model recipes' own; here ``mini_batch_size`` sets the updates of a step) and a
    ``mini_batch_size`` above the episodes a step plays, which makes one update of them all."""
    import warnings

    if cfg.optim.gradient_accumulation_steps != 1:
        warnings.warn(
            f"optim.gradient_accumulation_steps={cfg.optim.gradient_accumulation_steps} is read by omrl sft and "
            "omrl rm train alone; an online step makes one update a mini-batch: set mini_batch_size (episodes an "
            "update) and optim.micro_batch_size (rows a forward) instead",
            stacklevel=2,
        )
    played = cfg.tasks_per_step * cfg.group_size
    if cfg.mini_batch_size > played and not searched(cfg) and not cfg.algorithm.dynamic_sampling:
        warnings.warn(
            f"mini_batch_size={cfg.mini_batch_size} is more than the {played} episodes a step plays (tasks_per_step "
            f"{cfg.tasks_per_step} x group_size {cfg.group_size}): each step makes one update of them all, as "
            "mini_batch_size=0 does",
            stacklevel=2,
        )
