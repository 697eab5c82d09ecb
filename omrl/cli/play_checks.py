"""What a command that plays episodes refuses before any model loads (seconds, not minutes): an unknown or
uninstalled env, plugin blocks no component reads, reward settings, an agent program where it cannot
play, and for training the whole train config; and what it warns of: a run's final model that its run
trained past, and a plugin block for an env the run does not play."""

from __future__ import annotations


def check_before_loading(cfg, model_made: bool = True, reach: bool = True) -> None:
    """What can be refused before a model loads (seconds to minutes): a model that is not there (unless
    ``model_made`` is False: ``config show`` writes configs for models a stage will make), an unknown env,
    an env whose package is not installed (naming its extra), each env of a mixture alike (and the mixture
    itself: weights, an env named twice), the reward settings, a remote env's server that cannot be reached
    (unless ``reach`` is False: ``config show`` only reads), and for training, the whole train config
    (:func:`omrl.training.config_checks.check_config`)."""
    from omrl import registry, rewards
    from omrl.envs import check_env_reachable, install_command, package_installed
    from omrl.errors import ConfigError
    from omrl.mixture import mix_members
    from omrl.models.folders import check_model_name
    from omrl.processes import is_main_process

    if model_made:
        check_model_name(cfg.model.name)
    members = mix_members(cfg)  # one member for a single env
    for member in members:
        env_class = registry.envs.get(member.name)
        if isinstance(env_class, type) and not package_installed(env_class):
            raise ConfigError(
                f"the {member.name} env needs the package {env_class.package}, not installed: "
                f"{install_command(env_class)}"
            )
        check_plugin_blocks(member.plugins)  # the run's block with the env's own merged in
        rewards.check_weights(member.reward_weights)
        rewards.check_options(member.reward_weights, member.plugins)  # first: a block a reward and a scorer
        check_search_blocks(member.plugins)  # share is named for the reward where it is weighted
        check_family_block(member.name, member.plugins, {m.name for m in members})
        if reach and is_main_process():  # a server that is down is said now, not after the model's load; once
            check_env_reachable(env_class, (member.plugins or {}).get(member.env.name), member.env.name)
    warn_unplayed_env_blocks(members)
    warn_unweighted_reward_blocks(members)
    warn_unused_strategy_blocks(cfg)
    rewards.check_allocation(cfg.reward.allocation, cfg.reward.gamma)
    check_agent(cfg)
    warn_if_final_model_behind(cfg.model.name)
    algorithm = getattr(cfg, "algorithm", None)
    if algorithm is not None:
        registry.algorithms.component(algorithm.advantage, kind="advantage")
        registry.algorithms.component(algorithm.policy_loss, kind="policy_loss")
        registry.algorithms.component(algorithm.kl_estimator, kind="kl")
        if algorithm.teacher and model_made:
            check_model_name(algorithm.teacher, "algorithm.teacher")
        from omrl.training.rollout_correction import correction_name

        correction_name(cfg)  # a name it does not know is refused, naming auto beside the registered ones
        from omrl.training.config_checks import check_config

        check_config(cfg)


def warn_if_final_model_behind(model: str) -> None:
    """Say so when the run folder ``model`` holds a final model its run trained past: playing it is
    playing an older model than the run's (:func:`omrl.training.checkpoint_marker.final_model_behind`)."""
    import warnings

    from omrl.training.checkpoint_marker import final_model_behind

    behind = final_model_behind(model)
    if behind is not None:
        warnings.warn(behind, stacklevel=2)


