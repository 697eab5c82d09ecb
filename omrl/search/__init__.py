"""Rollout strategies: chains, best-of-N and tree searches over forkable envs, returning trees.

:mod:`.context` holds what a strategy is given and runs one by name; :mod:`.runner` grows many trees at
once; :mod:`.branch` makes roots and branches token-exact; :mod:`.fork` copies live episodes;
:mod:`.tree` is trees as data; :mod:`.play` runs a strategy on a session, :mod:`.report` says what the
searches achieved and :mod:`.sweep` is test-time scaling (``omrl sweep``), which resumes only the cells
played with the same setup (:mod:`.sweep_resume`) and draws its picture and table with :mod:`.sweep_display`.

Calling conventions (registered through the ``register_rollout_strategies`` hook):

- **strategy** ``fn(ctx, tasks, **options) -> list[Tree]``: one :class:`Tree` per task,
  in order. ``ctx`` is a :class:`SearchContext`; ``options`` come from the config's
  ``plugins.<name>`` block. What the core must know of it (whether a task's samples are
  one tree, whether it plays the batched rollout without a budget) it declares when it
  registers, as :class:`StrategyTraits`. Tree strategies are usually a generator over one tree
  handed to :func:`run_search` (see :mod:`omrl.search.runner`), which batches every
  tree's candidate replies into one backend call per round, steps each candidate in
  its own env copy and enforces ``ctx.budget`` (generated tokens per task).
- **scorer** ``fn(nodes, ctx, **options) -> list[float]``: one value per
  :class:`Node`, higher is better, options from ``plugins.<name>``. Built-ins:
  ``env_reward`` (the env's rewards so far), ``logprob`` (the model's own per-token
  probability of the path), ``self_eval`` (the model asked whether the path is on
  track). A reward model is one more scorer: load it once (e.g. in a cache keyed by
  ``options``), score each ``node.episode`` (its ``token_ids`` or ``messages``) and
  charge nothing unless it generates; strategies take it by name (``scorer=...``).

Every root-to-leaf path of a tree is an ordinary :class:`~omrl.data.Episode`
(:meth:`Tree.episodes`), token-exact, with ``Turn.node_id``/``parent_id`` set; so the
SFT, DPO and RL data paths read them unchanged.

    ctx = SearchContext.from_session(session, PlaySpec(split="test", strategy="beam", budget=2000))
    trees = run_strategy(ctx, tasks)
    episodes = [ep for tree in trees for ep in tree.episodes()]
"""

from omrl.search.context import SearchContext, StrategyTraits, plays_batched, run_strategy, strategy_traits
from omrl.search.fork import Forker, ForkError, ReplayState
from omrl.search.play import play_strategy
from omrl.search.report import chosen_episodes, search_metrics
from omrl.search.runner import Expand, Score, run_search
from omrl.search.tree import Node, Tree

__all__ = [
    "Expand",
    "ForkError",
    "Forker",
    "Node",
    "ReplayState",
    "Score",
    "SearchContext",
    "StrategyTraits",
    "Tree",
    "chosen_episodes",
    "play_strategy",
    "plays_batched",
    "run_search",
    "run_strategy",
    "search_metrics",
    "strategy_traits",
]
