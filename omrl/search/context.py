"""What a strategy is given (:class:`SearchContext`) and how one is run by name (:func:`run_strategy`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence

from omrl import registry
from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.envs import check_seats
from omrl.errors import ConfigError, OmrlError, PluginError, short_repr
from omrl.plugin_options import check_arguments
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.spec import RolloutLimits
from omrl.search.tree import Tree
from omrl.supervisor import stage
from omrl.templates import Template

Scorer = Callable[[list, "SearchContext"], list[float]]


@dataclass
class SearchContext:
    """The env pool, template, tokenizer, backend and limits of a session, plus the search's own settings.

    ``budget`` is the number of model tokens each task's search may generate (0: no
    limit); scorer prompts count as well as replies. ``group_size`` is the number of
    samples per task, which only a strategy that declares ``group_in_one_tree`` takes
    (:class:`StrategyTraits`; the others build one tree per task). ``plugin_options`` is the
    config's per-plugin block: a strategy's options come from ``plugins.<strategy>``, a
    scorer's from ``plugins.<scorer>``.
    """

    pool: EnvPool
    template: Template
    tokenizer: Any
    backend: Backend | None
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    split: str = "train"
    seed: int = 0
    budget: int = 0
    group_size: int = 1
    expert: bool = False
    demonstration: bool = True
    progress: RolloutProgress | None = None
    plugin_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    strategy: str = ""
    calls: int = 0  # backend calls so far: each call's sampling seed follows it, as in the chain rollout

    @classmethod
    def from_session(
        cls, session: Any, spec: Any, progress: RolloutProgress | None = None, env: str | None = None
    ) -> "SearchContext":
        """A context over env ``env`` (None: the only one) of a :class:`~omrl.rollout.RolloutSession`: its
        pool, template and plugin options, the session's tokenizer and backend, playing as ``spec`` (a
        :class:`~omrl.rollout.spec.PlaySpec`) says; the limits are the spec's or the session's, with the
        env's own turn cap."""
        lane = session.env_of(env)
        limits = replace(spec.limits or session.limits, max_turns=lane.max_turns)
        return cls(
            lane.pool,
            lane.template,
            session.tokenizer,
            session.backend,
            limits,
            split=spec.split or lane.split,
            seed=spec.seed,
            budget=spec.budget,
            group_size=spec.group_size,
            expert=spec.expert,
            demonstration=lane.demonstration,
            progress=progress,
            plugin_options=dict(lane.plugin_options or {}),
            strategy=spec.strategy,
        )

    def options(self, name: str) -> dict[str, Any]:
        """The ``plugins.<name>`` block (a strategy's or a scorer's options)."""
        return dict(self.plugin_options.get(name) or {})

    def scorer(self, name: str) -> Callable[[list], list[float]]:
        """The registered scorer ``name`` with its options bound: ``fn(nodes) -> list[float]``."""
        fn = registry.strategies.get(name, kind="scorer")
        options = self.options(name)
        check_arguments(fn, options, f"scorer {name!r}", "options", fixed=2)

        def score(nodes: list) -> list[float]:
            values = fn(nodes, self, **options)
            if len(values) != len(nodes) or not all(_finite(v) for v in values):
                raise OmrlError(
                    f"scorer {name!r} returned {len(values)} values for {len(nodes)} nodes "
                    "(one finite number per node is needed)"
                )
            return [float(v) for v in values]

        return score

    def generate(
        self, nodes: Sequence[Any], prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 0.0
    ) -> list[Generation | None]:
        """Generate for scorers: one prompt per node, charged to each node's tree budget.

        A node whose tree cannot afford ``max_new_tokens`` more gets None (and its tree
        is marked exhausted). All affordable prompts go in one backend call.
        """
        if self.backend is None:
            raise OmrlError("this scorer needs a generation backend (a model), not the env's expert")
        reserved: dict[int, int] = {}
        chosen = []
        for i, node in enumerate(nodes):
            tree = node.tree
            left = tree.remaining() if tree is not None else None
            if left is not None and reserved.get(tree.group, 0) + max_new_tokens > left:
                tree.exhausted = True
                continue
            if tree is not None:
                reserved[tree.group] = reserved.get(tree.group, 0) + max_new_tokens  # a search's groups are its tasks
            chosen.append(i)
        out: list[Generation | None] = [None] * len(nodes)
        if not chosen:
            return out
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=self.next_seed()
        )
        with stage("generate", episode=f"{len(chosen)} search nodes"):
            replies = self.backend.generate([prompts[i] for i in chosen], params)
        for i, reply in zip(chosen, replies):
            out[i] = reply
            self.charge(nodes[i].tree, len(reply.token_ids))
        return out

    def next_seed(self) -> int:
        """The sampling seed of the next backend call (the chain rollout's formula), counting the call."""
        seed = self.seed * 1_000_003 + self.calls * 10_007
        self.calls += 1
        return seed

    def charge(self, tree: Any, tokens: int) -> None:
        """Count ``tokens`` generated for ``tree`` (and in the progress display)."""
        if tree is not None:
            tree.generated_tokens += tokens
        if self.progress is not None:
            self.progress.generated(tokens)