def check_plugin_blocks(plugins: dict) -> None:
    """Each ``plugins.<name>`` block is read by the component of that whole name (colon and all:
    ``reasoning-gym:letter_counting``); one that names no component would be ignored, silently."""
    import difflib

    from omrl import registry
    from omrl.errors import ConfigError

    if not plugins:
        return
    known = {name for found in registry.ALL.values() for kind in found.kinds for name in found.names(kind)}
    readers = {name for found in registry.ALL.values() for kind in found.kinds if kind in registry.OPTION_KINDS
               for name in found.names(kind)}  # fmt: skip
    for name in plugins:
        if name in known and name not in readers:  # an algorithm's: its settings are the core's algorithm.* keys
            raise ConfigError(
                f"plugins.{name}: {name} is an algorithm component, and those take no plugin options, so none "
                "would read these; the algorithm's settings are the algorithm.* keys (`omrl config keys train`)"
            )
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(f'plugins.{match}' for match in close)}?" if close else ""
            raise ConfigError(
                f"plugins.{name}: no env, template, reward, strategy, scorer or algorithm is named {name}, so no "
                f"plugin would read these options{hint} (`omrl plugins` lists the names)"
            )


def warn_unplayed_env_blocks(members: list) -> None:
    """Warn of a ``plugins.<env>`` block for an env this run does not play (a config written for another
    env, then ``--env`` changed): no component reads it, and its options would be ignored, silently. A name
    another kind shares (a reward, a template) may be read by that one, so it is left alone."""
    import warnings

    from omrl import registry

    played = {member.name for member in members}
    others = {c.name for c in registry.all_components() if c.kind in registry.OPTION_KINDS and c.kind != "env"}
    blocks = {name for member in members for name in member.plugins or {}}
    for name in sorted(blocks - played - others):
        if name in registry.envs.names() and name.partition(":")[0] not in played:
            warnings.warn(
                f"plugins.{name} sets options of the env {name!r}, which this run does not play "
                f"({', '.join(sorted(played))}), so they are ignored",
                stacklevel=2,
            )


def warn_unweighted_reward_blocks(members: list) -> None:
    """Warn of a ``plugins.<reward>`` block for a reward no env of this run weights (a judge's options set,
    its weight forgotten): nothing reads it, and the run trains without it, silently. A name another kind
    shares (an env, a template, a scorer) may be read by that one, so it is left alone."""
    import warnings

    from omrl import registry

    weighted = {name for member in members for name in member.reward_weights or {}}
    others = {c.name for c in registry.all_components() if c.kind in registry.OPTION_KINDS and c.kind != "reward"}
    blocks = {name for member in members for name in member.plugins or {}}
    for name in sorted(blocks - weighted - others):
        if name in registry.rewards.names():
            warnings.warn(
                f"plugins.{name} sets options of the reward {name!r}, which no env of this run weights "
                f"(reward.weights: {', '.join(sorted(weighted)) or 'none'}), so they are ignored; "
                f"weight it ('reward.weights={{{name}: 1.0}}') or leave the block out",
                stacklevel=2,
            )


def warn_unused_strategy_blocks(cfg) -> None:
    """Warn of a ``plugins.<strategy>`` block for a strategy this run does not play (``--strategy beam`` with
    ``plugins.mcts.iterations=2``): nothing reads it, and a user who tuned the search did not."""
    import warnings

    from omrl import registry

    rollout = getattr(cfg, "rollout", None)
    played = set(getattr(cfg, "strategies", None) or ([rollout.strategy] if rollout is not None else []))
    if not played:
        return
    shared = {c.name for c in registry.all_components() if c.kind != "strategy"}  # a block another kind reads
    for name in sorted(set(cfg.plugins or {}) - played - shared):
        if name in registry.strategies.names("strategy"):
            warnings.warn(
                f"plugins.{name} sets options of the strategy {name!r}, which this run does not play (it plays "
                f"{', '.join(sorted(played))}), so they are ignored; play it (--strategy {name}) or leave the block out",
                stacklevel=2,
            )


