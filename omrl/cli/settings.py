"""One rule for the settings a run plays.

A shipped preset is a recipe for one env (``grpo`` is WebShop's). Played on another env, the turn
cap becomes that env's own and what else the recipe keeps is named before the first rollout. A
model trained by omrl is evaluated with the settings it trained with. And every run prints, in
one block, the env, template, turn cap, token limits and reward weights it will play.
"""

from __future__ import annotations

import json
from typing import Any

from omrl.errors import ConfigError

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
CHAT_KEYS = ("chat.history", "chat.template_kwargs")  # the model's own, in whichever env it plays


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


def _preset_value(recipe: dict[str, Any], key: str) -> Any:
    """What the preset's YAML sets ``key`` to, or a value no config holds where it sets none."""
    for part in key.split("."):
        if not isinstance(recipe, dict) or part not in recipe:
            return _UNSET
        recipe = recipe[part]
    return recipe


_UNSET = object()


def outside_the_presets_env(cfg: Any, args: list[str] | None, preset: str | None, console: Any) -> None:
    """Playing preset ``preset`` on an env other than its own: the turn cap becomes the env's own
    (``env.max_turns=0``) unless set, and the recipe's other settings that are kept are named."""
    from omrl.config import user_sets

    own = preset_env(preset)
    if own is None or (own == cfg.env.name and not cfg.env.mix):  # env.mix: a mixture, whatever env.name says
        return
    if not user_sets(args, "description"):  # "GRPO on WebShop from ..." read in a gridworld run's config.yaml
        cfg.description = ""
    said = []
    if cfg.env.max_turns and not user_sets(args, "env.max_turns"):
        said.append(f"env.max_turns=0 (the env's own cap, not {own}'s {cfg.env.max_turns})")
        cfg.env.max_turns = 0
    from omrl.config import read_preset

    recipe, defaults = read_preset(preset), type(cfg)()
    kept = [  # the preset's own values that are no default (a flag's, such as --template, is the user's)
        f"{key}={shown(value_at(cfg, key))}"
        for key in RECIPE_KEYS
        if hasattr(cfg, key.split(".")[0])
        and value_at(cfg, key) != value_at(defaults, key)
        and _preset_value(recipe, key) == value_at(cfg, key)
        and not user_sets(args, key)
    ]
    if kept:
        said.append(f"kept from it: {', '.join(kept)}")
    if not said:  # the command line set everything the recipe tunes
        return
    console.print(
        f"preset {preset} is a recipe for {own}; on {env_label(cfg)}: {'; '.join(said)} (key=value sets any of them)",
        highlight=False,
        soft_wrap=True,
    )


def agent_reward_weights(cfg: Any, args: list[str] | None, console: Any) -> None:
    """An agent program plays no action template, so a preset's reward terms that score a template's
    replies mean nothing for it: unless the command line sets ``reward.weights``, an agent run takes
    the config's default weights, and says so."""
    from omrl.config import user_sets

    agent, reward = getattr(cfg, "agent", None), getattr(cfg, "reward", None)
    if agent is None or reward is None or not (agent.callable or agent.command) or user_sets(args, "reward.weights"):
        return
    default = type(reward)().weights
    if dict(reward.weights) != default:
        console.print(
            f"an agent program plays no action template: reward.weights={shown(default)}, not the preset's "
            f"{shown(reward.weights)} (key=value sets it)",
            highlight=False,
            soft_wrap=True,
        )
        reward.weights = default


def played_settings(cfg: Any) -> dict[str, str]:
    """What a trajectory file records of the settings its episodes were played with (an SFT run on it then
    plays as its data did: :func:`datasets_played`); nothing for a mixture, whose envs' may differ."""
    return {} if cfg.env.mix else {"env.name": cfg.env.name, "env.template": cfg.env.template}