@dataclass(frozen=True)
class StrategyTraits:
    """What a strategy declares when it registers (``register(name, fn, **traits)``), so that the
    core treats alike every strategy that declares the same, whatever its name.

    ``group_in_one_tree``: a task's ``group_size`` samples are the paths of one tree, grown from
    ``ctx.group_size``; otherwise training grows ``group_size`` trees per task, each with
    ``group_size`` 1 (Tree-GRPO's M trees per prompt). ``batched_without_budget``: without a
    budget its episodes are the batched rollout's (:func:`omrl.rollout.collect`), as played:
    independent samples with no tree ids, so training batches them as chains, ``omrl eval``
    scores every sample (pass@k) and a sweep plays it once, as pass@1 with no budget.
    """

    group_in_one_tree: bool = False
    batched_without_budget: bool = False


def strategy_traits(name: str) -> StrategyTraits:
    """The traits strategy ``name`` registered with; an unknown name lists the valid ones."""
    component = registry.strategies.component(name)
    try:
        return StrategyTraits(**component.traits)
    except TypeError as exc:
        valid = ", ".join(f.name for f in fields(StrategyTraits))
        raise PluginError(
            f"plugin {component.plugin!r} registered strategy {name!r} with traits "
            f"{', '.join(sorted(component.traits))}; valid: {valid}"
        ) from exc


def plays_batched(name: str, budget: int) -> bool:
    """Whether strategy ``name`` at ``budget`` plays the plain batched rollout (see :class:`StrategyTraits`)."""
    return not budget and strategy_traits(name).batched_without_budget


def run_strategy(ctx: SearchContext, tasks: Sequence[int]) -> list:
    """Run the strategy ``ctx.strategy`` on ``tasks`` with its ``plugins.<name>`` options: one Tree per task.

    Checks what every strategy shares: a known name, options it takes, and a
    budget of at least one whole reply.
    """
    fn = registry.strategies.get(ctx.strategy)
    if check_seats(ctx.pool.env_class, ctx.pool.name):  # a tree of one chat cannot hold several seats' chats
        raise ConfigError(
            f"env {ctx.pool.name!r} has seats: strategy {ctx.strategy!r} searches the chat of one agent; "
            "play its games with the batched rollout (rollout.strategy=chain, no budget)"
        )
    check_budget(ctx.budget, ctx.limits.max_new_tokens)
    options = ctx.options(ctx.strategy)
    check_arguments(fn, options, f"strategy {ctx.strategy!r}", "options", fixed=2)
    trees = fn(ctx, list(tasks), **options)
    if ctx.backend is not None:
        ctx.backend.release()  # cached KV states of finished branches, where the backend keeps some
    check_trees(ctx.strategy, trees, list(tasks))
    return list(trees)


def check_trees(name: str, trees: Any, tasks: list) -> None:
    """PluginError naming strategy ``name`` and its plugin unless ``trees`` is one :class:`Tree` per task
    of ``tasks``, in their order: a tree too few would shrink an evaluation, silently."""
    problem = None
    if not isinstance(trees, (list, tuple)):
        problem = f"returned {short_repr(trees)}"
    elif len(trees) != len(tasks):
        problem = f"returned {len(trees)} trees for {len(tasks)} tasks"
    else:
        for i, (tree, task) in enumerate(zip(trees, tasks)):
            if not isinstance(tree, Tree):
                problem = f"returned {short_repr(tree)} as the tree of task {task!r} (position {i})"
            elif tree.task_id != task or tree.group != i:
                problem = (
                    f"returned at position {i} the tree of task {tree.task_id!r} (group {tree.group}) where "
                    f"task {task!r} (group {i}) was expected"
                )
            if problem:
                break
    if problem:
        component = registry.strategies.component(name)
        raise PluginError(
            f"strategy {name!r} (plugin {component.plugin!r}, {component.distribution}) {problem}; valid: a list "
            "of omrl.search.Tree, one per task in the order given, each with the task's id and its position "
            "as group"
        )


def check_expert(strategy: str, budget: int) -> None:
    """The env's scripted expert plays the batched rollout alone (chain without a budget): any other
    strategy or budget samples candidates, which needs a model. Checkable before anything loads."""
    if plays_batched(strategy, budget):
        return
    at = f" with a budget ({budget} tokens)" if budget else ""
    raise ConfigError(
        f"strategy {strategy!r}{at} needs a generation backend (a model); the scripted expert plays only "
        "the chain strategy without a budget (rollout.budget=0)"
    )


def check_budget(budget: int, max_new_tokens: int) -> None:
    """A budget is 0 (no limit) or room for at least one whole reply."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0 or 0 < budget < max_new_tokens:
        raise ConfigError(
            f"budget {budget!r} is smaller than one reply (generation.max_new_tokens={max_new_tokens}); "
            f"valid: 0 (no limit) or at least {max_new_tokens}"
        )


def whole_number(what: str, name: str, value: Any, low: int = 1) -> int:
    """``value`` when it is an integer >= ``low``, else ConfigError naming it and what is valid."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{what} option {name}={value!r} is invalid; valid: a whole number >= {low}")
    return value


def yes_or_no(what: str, name: str, value: Any) -> bool:
    """``value`` when it is true or false, else ConfigError naming it and what is valid (``maybe`` or
    ``"false"`` in quotes is no boolean: taken as truthy it would silently mean true)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what} option {name}={value!r} is invalid; valid: true or false")
    return value


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False
