"""One rule for the settings a run plays.

A shipped preset is a recipe for one env (``grpo`` is WebShop's). Played on another env, the turn
cap becomes that env's own and what else the recipe keeps is named before the first rollout. A
model trained by omrl is evaluated with the settings it trained with. And every run prints, in
one block, the env, template, turn cap, token limits and reward weights it will play.
"""

from __future__ import annotations

from typing import Any

# what a preset tunes for its env, beyond the env's name; the turn cap falls back to the env's own
RECIPE_KEYS = (
    "env.template",
    "env.demonstration",
    "generation.max_new_tokens",
    "generation.max_context",
    "reward.weights",
)
# what an evaluation takes over from the run that trained the model (sampling stays eval's own)
TRAINED_KEYS = ("env.template", "env.max_turns", "generation.max_new_tokens", "generation.max_context")


def value_at(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def set_value(cfg: Any, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for part in path:
        cfg = getattr(cfg, part)
    setattr(cfg, last, value)


def shown(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def preset_env(preset: str | None) -> str | None:
    """The env a preset (a shipped name or a YAML path) was written for, if it names one."""
    from omrl.config import read_preset

    if not preset:
        return None
    env = read_preset(preset).get("env")
    return env.get("name") if isinstance(env, dict) else None


def outside_the_presets_env(cfg: Any, args: list[str] | None, preset: str | None, console: Any) -> None:
    """Playing preset ``preset`` on an env other than its own: the turn cap becomes the env's own
    (``env.max_turns=0``) unless set, and the recipe's other settings that are kept are named."""
    from omrl.config import user_sets

    own = preset_env(preset)
    if own is None or own == cfg.env.name:
        return
    said = []
    if cfg.env.max_turns and not user_sets(args, "env.max_turns"):
        said.append(f"env.max_turns=0 (the env's own cap, not {own}'s {cfg.env.max_turns})")
        cfg.env.max_turns = 0
    defaults = type(cfg)()
    kept = [
        f"{key}={shown(value_at(cfg, key))}"
        for key in RECIPE_KEYS
        if hasattr(cfg, key.split(".")[0])
        and value_at(cfg, key) != value_at(defaults, key)
        and not user_sets(args, key)
    ]
    if kept:
        said.append(f"kept from it: {', '.join(kept)}")
    console.print(
        f"preset {preset} is a recipe for {own}; on {cfg.env.name}: {'; '.join(said)} (key=value sets any of them)",
        highlight=False,
        soft_wrap=True,
    )


def trained_settings(model: str, env: str) -> dict[str, Any]:
    """The :data:`TRAINED_KEYS` of the run directory ``model`` when it trained on ``env`` ({} otherwise)."""
    from pathlib import Path

    import yaml

    run_config = Path(model).expanduser() / "config.yaml"
    if not run_config.is_file():
        return {}
    try:
        data = yaml.safe_load(run_config.read_text(encoding="utf-8"))
        if value_at(data, "env.name") != env:
            return {}
        return {key: value_at(data, key) for key in TRAINED_KEYS}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
        return {}  # not a run's config: nothing is known of how the model was trained


def settings_as_trained(cfg: Any, args: list[str] | None, trained: dict[str, Any], console: Any) -> None:
    """Evaluate a model trained by omrl with the template, turn cap and token limits it trained
    with on this env (``trained``: see :func:`trained_settings`), unless the command line sets
    them; say which were taken."""
    from omrl.config import user_sets

    taken = []
    for key, value in trained.items():
        if value != value_at(cfg, key) and not user_sets(args, key):
            set_value(cfg, key, value)
            taken.append(f"{key}={shown(value)}")
    if taken:
        console.print(
            f"as {cfg.model.name} trained: {', '.join(taken)} (key=value sets any of them)",
            highlight=False,
            soft_wrap=True,
        )


def play_settings(cfg: Any, args: list[str] | None, default_preset: str | None, console: Any) -> None:
    """The settings rule for a command that plays a model in an env: a model trained by omrl on
    this env plays as it trained (and on the prompts it trained on); else a preset played outside
    its env keeps only what it names."""
    from omrl.cli.model_prompts import prompts_as_trained
    from omrl.config.loading import split_preset

    trained = trained_settings(cfg.model.name, cfg.env.name)
    if trained:
        settings_as_trained(cfg, args, trained, console)
    else:
        preset = split_preset(args[0] if args else None, [])[0] or default_preset
        outside_the_presets_env(cfg, args, preset, console)
    prompts_as_trained(cfg, args, console)


def settings_block(cfg: Any) -> str:
    """What a run will play, in one block: env, template, turn cap, token limits, reward weights."""
    env, generation = cfg.env, cfg.generation
    turns = str(env.max_turns) if env.max_turns else "the env's own cap"
    lines = [
        f"env        {env.name} (split {env.split}), template {env.template}, "
        f"worked example {'on' if env.demonstration else 'off'}",
        f"turns      {turns}",
        f"tokens     {generation.max_new_tokens} new a reply, {generation.max_context} a whole episode, "
        f"temperature {generation.temperature:g}",
    ]
    reward = getattr(cfg, "reward", None)
    if reward is not None:
        lines.append(f"reward     {shown(reward.weights)} ({reward.allocation})")
    algorithm = getattr(cfg, "algorithm", None)
    if algorithm is not None and algorithm.name != "dpo":
        from omrl.training.rollout_correction import correction_name

        chosen = correction_name(cfg)
        rollout = cfg.rollout
        lag = f", weights {rollout.max_staleness} behind" if rollout.async_generation and rollout.max_staleness else ""
        auto = algorithm.rollout_correction == "auto"
        why = f" (auto: {generation.backend} backend, {cfg.model.dtype}{lag})" if auto else ""
        where = f"generation process {rollout.max_staleness} steps ahead; " if rollout.async_generation else ""
        lines.append(f"sampler    {where}rollout correction {chosen}{why}")
        lines.append(f"algorithm  {algorithm_line(algorithm)}")
    return "\n".join(lines)


def algorithm_line(algo: Any) -> str:
    """The recipe's maths in one line: estimator, loss and its aggregation, KL, batch shaping, teacher."""
    parts = [f"{algo.name}: advantage {algo.advantage}, policy loss {algo.policy_loss} ({algo.loss_agg_mode})"]
    if algo.kl_coef > 0:
        adaptive = f", adapting toward {algo.kl_target:g} a token" if algo.kl_target > 0 else ""
        where = "in the reward" if algo.kl_in_reward else "in the loss"
        parts.append(f"KL {algo.kl_estimator} x {algo.kl_coef:g} {where}{adaptive}")
    if algo.dynamic_sampling:
        parts.append(f"dynamic sampling (up to {algo.dynamic_sampling_max_draws} extra draws)")
    if algo.teacher:
        parts.append(f"teacher {algo.teacher} x {algo.teacher_coef:g}")
    return "; ".join(parts)