def datasets_played(data: Any) -> dict[str, str]:
    """For the config ``data`` of an SFT run: the settings each of its datasets recorded (every trajectory
    file of them the same ones), or {} where one records none or they differ."""
    from pathlib import Path

    from omrl.data.mixture import dataset_sources
    from omrl.data.trajectory import recorded_played

    try:
        sources = dataset_sources(str(data.get("dataset") or "")) if data.get("command") == "sft" else []
    except ConfigError:
        return {}
    found = []
    for source in sources:
        path = Path(source.path).expanduser()
        found += [recorded_played(f) for f in (sorted(path.glob("*.parquet")) if path.is_dir() else [path])]
    return found[0] if found and all(f and f == found[0] for f in found) else {}


def trained_settings(model: str, env: str, mix: list[Any] | None = None) -> dict[str, Any]:
    """The :data:`TRAINED_KEYS` of the run directory ``model`` when it trained on ``env`` (else only its
    :data:`CHAT_KEYS`: how its chat template was rendered holds in any env),
    and each of its envs' own options (``plugins.<env>``: the dataset file, a server's address...) with no
    secret in them: the same ``env.name`` and the same ``env.mix`` but for splits (a mixture's envs each
    take the run's settings unless its entry sets its own, so the same mixture plays them as it trained)."""
    from omrl.config import REDACTED
    from omrl.mixture import parse_env_spec, same_envs

    data = run_config(model)
    played = datasets_played(data)
    if played and "env" not in data:  # an SFT run: the template its data was played with
        data = {**data, "env": {"name": played.get("env.name"), "template": played.get("env.template")}}
    try:
        chat = {key: value_at(data, key) for key in CHAT_KEYS if key.split(".")[1] in (data.get("chat") or {})}
        same_mix = mix_less_splits(data["env"].get("mix")) == mix_less_splits(mix)
        if not same_envs(value_at(data, "env.name"), env) or not same_mix:
            return chat
        out = {**{key: value_at(data, key) for key in TRAINED_KEYS if _holds(data, key)}, **chat}
        plugins = data.get("plugins") or {}
        for name, _ in parse_env_spec(value_at(data, "env.name")):
            options = plugins.get(name)
            if isinstance(options, dict) and options and REDACTED not in json.dumps(options, default=str):
                out[f"plugins.{name}"] = options
        # who sat at the game with it (a scripted opponent, a fixed model); its past checkpoints are the
        # training run's alone, so those seats play the policy here
        seating = (data.get("seats") or {}).get("play") or {}
        fixed = {seat: who for seat, who in seating.items() if not str(who).startswith("past")}
        return {**out, **({"seats.play": fixed} if fixed else {})}
    except (KeyError, TypeError, AttributeError, ConfigError):
        return {}  # not a run's config: nothing is known of how the model was trained


def _holds(data: dict[str, Any], key: str) -> bool:
    """Whether the config ``data`` sets the dotted ``key`` (an SFT run's holds no generation section)."""
    section, _, name = key.partition(".")
    return isinstance(data.get(section), dict) and name in data[section]


def run_config(model: str) -> Any:
    """What the run directory ``model``'s ``config.yaml`` holds as YAML (for a checkpoint's model,
    ``RUN/checkpoints/step-N/model``, the run's); ``{}`` where there is none, or it is no YAML (then nothing
    is known of how the model was trained)."""
    from pathlib import Path

    import yaml

    folder = Path(model).expanduser()
    path = folder / "config.yaml"
    if not path.is_file() and folder.name == "model" and folder.parent.parent.name == "checkpoints":
        path = folder.parent.parent.parent / "config.yaml"  # one of a run's checkpoints' models: the run's settings
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}


def trained_env(model: str, args: list[str] | None, env_flag: str | None) -> dict[str, Any]:
    """``env.name`` (and ``env.mix``) of the run directory ``model``, for a command line that names no env
    itself (no --env, no ``env`` key, no YAML of the user's that sets one): a trained model plays the env
    it trained on, not a shipped preset's. Empty when the command line names one, or ``model`` is not a
    run's folder."""
    from omrl.config import user_sets

    if env_flag or user_sets(args, "env.name") or user_sets(args, "env.mix"):
        return {}
    data = run_config(model)
    played = datasets_played(data)  # an SFT run: the env its data was played on
    try:
        env = data["env"] if "env" in data or not played else {"name": played.get("env.name")}
        name, mix = env["name"], env.get("mix") or []
    except (KeyError, TypeError, AttributeError):
        return {}  # not a run's config: the command's own default env
    return {"env.name": name, **({"env.mix": mix} if mix else {})} if isinstance(name, str) and name else {}


