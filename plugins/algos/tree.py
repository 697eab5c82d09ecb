"""tree_grpo: GRPO over a task's leaves plus a step-level advantage from the shape of its search trees.

Ji et al. 2025, "Tree Search for LLM Agent Reinforcement Learning" (Tree-GRPO, arXiv:2509.21240);
Hou et al. 2025, "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search" (arXiv:2506.11902);
the episode-level plus weighted step-level sum is GiGPO's (Feng et al. 2025, arXiv:2505.10978).

The step level has two forms (``algorithm.tree_step_mode``):

- ``siblings`` (the default): a sibling-subtree comparison at each branch point. Where a tree
  search branched, the children are replies to one and the same state, so comparing what followed
  each of them (the mean outcome of the leaves below it) credits a single turn without a critic;
  a turn with no sibling has nothing to be compared with. The root's branching (the first turns)
  is not compared here: that comparison is the episode level's. This is neither Tree-GRPO's
  intra-tree advantage (GRPO over all leaves of one tree, the same number on every turn of a
  path) nor TreeRL's local advantage (a node's value minus its parent's, the parent's value being
  the mean over all of its leaves, so that a sibling with more leaves below it weighs more); here
  each sibling counts once and the group may be divided by the siblings' std.
- ``intra_tree``: Tree-GRPO's intra-tree advantage, GRPO over the leaves of one tree (Eq. 6 of
  the paper), on every token of the path. The paper's advantage is inter-tree + intra-tree
  (Eq. 7, unweighted): cfg.tree_step_weight = 1, the default, is exactly that.
"""

from __future__ import annotations

import torch

from omrl.algos import AdvantageInput, AlgoConfig, require_range
from omrl.errors import ConfigError, OmrlError
from omrl_plugins.algos.advantages import (
    broadcast_to_tokens,
    check_advantage_input,
    check_turn_input,
    episode_scores,
    group_normalize,
    turns_to_tokens,
)

#: the forms of tree_grpo's step level (``algorithm.tree_step_mode``)
TREE_STEP_MODES = ("siblings", "intra_tree")


def branch_advantages(
    scores: torch.Tensor, turn_node_ids: torch.Tensor, turn_parent_ids: torch.Tensor, use_std: bool, eps: float
) -> torch.Tensor:
    """The sibling-subtree advantage of every turn. [bs], [bs, K], [bs, K] -> [bs, K] float32.

    A node's value is the mean score of the rows (finished root-to-leaf paths) that pass through
    it, i.e. of the leaves below it. Nodes grown from the same parent (siblings at a branch point)
    form a group; each value minus the group's mean, divided by (group std + eps) when
    ``use_std``, is the advantage of every row's copy of that turn. Nodes without a sibling,
    children of a root (parent -1) and padding (node -1) get 0.
    """
    valid = turn_node_ids >= 0
    rows = torch.arange(len(scores), device=scores.device)[:, None].expand_as(turn_node_ids)[valid]
    nodes, parents = turn_node_ids[valid].long(), turn_parent_ids[valid].long()
    _, inverse = torch.unique(nodes, return_inverse=True)
    count = int(inverse.max()) + 1 if len(inverse) else 0
    paths = scores.new_zeros(count).index_add_(0, inverse, torch.ones_like(rows, dtype=scores.dtype))
    value = scores.new_zeros(count).index_add_(0, inverse, scores[rows]) / paths
    parent = parents.new_full((count,), -1).scatter_(0, inverse, parents)
    if not torch.equal(parent[inverse], parents):
        bad = int(nodes[parent[inverse] != parents][0])
        raise OmrlError(
            f"tree_grpo: node {bad} has different parents in different rows; turn_node_ids must name "
            "each node of a tree once in the batch (rows sharing a node share its whole path)"
        )
    step = torch.zeros_like(value)
    branched = parent >= 0
    step[branched] = group_normalize(value[branched], parent[branched], use_std, eps)
    out = torch.zeros(turn_node_ids.shape, dtype=scores.dtype, device=scores.device)
    out[valid] = step[inverse]
    return out


