"""What the page says of advantages, and the trees of search rollouts.

The advantages are the trainer's own: ``omrl train`` saves each step's rollout with the
advantage, return and (with a critic) value it computed for every token it trained
(:func:`omrl.training.tree_batch.with_update_columns`), whichever estimator that was. The
page shows them as stored and recomputes nothing; a file without them (``omrl rollout``'s,
an older trainer's, an episode the update left out) says they were not recorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RECORDED = "as the trainer recorded them (an episode's: the mean over its trained tokens)"
NOT_RECORDED = (
    "not recorded: only the rollouts `omrl train` saves carry them (each step's, from this version on); "
    "nothing is recomputed"
)


def advantage_note(recorded: bool) -> str:
    """The line the page shows about the advantages of a run whose files do (or do not) hold any."""
    return f"advantages {RECORDED if recorded else NOT_RECORDED}"


def left_out_note(summary: dict) -> str:
    """Why an episode of a training rollout (its file records the update's advantages) holds none: the
    update left it out, though its replies carry loss mask 1."""
    if summary.get("end") == "env_error":
        return "Not trained on: it failed in the env (or its template or reward), which says nothing of the model."
    if summary.get("tree") and summary.get("end") != "done":
        return (
            f"Not trained on: a search path the search cut short (it ended {summary.get('end') or 'unfinished'}) "
            "is no row of the update; its replies are marked as sampled, not trained."
        )
    return "Not trained on: the update recorded no advantage for it."


def is_step_rollout(path: Path) -> bool:
    """Whether ``path`` is a step's rollout as ``omrl train`` saves it (``rollouts/step-00000003.parquet``,
    ``-rank1`` with several processes): trained on, whether or not its file recorded the advantages.

    >>> is_step_rollout(Path("run/rollouts/step-00000003-rank1.parquet")), is_step_rollout(Path("evals/episodes.parquet"))
    (True, False)
    """
    return path.parent.name == "rollouts" and re.fullmatch(r"step-\d+(-rank\d+)?\.parquet", path.name) is not None


def trained_mean(advantages: Any, loss_mask: Any) -> float | None:
    """The mean advantage over an episode's trained tokens, or None when none was recorded for it.

    >>> trained_mean([0.0, 0.5, 1.5], [0, 1, 1])
    1.0
    >>> trained_mean([], [0, 1]) is None
    True
    """
    import numpy as np

    values, mask = np.asarray(advantages, dtype=np.float64), np.asarray(loss_mask)
    if not len(values) or len(values) != len(mask):
        return None
    trained = values[(mask > 0) & np.isfinite(values)]
    return float(trained.mean()) if len(trained) else None


def build_tree(paths: list[tuple[dict[str, Any], dict[str, Any]]], limit: int = 2000) -> dict[str, Any]:
    """The search tree that root-to-leaf ``paths`` (summary, row) were cut from.

    Each node is a model turn (``node_id``; the root, id 0, is the prompt alone) with its
    action, step reward, the scorer's last score, whether the search chose the path through
    it, and how the paths that end there ended.
    """
    nodes: dict[int, dict[str, Any]] = {
        0: {
            "id": 0,
            "parent": None,
            "action": None,
            "response": "",
            "reward": None,
            "score": None,
            "chosen": False,
            "end": None,
            "won": False,
            "episodes": [],
        }
    }
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
                    "id": node_id,
                    "parent": turn.get("parent_id"),
                    "action": _short(turn.get("action")),
                    "response": _short(turn.get("response") or ""),
                    "reward": turn.get("reward"),
                    "score": search.get("score"),
                    "chosen": False,
                    "end": None,
                    "won": False,
                    "episodes": [],
                }
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