def mix_less_splits(mix: list[Any] | None) -> list[Any]:
    """``env.mix`` less each env's own split: a model is evaluated on other splits of the envs it trained on."""
    return [{k: v for k, v in e.items() if k != "split"} if isinstance(e, dict) else e for e in mix or []]


def settings_as_trained(cfg: Any, args: list[str] | None, trained: dict[str, Any], console: Any) -> None:
    """Evaluate a model trained by omrl with the template, turn cap, token limits and env options it trained
    with on this env (``trained``: see :func:`trained_settings`), unless the command line sets
    them; say which were taken."""
    from omrl.config import user_sets

    taken = []
    for key, value in trained.items():
        if key in ("chat.template_kwargs", "seats.play"):  # the template's options, the seats: the command line's win
            merged = {**value, **value_at(cfg, key)}
            if merged != value_at(cfg, key):
                set_value(cfg, key, merged)
                taken.append(f"{key}={shown(merged)}")
        elif key.startswith("plugins."):  # an env's options: what the command line gives of them wins
            name = key.split(".", 1)[1]
            given = dict(cfg.plugins.get(name) or {})
            merged = {**value, **given}
            if merged != given:
                cfg.plugins[name] = merged
                taken.append(f"{key}={shown(merged)}")
        elif value != value_at(cfg, key) and not user_sets(args, key):
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
    from omrl.config.presets import split_preset

    trained = trained_settings(cfg.model.name, cfg.env.name, cfg.env.mix)
    if trained:
        settings_as_trained(cfg, args, trained, console)
    if "env.max_turns" not in trained:  # an SFT run holds no turn cap, nor a run on another env: not the preset's
        preset = split_preset(args[0] if args else None, [])[0] or default_preset
        outside_the_presets_env(cfg, args, preset, console)
    agent_reward_weights(cfg, args, console)
    prompts_as_trained(cfg, args, console)


def has_worked_example(env_name: str) -> bool | None:
    """Whether the env gives a worked example for its prompts; None where that cannot be told here (an env
    that will not load, or one that asks its server)."""
    from omrl import registry

    try:
        given = getattr(registry.envs.get(env_name), "demonstration", ())
    except Exception:  # noqa: BLE001 - an env that will not load says so when the run starts it
        return None
    return None if isinstance(given, property) else bool(given)


def worked_example_shown(env_name: str, demonstration: bool) -> str:
    """The header's word on the worked example: none in the env, off, on, or on where the server gives one."""
    given = has_worked_example(env_name)
    if not demonstration:
        return "off" if given is not False else "none in this env"
    return {True: "on", False: "none in this env", None: "on, where the env gives one"}[given]