def check_search_blocks(plugins: dict) -> None:
    """The options of each rollout strategy and scorer a ``plugins.<name>`` block names: one it does not
    take, or text where its default is a flag or a number, is refused now, not when the search first
    calls it (a scorer's, perhaps after the whole rollout); so is a value a scorer's ``check_options``
    trait refuses."""
    import inspect

    from omrl import registry
    from omrl.errors import ConfigError
    from omrl.plugin_options import check_options, option_type_problem

    shared = {c.name for c in registry.all_components() if c.kind not in ("strategy", "scorer")}
    for kind in ("strategy", "scorer"):
        for component in registry.strategies.components(kind):
            options = (plugins or {}).get(component.name)
            if not isinstance(options, dict) or isinstance(component.target, str):
                continue
            fn = registry.strategies.get(component.name, kind=kind)
            check = component.traits.get("check_options")
            if check is not None:
                check(**options)
            if component.name not in shared:
                check_options(fn, options, f"{kind} {component.name!r}", fixed=2)
                continue
            # a block two kinds of one plugin read may hold the other's keys: its values' types alone
            problem = option_type_problem(inspect.signature(fn), options)
            if problem:
                raise ConfigError(f"{kind} {component.name!r} option {problem}")
    # a scorer a strategy's block names (select=rm) with no block of its own: its defaults checked, now
    scorers = {c.name: c for c in registry.strategies.components("scorer")}
    for component in registry.strategies.components("strategy"):
        for value in ((plugins or {}).get(component.name) or {}).values():
            named = scorers.get(value) if isinstance(value, str) else None
            if named is not None and not isinstance((plugins or {}).get(value), dict):
                check = named.traits.get("check_options")
                if check is not None:
                    check()


def check_family_block(env: str, plugins: dict, played: set[str]) -> None:
    """A family's block (``plugins.verifiers``) is read by the env of that name alone, not by a member of the
    family (``verifiers:vf_sums`` reads ``plugins."verifiers:vf_sums"``): where only members play, its
    options would be ignored, silently."""
    from omrl import registry
    from omrl.errors import ConfigError

    family = env.partition(":")[0]
    if family != env and family in plugins and family not in played and family in registry.envs.names():
        raise ConfigError(
            f"plugins.{family} is read by the env {family!r} alone, which this run does not play; the env "
            f"{env!r} reads its options from its own block: plugins.{env}.NAME=VALUE"
        )


def check_agent(cfg) -> None:
    """An agent program (``agent.*``) is refused where it cannot play: beside the scripted expert, in a
    mixture, under a search strategy or async generation; and its callable and reward must import.
    Any backend serves it (the gateway gives each backend token ids and records the ids it returns)."""
    from omrl.config.sections import AGENT_SAMPLING
    from omrl.errors import ConfigError
    from omrl.rollout.session import agent_of

    agent = getattr(cfg, "agent", None)
    if agent is None or agent_of(cfg) is None:
        return
    if agent.sampling not in AGENT_SAMPLING:
        raise ConfigError(f"agent.sampling is {agent.sampling!r}; valid: {', '.join(AGENT_SAMPLING)}")
    if getattr(cfg, "use_expert", False):
        raise ConfigError("--expert plays the env's scripted expert; an agent program plays with the model (drop one)")
    from omrl.mixture import is_mixture

    if is_mixture(cfg.env):
        raise ConfigError("an agent program plays one env's tasks; a mixture of envs is not supported with agent.*")
    from omrl.search.context import plays_batched

    rollout = getattr(cfg, "rollout", None)  # a sweep names its strategies apart
    strategy, budget = (rollout.strategy, rollout.budget) if rollout is not None else ("chain", 0)
    if not plays_batched(strategy, budget):
        raise ConfigError(
            f"an agent program plays whole episodes: strategy {strategy!r} (budget {budget}) would fork an "
            "agent's process mid-episode; use a strategy that plays the batched rollout with no budget (chain)"
        )
    if getattr(getattr(cfg, "rollout", None), "async_generation", False):
        raise ConfigError("rollout.async_generation is not supported with an agent program yet; set it to false")
