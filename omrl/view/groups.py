"""What a group-relative algorithm compared, and the trees of search rollouts.

Trajectory files keep rewards but not advantages, so for the estimators whose advantage
is one number per episode (grpo, dr_grpo, rloo) the page recomputes it from the episodes'
total rewards exactly as :mod:`omrl_plugins.algos.advantages` does (group = the episodes
of one file with the same ``group``; env_error episodes are never trained on and take no
part). Per-token estimators (gae, gigpo, reinforce_plus_plus) cannot be recomputed from a
file; a trajectory file that stores an ``advantages`` column is shown as stored instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

RECOMPUTABLE = ("grpo", "dr_grpo", "rloo")
_UNTRAINED = ("env_error",)


def advantage_settings(config: dict[str, Any] | None) -> tuple[str, bool, float, str]:
    """(estimator, norm_adv_by_std, eps, a line saying where these came from)."""
    algo = (config or {}).get("algorithm") if isinstance(config, dict) else None
    if not isinstance(algo, dict):
        return "grpo", True, 1e-6, "GRPO advantage recomputed from the total rewards (no config.yaml: GRPO's defaults)"
    name = str(algo.get("advantage", "grpo"))
    norm = bool(algo.get("norm_adv_by_std", True))
    eps = float(algo.get("eps", 1e-6))
    if name not in RECOMPUTABLE:
        return name, norm, eps, (f"algorithm.advantage={name} gives per-token advantages, which a trajectory file "
                                 "does not keep")
    return name, norm, eps, f"{name} advantage recomputed from the total rewards (algorithm.advantage in config.yaml)"


def group_advantages(rewards: list[float | None], estimator: str, norm_by_std: bool, eps: float) -> list[float | None]:
    """One advantage per episode of a group (None for those not trained on).

    >>> group_advantages([1.0, 0.0], "grpo", True, 0.0)
    [0.7071067811865475, -0.7071067811865475]
    >>> group_advantages([1.0, 0.0, None], "rloo", True, 0.0)
    [1.0, -1.0, None]
    """
    if estimator not in RECOMPUTABLE:
        return [None] * len(rewards)
    scores = [r for r in rewards if r is not None]
    n = len(scores)
    if n < 2:  # alone in its group: the estimators give 0
        return [None if r is None else 0.0 for r in rewards]
    mean = sum(scores) / n
    if estimator == "rloo":
        total = sum(scores)
        return [None if r is None else r - (total - r) / (n - 1) for r in rewards]
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1))  # unbiased, as torch.std
    divide = norm_by_std and estimator == "grpo"
    return [None if r is None else (r - mean) / (std + eps) if divide else r - mean for r in rewards]


def trainable_reward(summary: dict[str, Any]) -> float | None:
    """The score an estimator sees, or None when the episode is not trained on."""
    return None if summary["end"] in _UNTRAINED else summary["reward"]


def build_tree(paths: list[tuple[dict[str, Any], dict[str, Any]]], limit: int = 2000) -> dict[str, Any]:
    """The search tree that root-to-leaf ``paths`` (summary, row) were cut from.

    Each node is a model turn (``node_id``; the root, id 0, is the prompt alone) with its
    action, step reward, the scorer's last score, whether the search chose the path through
    it, and how the paths that end there ended.
    """
    nodes: dict[int, dict[str, Any]] = {0: {"id": 0, "parent": None, "action": None, "response": "", "reward": None,
                                            "score": None, "chosen": False, "end": None, "won": False, "episodes": []}}
    for summary, row in paths:
        turns = row.get("turns") or []
        for i, turn in enumerate(turns):
            node_id = turn.get("node_id")
            if node_id is None or node_id < 0:
                continue
            search = info_dict(turn.get("info")).get("search") or {}
            node = nodes.get(node_id)
            if node is None:
                if len(nodes) >= limit:
                    break
                node = nodes[node_id] = {
                    "id": node_id, "parent": turn.get("parent_id"), "action": _short(turn.get("action")),
                    "response": _short(turn.get("response") or ""), "reward": turn.get("reward"),
                    "score": search.get("score"), "chosen": False, "end": None, "won": False, "episodes": []}
            node["episodes"].append(summary["id"])
            node["chosen"] = node["chosen"] or bool(search.get("chosen"))
            if i == len(turns) - 1:
                node["end"], node["won"] = summary["end"], summary["won"]
    chosen_leaf = [n for n in nodes.values() if n["chosen"]]
    for leaf in chosen_leaf:  # mark the whole chosen path, not only its last turn
        parent = nodes.get(leaf["parent"]) if leaf["parent"] is not None else None
        while parent is not None and not parent["chosen"]:
            parent["chosen"] = True
            parent = nodes.get(parent["parent"]) if parent["parent"] is not None else None
    return {"nodes": list(nodes.values()), "truncated": len(nodes) >= limit}


def _short(text: Any, limit: int = 300) -> Any:
    """A node's text in the tree: its first ``limit`` characters, "..." marking a cut (the episode shows more)."""
    return text[:limit] + "..." if isinstance(text, str) and len(text) > limit else text


def info_dict(text: Any) -> dict[str, Any]:
    """A turn's info (stored as a JSON string) as a dict; {} when it is not one."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