def settings_block(cfg: Any) -> str:
    """What a run will play, in one block: env, template, turn cap, token limits, reward weights."""
    from omrl.mixture import is_mixture, mix_members

    env, generation = cfg.env, cfg.generation
    agent = getattr(cfg, "agent", None)
    if agent is not None and (agent.callable or agent.command):
        scorer = f"reward {agent.reward}" if agent.reward else "the env scores its answer"
        lines = [
            f"env        {env.name} (split {env.split}): its tasks, played by an agent program",
            f"agent      {agent.callable or agent.command} through omrl's OpenAI-compatible endpoint, "
            f"{agent.timeout_s:g} s an episode; {scorer}",
        ]
    elif is_mixture(env):
        lines = mixture_lines(cfg)
    else:
        example = worked_example_shown(env.name, env.demonstration)
        lines = [
            f"env        {env.name} (split {env.split}), template {env.template}, worked example {example}",
            f"turns      {turns_shown(env.max_turns)}",
        ]
    if getattr(cfg, "use_expert", False):  # no model samples: no sampling settings to show
        lines.append(f"player     the env's scripted expert (no model); episodes up to {generation.max_context} tokens")
    else:
        if getattr(cfg, "algorithm", None) is None:  # train's header line names its model already
            lines.append(f"model      {cfg.model.name} ({generation.backend})")
        lines.append(
            f"tokens     {generation.max_new_tokens} new a reply, {generation.max_context} a whole episode, "
            f"temperature {generation.temperature:g}"
        )
    reward = getattr(cfg, "reward", None)
    if reward is not None and not (agent is not None and agent.reward):
        own = [m for m in mix_members(cfg) if m.reward_weights != dict(reward.weights)] if is_mixture(env) else []
        every = len(own) == len(mix_members(cfg))  # the run's weights are no env's: not shown as if they were
        lines.append(f"reward     {'each env its own' if every else shown(reward.weights)} ({reward.allocation})")
        lines += [f"           {m.name}: {shown(m.reward_weights)}" for m in own]
    algorithm = getattr(cfg, "algorithm", None)
    if algorithm is not None and algorithm.name != "dpo":  # dpo: no advantages, nothing to correct
        from omrl.training.rollout_correction import correction_name

        chosen = correction_name(cfg)
        rollout = cfg.rollout
        lag = f", weights {rollout.max_staleness} behind" if rollout.async_generation and rollout.max_staleness else ""
        auto = algorithm.rollout_correction == "auto"
        dtype = f"{cfg.model.dtype}{', bf16 autocast' if getattr(cfg, 'bf16', False) else ''}"
        why = f" (auto: {generation.backend} backend, {dtype}{lag})" if auto else ""
        where = f"generation process {rollout.max_staleness} steps ahead; " if rollout.async_generation else ""
        lines.append(f"sampler    {where}rollout correction {chosen}{why}")
    if algorithm is not None:
        lines.append(f"algorithm  {algorithm.summary()}")
    return "\n".join(lines)


def turns_shown(max_turns: int) -> str:
    return str(max_turns) if max_turns else "the env's own cap"


def mixture_lines(cfg: Any) -> list[str]:
    """A mixture's envs in the settings block: each with its weight where training draws its tasks by
    weight (eval and rollout play as many of each env's), its own split, template, worked example and turn cap."""
    from omrl.mixture import mix_members

    members = mix_members(cfg)
    width = max(len(m.name) for m in members)
    if getattr(cfg, "algorithm", None) is not None:
        envs = ", ".join(f"{m.name} {m.weight:.3g}" for m in members)
    else:
        envs = f"{', '.join(m.name for m in members)}, as many tasks of each"
    lines = [f"envs       a mixture of {len(members)}: {envs}"]
    for m in members:
        env = m.env
        lines.append(
            f"  {m.name:<{width}}  split {env.split}, template {env.template}, worked example "
            f"{worked_example_shown(m.name, env.demonstration)}, turns {turns_shown(env.max_turns)}"
        )
    return lines


def env_label(cfg: Any) -> str:
    """The env a run plays, for messages: its name, or a mixture's envs joined by " + "."""
    from omrl.mixture import is_mixture, mix_members

    return " + ".join(m.name for m in mix_members(cfg)) if is_mixture(cfg.env) else cfg.env.name


def env_folder_name(cfg: Any, longest: int = 60) -> str:
    """The env part of a default output folder's name: the env's name, or for a mixture ``mix-`` and
    its envs' names, with only letters, digits, ``.``, ``_`` and ``-`` (``mix-gridworld-reasoning-gym_basic_arithmetic``);
    a mixture of many envs is ``mix-of-<n>-envs`` rather than a name too long to read."""
    import re

    from omrl.mixture import is_mixture, mix_members

    if not is_mixture(cfg.env):
        return cfg.env.name
    names = [re.sub(r"[^A-Za-z0-9._-]+", "_", m.name).strip("_") for m in mix_members(cfg)]
    folder = "mix-" + "-".join(names)
    return folder if len(folder) <= longest else f"mix-of-{len(names)}-envs"
