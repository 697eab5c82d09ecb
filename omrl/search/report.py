"""What a set of searches achieved, and at what cost in generated tokens."""

from __future__ import annotations

from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.search.tree import Tree, path_episode


def chosen_episodes(trees: Sequence[Tree]) -> list[Episode]:
    """The episode each search chose as its answer (one per tree, in order)."""
    return [path_episode(tree.chosen(), tree, 0, chosen=True) for tree in trees]


def search_metrics(trees: Sequence[Tree]) -> dict[str, Any]:
    """Success and score of the chosen answers, whether any path won, and the tokens spent.

    ``success_rate`` counts the answer each strategy chose (for ``chain`` the first
    sample: pass@1); ``any_success_rate`` counts a task when any path of its tree won,
    which is what a perfect verifier choosing among the paths would get. As in
    :func:`omrl.evaluation.evaluate`, an answer the env failed in (``env_error``, counted in
    ``env_errors``) is neither a win nor a loss: success and score are over the others.
    """
    if not trees:
        raise OmrlError("no searches to report on")
    n = len(trees)
    answers = [node for node in (tree.chosen() for tree in trees) if node.end != "env_error"]
    measured = max(len(answers), 1)  # none: every answer failed in the env, and both rates are 0
    tokens = sum(tree.generated_tokens for tree in trees)
    return {
        "strategy": trees[0].strategy,
        "budget_per_task": trees[0].budget,
        "success_rate": sum(node.won for node in answers) / measured,
        "mean_score": sum(node.episode.score for node in answers) / measured,
        "env_errors": n - len(answers),
        "any_success_rate": sum(any(leaf.won for leaf in tree.leaves()) for tree in trees) / n,
        "generated_tokens": tokens,
        "generated_tokens_per_task": tokens / n,
        "nodes_per_task": sum(len(tree.nodes) - 1 for tree in trees) / n,
        "paths_per_task": sum(len(tree.leaves()) for tree in trees) / n,
        "budget_exhausted": sum(tree.exhausted for tree in trees),
    }
