"""Episodes -> the tensors an RL update reads.

Every tensor is aligned with ``input_ids`` (position t holds what concerns token t):
the recipe computes the log-prob of token t from the logits at t - 1, so position
0 (always a prompt token) never carries loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from omrl.algos import AdvantageInput
from omrl.data import Batch, Episode
from omrl.data.batch import pad_sequences
from omrl.rewards import allocate_rewards
from omrl.rollout import token_exact

# Tensors indexed by turn, not by token: never trimmed to a micro-batch's token width.
PER_TURN_KEYS = ("turn_rewards", "turn_state_ids")
# Episodes that must not be trained on: the env failed, so their score says nothing about the policy.
UNTRAINABLE_END_REASONS = ("env_error",)


def trainable(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes an update may use: token-exact, with at least one model turn, env intact."""
    return [
        ep
        for ep in episodes
        if ep.end_reason not in UNTRAINABLE_END_REASONS and ep.turns and any(ep.loss_mask) and token_exact(ep)
    ]


def episodes_to_batch(
    episodes: Sequence[Episode], pad_token_id: int, allocation: str = "last_token", gamma: float = 1.0
) -> Batch:
    """Right-padded tensors for an RL update.

    Tensors, [bs, L] unless noted (L = longest episode in tokens, K = most turns):
    input_ids, attention_mask, loss_mask (1 on sampled tokens), token_rewards (the composed
    reward allocated to tokens), turn_index (turn of each sampled token, -1 elsewhere),
    turn_rewards [bs, K], turn_state_ids [bs, K] (equal ids = same group and same
    observation: GiGPO's anchor states, -1 padding), group_ids [bs], and sampler_log_probs
    (the log-probs the sampler reported, when every episode has them). No episodes give 0 rows
    (a process whose share of a step has nothing to train on still joins the step's collectives).

    An episode the ``as_template`` history split into rows stays one row here, its rows packed:
    ``position_ids`` [bs, L] (present when any episode has several rows) restart at each row, and
    the forward turns the restarts into a block-diagonal causal mask
    (:func:`omrl.training.policy.policy_forward`). So an estimator sees the whole episode (its
    reward, its turns) and its advantage reaches every row, and the token-weighted loss is the
    sum over the rows' sampled tokens.
    """
    turn_index_rows, state_rows, turn_reward_rows = [], [], []
    state_ids: dict[tuple[int, str], int] = {}
    for ep in episodes:
        index = [-1] * len(ep.token_ids)
        for k, turn in enumerate(ep.turns):
            for t in range(*turn.span):
                index[t] = k
        turn_index_rows.append(index)
        state_rows.append([state_ids.setdefault((ep.group, turn.observation), len(state_ids)) for turn in ep.turns])
        turn_reward_rows.append(ep.rewards.get("total", [0.0] * len(ep.turns)))
    input_ids = pad_sequences([ep.token_ids for ep in episodes], pad_token_id)
    packed = (
        {"position_ids": pad_sequences([ep.position_ids() for ep in episodes], 0)}
        if any(ep.row_starts for ep in episodes)
        else {}
    )
    return Batch(
        tensors={
            **packed,
            "input_ids": input_ids,
            "attention_mask": pad_sequences([[1] * len(ep.token_ids) for ep in episodes], 0),
            "loss_mask": pad_sequences([ep.loss_mask for ep in episodes], 0),
            "token_rewards": pad_sequences(
                [allocate_rewards(ep, allocation, gamma) for ep in episodes], 0.0, torch.float32
            ),
            "turn_index": pad_sequences(turn_index_rows, -1),
            "turn_rewards": pad_sequences(turn_reward_rows, 0.0, torch.float32),
            "turn_state_ids": pad_sequences(state_rows, -1),
            "group_ids": torch.tensor([ep.group for ep in episodes], dtype=torch.long),
            **_sampler_log_probs(episodes),
        },
        non_tensors={"task_id": [ep.task_id for ep in episodes], "env": [ep.env for ep in episodes]},
    )


def _sampler_log_probs(episodes: Sequence[Episode]) -> dict[str, torch.Tensor]:
    """``sampler_log_probs`` [bs, L]: each token's log-prob as its sampler reported it (0 off the sampled
    tokens); none when an episode has no log-probs for its tokens (one written by hand or an older omrl)."""
    if any(len(ep.logprobs) != len(ep.token_ids) for ep in episodes):
        return {}
    return {"sampler_log_probs": pad_sequences([ep.logprobs for ep in episodes], 0.0, torch.float32)}


