"""Built-in rollout strategies and scorers (calling conventions in :mod:`omrl.search`).

Registered through the ``register_rollout_strategies`` hook, exactly as a third-party
package registers its own; ``omrl rollout --strategy NAME`` and ``omrl eval --strategy
NAME`` reach them by name, with options from ``plugins.<NAME>``.
"""

from __future__ import annotations

import functools

from omrl.hookspecs import hookimpl
from omrl_plugins.rewards.reward_model import check_rm_options
from omrl_plugins.strategies.beam import beam
from omrl_plugins.strategies.best_of_n import best_of_n
from omrl_plugins.strategies.chain import chain
from omrl_plugins.strategies.dfsdt import dfsdt
from omrl_plugins.strategies.mc_value import mc_value
from omrl_plugins.strategies.mcts import mcts
from omrl_plugins.strategies.scorers import env_reward, logprob, majority_vote, random_pick, reward_model, self_eval

STRATEGIES = {"chain": chain, "best_of_n": best_of_n, "beam": beam, "dfsdt": dfsdt, "mcts": mcts, "mc_value": mc_value}
#: what each declares to the core (omrl.search.StrategyTraits); the rest grow one tree per task
TRAITS = {"chain": {"group_in_one_tree": True, "batched_without_budget": True}}
#: a scorer's options checked before anything plays: the rm's path must hold a reward model
SCORER_TRAITS = {"rm": {"check_options": functools.partial(check_rm_options, what="scorer 'rm'")}}
SCORERS = {
    "env_reward": env_reward,
    "logprob": logprob,
    "self_eval": self_eval,
    "rm": reward_model,
    "random": random_pick,
    "majority": majority_vote,
}


@hookimpl
def register_rollout_strategies(register):
    for name, fn in STRATEGIES.items():
        register(name, fn, **TRAITS.get(name, {}))
    for name, fn in SCORERS.items():
        register(name, fn, kind="scorer", **SCORER_TRAITS.get(name, {}))
