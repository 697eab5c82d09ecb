"""The hooks a plugin can implement. Each one is docstring-only.

A plugin is a module (or object) listed under the ``omrl`` entry-point group that
implements any of these with ``@omrl.hookimpl``. ``register`` is a callback the
host passes in; the registries are built from it lazily at each lookup.

Any ``register`` also takes, instead of the object, its import path
``"package.module:attribute"``: omrl imports it when the component is used, and
lists it (``omrl plugins``) from its source's docstring, so a plugin whose code
needs torch costs nothing to list.

An env, reward, template, strategy and scorer read their options from the
config's ``plugins.<name>`` block, so two of them of different distributions may
not share a name (one package may share a block on purpose: the built-in reward
and scorer ``rm``). A hook of another name than these, or with a parameter they
do not pass, fails at load, naming the valid ones.
"""

import pluggy

hookspec = pluggy.HookspecMarker("omrl")
hookimpl = pluggy.HookimplMarker("omrl")


@hookspec
def register_envs(register):
    """Register multi-turn text environments.

    :param register: ``register(name, env_class)``. ``env_class`` subclasses
        :class:`omrl.envs.Env`: ``env_class(**options)`` builds one instance,
        ``task_ids(split)`` lists its tasks, ``reset(task_id)`` starts an
        episode, ``step(action_text)`` plays one turn, ``close()`` frees it.
        Register the class, not an instance: one that is no concrete subclass
        of ``Env`` is refused as registered (by import path, when imported).
    """


@hookspec
def register_rewards(register):
    """Register reward functions.

    :param register: ``register(name, fn)``. ``fn(episodes, **options)`` takes a
        list of :class:`omrl.data.Episode` and returns one list of per-turn
        floats per episode (an episode-level reward sits on the last turn).
        ``register(name, fn, check_options=check)``: ``check(**options)`` raises
        :class:`omrl.errors.ConfigError` for a bad option without scoring (a missing
        file, an unknown mode), so a run refuses it before it plays anything.
    """


@hookspec
def register_templates(register):
    """Register action templates.

    :param register: ``register(name, template_class)``. A template subclasses
        :class:`omrl.templates.Template`: it renders the system instructions for an
        env and parses a model response into an action or a parse error. As
        for envs, register the class itself; it may not be abstract.
    """


@hookspec
def register_algorithms(register):
    """Register training algorithms.

    :param register: ``register(name, fn, kind=KIND)`` with ``KIND`` one of
        ``"advantage"`` (advantage estimators), ``"policy_loss"`` (policy
        losses), ``"kl"`` (KL-divergence estimators) or ``"rollout_correction"``
        (corrections for the sampler's log-probs).
        Every function of one kind shares one calling convention, documented in
        :mod:`omrl.algos`, so the training recipe never branches on a name.

        A function declares what the recipe must know of it as keywords (its
        traits; any other keyword is refused, naming the valid ones):

        - ``kind="advantage"``: ``needs=("greedy_scores",)``, the rollout must
          also play a greedy episode of each task and fill
          ``AdvantageInput.greedy_scores`` (ReMax's baseline); ``reads_trees=True``,
          it differs from its plain form only on a search's trees (a chain rollout is warned of).
        - ``kind="policy_loss"``: ``zero_advantage_rows_add_nothing=True``, each
          row's loss reads that row alone and is 0, with a 0 gradient, where its
          advantages are all 0, so the recipe may skip such rows.
        - ``kind="kl"`` and ``kind="rollout_correction"`` declare none.

        Before any rollout the recipe runs the configured estimator and policy
        loss once on a probe batch: a result outside the calling convention
        (advantages and returns not two finite tensors shaped as ``loss_mask``;
        a loss not a 0-d tensor with a gradient beside a dict of numbers) is
        an error naming the function and its plugin. The estimator's result
        on each real rollout is checked the same way.
    """


@hookspec
def register_rollout_strategies(register):
    """Register rollout strategies (chain, best-of-N, tree searches) and the scorers they rank nodes by.

    :param register: ``register(name, fn, kind=KIND)`` with ``KIND`` ``"strategy"``
        (the default) or ``"scorer"``. A strategy is
        ``fn(ctx, tasks, **options) -> list[omrl.search.Tree]``: ``ctx`` is an
        :class:`omrl.search.SearchContext`, one tree per task, options from the
        config's ``plugins.<name>`` block. A scorer is
        ``fn(nodes, ctx, **options) -> list[float]``, higher is better.
        Both conventions are documented in :mod:`omrl.search`.

        A strategy declares how the core is to treat it as keywords,
        ``register(name, fn, group_in_one_tree=True, batched_without_budget=True)``
        (the fields of :class:`omrl.search.StrategyTraits`; all False when not given).
        The core reads these, never the strategy's name, so a plugin that declares
        what a built-in declares is treated exactly as that built-in. A scorer may
        declare ``check_options=check``: ``check(**options)`` raises ConfigError for a
        bad option before anything is played (a path that holds no model), where the
        search would meet it only when it first scores. A strategy that returns other than one ``Tree`` per task, in
        the order given (``task_id`` the task's, ``group`` its position), is an error
        naming it.
    """


@hookspec
def register_commands(cli):
    """Add commands to the ``omrl`` command line.

    :param cli: the root ``typer.Typer`` app; call ``cli.command()`` or
        ``cli.add_typer()`` on it.
    """
