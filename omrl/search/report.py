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
    which is what a perfect verifier choosing among the paths would get.
    """
    if not trees:
        raise OmrlError("no searches to report on")
    n = len(trees)
    chosen = [tree.chosen() for tree in trees]
    tokens = sum(tree.generated_tokens for tree in trees)
    return {
        "strategy": trees[0].strategy,
        "budget_per_task": trees[0].budget,
        "success_rate": sum(node.won for node in chosen) / n,
        "mean_score": sum(node.episode.score for node in chosen) / n,
        "any_success_rate": sum(any(leaf.won for leaf in tree.leaves()) for tree in trees) / n,
        "generated_tokens": tokens,
        "generated_tokens_per_task": tokens / n,
        "nodes_per_task": sum(len(tree.nodes) - 1 for tree in trees) / n,
        "paths_per_task": sum(len(tree.leaves()) for tree in trees) / n,
        "budget_exhausted": sum(tree.exhausted for tree in trees),
    }