def advantage_input(batch: Batch) -> AdvantageInput:
    """What an advantage estimator reads, from an RL batch (values when the critic scored them)."""
    return AdvantageInput(
        token_rewards=batch["token_rewards"],
        loss_mask=batch["loss_mask"],
        group_ids=batch["group_ids"],
        values=batch.tensors.get("values"),
        turn_index=batch["turn_index"],
        turn_rewards=batch["turn_rewards"],
        turn_state_ids=batch["turn_state_ids"],
    )


def join_columns(batch: Batch, parts: Sequence[dict[str, torch.Tensor]]) -> Batch:
    """Add the columns computed per micro-batch (``parts``, in :func:`micro_batches` order, each
    [mb, w] for its own width w) to ``batch``, right-padded with zeros to its width."""
    width = batch["input_ids"].shape[1]
    for key in parts[0] if parts else {}:
        batch.tensors[key] = torch.cat([pad_to(part[key], width) for part in parts])
    return batch


def sort_by_length(batch: Batch) -> Batch:
    """Rows longest first, so consecutive micro-batches hold rows of similar length."""
    order = torch.argsort(batch["attention_mask"].sum(-1), descending=True, stable=True)
    return batch.rows(order)


def shuffled_mini_batches(batch: Batch, count: int, shuffle: torch.Generator) -> list[Batch]:
    """This process's rows in ``count`` shuffled mini-batches (every process takes as many), each sorted
    by length (some may be empty)."""
    if count <= 1:
        return [batch]
    order = torch.randperm(len(batch), generator=shuffle)
    return [sort_by_length(batch.rows(part)) for part in torch.tensor_split(order, count)]


def rows_that_learn(mini: Batch) -> Batch:
    """``mini``'s rows with a nonzero advantage on a trained token, in their order.

    Under a policy loss registered with ``zero_advantage_rows_add_nothing`` (:mod:`omrl.algos`) and
    no other loss term, a row whose advantages are all 0 adds 0 to the loss and to every gradient,
    so it need not run (a GRPO group whose samples all got the same reward). The loss keeps its
    normalisers over all of ``mini``'s rows, so the update is the one that runs every row. Where no
    row has an advantage, one stays (the last with a trained token: the shortest on a sorted batch),
    so that the optimizer step still sees the zero gradient it saw.
    """
    trained = mini["loss_mask"].bool()
    learns = ((mini["advantages"] != 0) & trained).any(-1)
    if not len(mini) or bool(learns.all()):
        return mini
    if not bool(learns.any()):
        with_tokens = trained.any(-1).nonzero().flatten().tolist()
        return mini.rows([with_tokens[-1] if with_tokens else len(mini) - 1])
    return mini.rows(learns.nonzero().flatten().tolist())


def micro_batches(batch: Batch, size: int) -> list[Batch]:
    """Consecutive micro-batches, each trimmed to its own longest row.

    On a length-sorted batch almost no compute goes to padding, without packing
    sequences (which needs attention kernels that honour sequence boundaries).
    """
    out = []
    for part in batch.split(size):
        width = int(part["attention_mask"].sum(-1).max())
        out.append(
            Batch(
                {k: t[:, :width] if t.dim() == 2 and k not in PER_TURN_KEYS else t for k, t in part.tensors.items()},
                part.non_tensors,
                part.meta,
            )
        )
    return out


def pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad a [bs, w] tensor with zeros to [bs, width]."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def preference_pairs(episodes: Sequence[Episode]) -> list[tuple[Episode, Episode]]:
    """DPO pairs: per task group, its best sample (chosen) and its worst (rejected), when their
    total rewards differ. Ties rank by reward, then by success."""
    pairs = []
    for group in sorted({ep.group for ep in episodes}):
        ranked = sorted((ep for ep in episodes if ep.group == group), key=lambda ep: (ep.total_reward, ep.won))
        if len(ranked) >= 2 and ranked[-1].total_reward > ranked[0].total_reward:
            pairs.append((ranked[-1], ranked[0]))
    return pairs


@dataclass
class TaskOrder:
    """The training tasks in a seeded shuffle, reshuffled every pass over them. ``epoch`` and
    ``cursor`` (the next position in this pass) go into checkpoints, so a resumed run
    continues with the tasks it would have played next."""

    tasks: list[Any]
    seed: int
    epoch: int = 0
    cursor: int = 0

    def take(self, count: int) -> list[Any]:
        """The next ``count`` tasks (crossing into the next pass's shuffle when this one ends)."""
        out: list[Any] = []
        while len(out) < count:
            order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.tasks))
            step = min(count - len(out), len(order) - self.cursor)
            out += [self.tasks[i] for i in order[self.cursor : self.cursor + step]]
            self.cursor += step
            if self.cursor >= len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        """Where the order stands, for a checkpoint's data state."""
        return {"task_epoch": self.epoch, "task_cursor": self.cursor}

    def load_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor = int(state["task_epoch"]), int(state["task_cursor"])