def intra_tree_advantages(scores: torch.Tensor, tree_ids: torch.Tensor, use_std: bool, eps: float) -> torch.Tensor:
    """Tree-GRPO's intra-tree advantage of every row. [bs], [bs] -> [bs] float32.

    The rows of one tree (equal ``tree_ids``; each row a root-to-leaf path) are a GRPO group:
    (score - the tree's mean) / (the tree's std + eps), or score - mean without ``use_std``.
    A tree with one finished path gets 0.
    """
    return group_normalize(scores, tree_ids, use_std, eps)


def require_step_mode(cfg: AlgoConfig) -> str:
    """``cfg.tree_step_mode``, one of :data:`TREE_STEP_MODES`."""
    if cfg.tree_step_mode not in TREE_STEP_MODES:
        raise ConfigError(
            f"algorithm.tree_step_mode {cfg.tree_step_mode!r} is unknown; valid: {', '.join(TREE_STEP_MODES)}"
        )
    return cfg.tree_step_mode


@torch.no_grad()
def tree_grpo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-GRPO (Ji et al. 2025, arXiv:2509.21240; TreeRL, Hou et al. 2025, arXiv:2506.11902).

    Reads token_rewards, loss_mask, turn_index [bs, T]; group_ids, tree_ids [bs]; turn_node_ids,
    turn_parent_ids [bs, K]; cfg.tree_step_mode, cfg.tree_step_weight, cfg.norm_adv_by_std,
    cfg.eps. A row is one root-to-leaf path, its loss_mask covering every turn of the path
    (shared ones too); its score is its summed token rewards.

    - Episode level (Tree-GRPO's inter-tree advantage): GRPO over the leaves of a task (equal
      group_ids, all its trees): (score - mean) / (std + eps), or score - mean without
      cfg.norm_adv_by_std.
    - Step level, by cfg.tree_step_mode:
      ``siblings`` (default): :func:`branch_advantages`, a sibling-subtree comparison at each
      branch point: a turn's subtree value against those of its siblings, given to the tokens of
      that turn. Reads turn_node_ids, turn_parent_ids.
      ``intra_tree``: :func:`intra_tree_advantages`, Tree-GRPO's intra-tree advantage: GRPO over
      the leaves of the row's tree (equal tree_ids), on every token of the row. Reads tree_ids.

    A token gets episode_adv + cfg.tree_step_weight * step_adv (Tree-GRPO's Eq. 7 sums the two
    with weight 1). Rows of a chain rollout (turn_node_ids and turn_parent_ids None for
    ``siblings``, tree_ids None for ``intra_tree``) have no tree: this is then exactly
    :func:`~omrl_plugins.algos.advantages.grpo`. With one tree per task, ``intra_tree``'s group is
    the episode level's, so the result is (1 + cfg.tree_step_weight) times GRPO's.
    Returns (advantages, advantages), float32 [bs, T], 0 off the mask.
    """
    rewards, mask = check_advantage_input("tree_grpo", data)
    mode = require_step_mode(cfg)
    weight = require_range(cfg, "tree_step_weight", 0.0)
    scores = episode_scores(rewards, mask)
    advantages = broadcast_to_tokens(group_normalize(scores, data.group_ids, cfg.norm_adv_by_std, cfg.eps), mask)
    if mode == "intra_tree":
        if data.tree_ids is None:
            return advantages, advantages
        if data.tree_ids.shape != data.group_ids.shape:
            raise OmrlError(
                f"tree_grpo: tree_ids has shape {tuple(data.tree_ids.shape)}; it must be [bs] = "
                f"({len(data.group_ids)},)"
            )
        per_row = intra_tree_advantages(scores, data.tree_ids, cfg.norm_adv_by_std, cfg.eps)
        advantages = advantages + weight * broadcast_to_tokens(per_row, mask)
        return advantages, advantages
    if data.turn_node_ids is None and data.turn_parent_ids is None:
        return advantages, advantages
    turn_index = check_turn_input(
        "tree_grpo", data, turn_node_ids=data.turn_node_ids, turn_parent_ids=data.turn_parent_ids
    )
    per_turn = branch_advantages(scores, data.turn_node_ids, data.turn_parent_ids, cfg.norm_adv_by_std, cfg.eps)
    advantages = advantages + weight * turns_to_tokens(per_turn, turn_index, mask)
    return advantages, advantages
