"""Search trees -> update rows: every finished root-to-leaf path is a row; every turn is trained once.

A tree rollout (a ``rollout.strategy`` that searches, see :mod:`omrl.search`) gives one
:class:`~omrl.data.Episode` per root-to-leaf path, and paths that branched apart late share their
opening turns token for token. The update reads them in three moves:

1. :func:`paths_to_batch`: the *finished* paths become rows, as any episodes would
   (:func:`~omrl.training.rl_data.episodes_to_batch`), plus the tree columns ``turn_node_ids``
   and ``turn_parent_ids`` [bs, K] that say which turns rows share and ``tree_ids`` [bs] that
   says which tree each row is a path of. A path the search ended (``pruned``) or ran out of
   tokens on (``budget``) has no outcome: it is no row, so it counts neither as a leaf of its
   task's group nor in any subtree's value. Its turns that a finished path shares are trained
   through that path; the ones below which nothing finished are not trained at all (there is
   nothing to credit them with).
2. The advantage estimator runs on the rows as on any episodes (every row's loss_mask covers
   its whole path), with :func:`tree_advantage_input`.
3. :func:`train_each_turn_once`: a turn several rows share keeps its tokens in the loss of
   one row only (the first that holds it; the others keep them as context), with the mean of
   the advantages (and returns) the estimator gave its copies. On-policy that is exactly the
   gradient of training every path whole, with each shared turn's share divided by the number
   of paths through it; GRPO's mean over the leaves below a turn is TreeRL's global advantage
   of its node (V(node) - V(root), scaled).

Every row carries the Episode it was made from (the non-tensor column ``ROW_EPISODE``; the
batched rollout's rows too, :func:`chain_rows`), so :func:`with_update_columns` can hand each
episode what the update computed for it, to be saved with the rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from omrl.algos import AdvantageInput
from omrl.data import Batch, Episode
from omrl.data.batch import pad_sequences
from omrl.data.trajectory import TRAINED_COLUMNS
from omrl.errors import OmrlError
from omrl.search.tree import BUDGET, PRUNED
from omrl.training.rl_data import advantage_input, episodes_to_batch, trainable

#: paths a search stopped before the env did: no outcome to learn from
UNFINISHED = (PRUNED, BUDGET)
#: the batch columns that describe the trees, [bs, K]
TREE_KEYS = ("turn_node_ids", "turn_parent_ids")
#: the batch column naming each row's tree, [bs] (a row's, not a turn's: train_each_turn_once keeps it)
TREE_IDS = "tree_ids"
#: the non-tensor column holding each row's Episode (the very object the rollout played)
ROW_EPISODE = "episode"
ROOT = 0  # Turn.parent_id of a tree's first turns


def finished_paths(episodes: Sequence[Episode]) -> list[Episode]:
    """The paths an update may use: trainable (:func:`~omrl.training.rl_data.trainable`) and ended
    by the env or a limit, not by the search (``pruned``, ``budget``)."""
    return [ep for ep in trainable(episodes) if ep.end_reason not in UNFINISHED]


def paths_to_batch(
    episodes: Sequence[Episode],
    trees_per_task: int,
    pad_token_id: int,
    allocation: str = "last_token",
    gamma: float = 1.0,
) -> Batch:
    """Rows of the finished paths of ``episodes`` (every path of every tree, as the search wrote them).

    ``Episode.group`` numbers the trees (``trees_per_task`` consecutive ones per task), so
    ``group_ids`` (the episode-level group) is ``group // trees_per_task``: all leaves of a
    task's trees. Adds to :func:`~omrl.training.rl_data.episodes_to_batch`'s tensors:
    turn_node_ids [bs, K] (each turn's node, numbered across the batch: equal ids = the same
    turn of the same tree) and turn_parent_ids [bs, K] (the node it grew from, -1 for a tree's
    root), both -1 past a row's last turn, and tree_ids [bs] (int64: the path's own
    ``Episode.group``, one id per tree of the batch, which Tree-GRPO's intra-tree groups read).
    """
    if trees_per_task < 1:
        raise OmrlError(f"trees_per_task must be >= 1, got {trees_per_task}")
    paths = finished_paths(episodes)
    ids: dict[tuple[int, int], int] = {}
    spans: dict[int, tuple[int, int]] = {}
    node_rows, parent_rows = [], []
    for ep in paths:
        nodes, parents = [], []
        for turn in ep.turns:
            node = ids.setdefault((ep.group, turn.node_id), len(ids)) if turn.node_id >= 0 else -1
            if node >= 0 and spans.setdefault(node, turn.span) != turn.span:
                raise OmrlError(
                    f"two paths of tree {ep.group} (task {ep.task_id}) hold node {turn.node_id} at "
                    f"different tokens ({spans[node]} and {turn.span}); a tree's paths share "
                    "their common turns token for token (omrl.search.Tree.episodes)"
                )
            nodes.append(node)
            parents.append(ids.setdefault((ep.group, turn.parent_id), len(ids)) if turn.parent_id > ROOT else -1)
        node_rows.append(nodes)
        parent_rows.append(parents)
    per_task = [dataclasses.replace(ep, group=ep.group // trees_per_task) for ep in paths]
    batch = episodes_to_batch(per_task, pad_token_id, allocation, gamma)
    width = batch["turn_rewards"].shape[1]
    for key, rows in zip(TREE_KEYS, (node_rows, parent_rows)):
        batch.tensors[key] = pad_sequences([row + [-1] * (width - len(row)) for row in rows], -1)
    batch.tensors[TREE_IDS] = torch.tensor([ep.group for ep in paths], dtype=torch.long)
    batch.non_tensors[ROW_EPISODE] = paths  # the played paths, not the regrouped copies
    return batch


def chain_rows(
    episodes: Sequence[Episode], pad_token_id: int, allocation: str = "last_token", gamma: float = 1.0
) -> Batch:
    """Rows of the batched rollout's trainable episodes (:func:`~omrl.training.rl_data.episodes_to_batch`),
    each tagged with its episode as :func:`paths_to_batch` tags its paths."""
    played = trainable(episodes)
    batch = episodes_to_batch(played, pad_token_id, allocation, gamma)
    batch.non_tensors[ROW_EPISODE] = played
    return batch


def with_update_columns(episodes: Sequence[Episode], batch: Batch) -> list[Episode]:
    """``episodes``, each one that is a row of ``batch`` as a copy holding, per token (aligned with
    its token_ids), the ``advantages`` and ``returns`` the estimator gave its row and, with a
    critic, its ``values``; the others (not trained: env errors, unfinished paths) as they are.

    Read before :func:`train_each_turn_once`: a tree turn several paths share shows, on each
    path, what the estimator gave that path (the update trains it once, with their mean).
    """
    columns = {key: batch[key].detach().float().cpu() for key in TRAINED_COLUMNS if key in batch.tensors}
    computed = {}
    for row, ep in enumerate(batch.non_tensors.get(ROW_EPISODE, [])):
        length = len(ep.token_ids)
        computed[id(ep)] = {key: values[row, :length].tolist() for key, values in columns.items()}
    return [dataclasses.replace(ep, **computed[id(ep)]) if id(ep) in computed else ep for ep in episodes]


def tree_advantage_input(batch: Batch) -> AdvantageInput:
    """What an advantage estimator reads, with the tree columns (turn_node_ids, turn_parent_ids,
    tree_ids) when ``batch`` has them, else None (a chain batch, :func:`chain_rows`)."""
    data = advantage_input(batch)
    data.turn_node_ids, data.turn_parent_ids = (batch.tensors.get(key) for key in TREE_KEYS)
    data.tree_ids = batch.tensors.get(TREE_IDS)
    return data


def train_each_turn_once(batch: Batch) -> Batch:
    """Each shared turn in the loss of one row, with the mean advantage and return of its copies.

    Reads loss_mask, turn_index, advantages, returns [bs, T] and turn_node_ids [bs, K]. The
    paths of a tree hold a shared turn at the very same positions (a child's ids extend its
    parent's), so a token's copies are the tokens of equal (node, position). Returns a batch
    whose loss_mask keeps each copy once (in the first row holding it) and whose advantages
    and returns are the copies' means there and 0 where the mask dropped them; the tree
    columns TREE_KEYS are dropped (they are turn-indexed, not token-indexed, and the update needs
    none); tree_ids, one per row, stays with its row.
    """
    mask = batch["loss_mask"].bool()
    turn_index = batch["turn_index"].long()
    nodes = batch["turn_node_ids"].long()
    node_of_token = torch.cat([nodes.new_full((len(nodes), 1), -1), nodes], 1).gather(1, turn_index + 1)
    rows, cols = (mask & (node_of_token >= 0)).nonzero(as_tuple=True)
    keys = torch.stack([node_of_token[rows, cols], cols], dim=1)
    _, inverse, copies = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    owner = torch.full_like(copies, len(batch)).scatter_reduce_(0, inverse, rows, "amin")
    dropped = rows != owner[inverse]
    loss_mask = batch["loss_mask"].clone()
    loss_mask[rows[dropped], cols[dropped]] = 0
    tensors = {k: t for k, t in batch.tensors.items() if k not in TREE_KEYS}
    tensors["loss_mask"] = loss_mask
    for key in ("advantages", "returns"):
        values = batch[key]
        mean = values.new_zeros(len(copies)).index_add_(0, inverse, values[rows, cols]) / copies.to(values.dtype)
        out = values.clone()
        out[rows, cols] = mean[inverse]
        tensors[key] = torch.where(loss_mask.bool(), out, 0.0)
    return Batch(tensors, batch.non_tensors, batch.meta)


def sibling_pairs(episodes: Sequence[Episode]) -> list[tuple[Episode, Episode]]:
    """DPO pairs from search trees (chosen, rejected): one per branch point of each tree.

    A branch point is a node (or a tree's root) that finished paths leave by different replies.
    Its pair is the best path through one of those replies against the worst path through
    another: the two that differ most in total reward, then a won chosen and a lost rejected,
    then (as :func:`~omrl.training.rl_data.preference_pairs` breaks ties) the last chosen and
    the first rejected in path order; kept when their rewards differ. The two paths share
    every turn above the branch point token for token, so those turns cancel in DPO's margin:
    the pair compares sibling replies by what followed them. Paths diverge at exactly one
    branch point, so no pair repeats; a chain rollout's samples (siblings at the root) give
    preference_pairs' pair. Unfinished paths (``pruned``, ``budget``) take part in no pair.
    """
    paths = finished_paths(episodes)
    order = {id(ep): i for i, ep in enumerate(paths)}

    def rank(ep: Episode) -> tuple[float, bool, int]:  # ties go to the later path
        return (ep.total_reward, ep.won, order[id(ep)])

    def preference(pair: tuple[Episode, Episode]) -> tuple:
        best, worst = pair
        return (best.total_reward - worst.total_reward, best.won, not worst.won, order[id(best)], -order[id(worst)])

    children: dict[tuple[int, int], dict[int, list[Episode]]] = {}  # (tree, node) -> its reply nodes' paths
    for ep in paths:
        for turn in ep.turns:
            if turn.node_id >= 0:
                children.setdefault((ep.group, turn.parent_id), {}).setdefault(turn.node_id, []).append(ep)
    pairs = []
    for key in sorted(children):
        below = [(max(through, key=rank), min(through, key=rank)) for through in children[key].values()]
        candidates = [
            (best, worst) for i, (best, _) in enumerate(below) for j, (_, worst) in enumerate(below) if i != j
        ]
        if candidates:
            best, worst = max(candidates, key=preference)
            if best.total_reward > worst.total_reward:
                pairs.append((best, worst))
    return pairs
