"""Trajectory files -> reward-model examples: which tokens are labelled, and with what.

An example is one episode's exact token ids (as the policy sampled them: nothing is
decoded and re-encoded) with the positions the head is trained at and a target for
each. Labels, by kind:

- ``orm`` + ``success``: 1 at the last token when the episode was won, else 0.
- ``orm`` + ``score``: the env's final score (in [0, 1] for ``bce``).
- ``orm`` + ``bt`` objective: pairs of episodes of the same task whose outcomes differ,
  the better one chosen (Bradley-Terry; Ouyang et al. 2022).
- ``prm`` + ``mc``: each assistant turn's Monte Carlo value: the mean over its tree node's
  sampled continuations of their values, a finished path counting 1 when won
  (Math-Shepherd, Wang et al. 2024); needs trees (``omrl rollout --strategy mc_value``, or
  any search). ``mc_score`` is the same with each path's final env score in place of its win
  (partial credit, for envs where wins are rare).
- ``prm`` + ``step_reward``: each turn's env step reward.

Unfinished paths (``pruned``, ``budget``) and env failures (``env_error``) carry no
outcome and are left out.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.rm.model import encode_episode_text

LABELS = {"orm": ("success", "score"), "prm": ("mc", "mc_score", "step_reward")}
NO_OUTCOME = ("pruned", "budget", "env_error")


class LabelError(OmrlError):
    """A trajectory file without the labels a reward model kind needs."""


@dataclass
class Example:
    """One sequence with its labelled positions; ``task`` groups the examples of one task (for pairs)."""

    input_ids: list[int]
    positions: list[int]
    targets: list[float]
    task: tuple[str, str, int]
    rows: list[tuple[int, int]] | None = None  # the episode's rows, when chat.history=as_template split it


def _per_row(ex: Example) -> list[Example]:
    """A split episode's example as one example per row that holds a label: a label is read in the row
    the model generated that reply in (an outcome label, on the last reply, in the last row)."""
    if not ex.rows:
        return [ex]
    out = []
    for start, end in ex.rows:
        inside = [(p - start, t) for p, t in zip(ex.positions, ex.targets) if start <= p < end]
        if inside:
            out.append(Example(ex.input_ids[start:end], [p for p, _ in inside], [t for _, t in inside], ex.task))
    return out


@dataclass
class Pair:
    """Two whole episodes of one task: ``chosen`` had the better outcome."""

    chosen: Example
    rejected: Example


def check_label(kind: str, label: str) -> None:
    """LabelError unless ``label`` is one that ``kind`` is trained on."""
    if label not in LABELS.get(kind, ()):
        valid = "; ".join(f"{k}: {', '.join(v)}" for k, v in LABELS.items())
        raise LabelError(f"label {label!r} is not one a {kind!r} reward model is trained on; valid ({valid})")


def examples(
    episodes: Sequence[Episode], kind: str, label: str, source: str, max_seq_length: int, text_tokenizer: Any = None
) -> tuple[list[Example], int]:
    """The labelled examples of ``episodes`` (read from ``source``) and how many were cut or dropped
    for ``max_seq_length``. LabelError names the file and the missing field when none can be labelled.

    ``text_tokenizer``: re-encode each chat with it instead of using the episode's own ids
    (for a reward model whose tokenizer is not the policy's).
    """
    check_label(kind, label)
    played = [ep for ep in episodes if ep.turns and ep.token_ids and ep.end_reason not in NO_OUTCOME]
    layout = {id(ep): _layout(ep, text_tokenizer) for ep in played}
    played = [ep for ep in played if len(layout[id(ep)][1]) == len(ep.turns)]
    if kind == "orm":
        out = [ex for ep in played if (ex := _orm_example(ep, label, *layout[id(ep)])) is not None]
    elif label in ("mc", "mc_score"):
        out = _mc_examples(played, episodes, source, layout, score=label == "mc_score")
    else:
        out = [_step_reward_example(ep, *layout[id(ep)]) for ep in played]
    if text_tokenizer is None:  # the episodes' own ids: a split episode's labels are read in their rows
        out = [part for ex in out for part in _per_row(ex)]
    if not out:
        raise LabelError(
            f"{source} has no finished episode with {label!r} labels (episodes: {len(episodes)}, "
            f"finished: {len(played)}); play some with `omrl rollout`"
        )
    kept, cut = [], 0
    for ex in out:
        if len(ex.input_ids) <= max_seq_length:
            kept.append(ex)
            continue
        cut += 1
        inside = [(p, t) for p, t in zip(ex.positions, ex.targets) if p < max_seq_length]
        if kind == "prm" and inside:  # a process label needs only what came before its turn
            kept.append(Example(ex.input_ids[:max_seq_length], [p for p, _ in inside], [t for _, t in inside], ex.task))
    if not kept:
        longest = max(len(ex.input_ids) for ex in out)
        raise LabelError(
            f"every labelled episode in {source} is longer than max_seq_length={max_seq_length} tokens "
            f"(the longest: {longest}); raise max_seq_length"
        )
    return kept, cut


def check_outcomes(found: Sequence[Example], label: str, source: str, cut: int = 0, max_seq_length: int = 0) -> None:
    """LabelError when every label is the same: a model learns nothing from one outcome. ``cut``: the episodes
    left out for their length, which may be where the other outcome was (losing episodes run longest)."""
    targets = {t for ex in found for t in ex.targets}
    if len(targets) == 1:
        left_out = (
            f"; {cut} episodes longer than max_seq_length={max_seq_length} tokens were left out, and may hold the "
            "other outcomes: raise max_seq_length"
            if cut
            else ""
        )
        raise LabelError(
            f"every label in {source} is {targets.pop()!r} ({label}, {len(found)} examples){left_out}: a reward "
            "model learns nothing from one outcome; add episodes with other outcomes (more samples "
            "per task, a stronger or weaker policy)"
        )


def pairs(found: Sequence[Example], max_pairs_per_task: int, seed: int = 0) -> list[Pair]:
    """Pairs of one task's examples with different outcomes (the better one chosen): at most
    ``max_pairs_per_task`` per task, drawn at random (seeded) so every episode can take part."""
    by_task: dict[tuple, list[Example]] = defaultdict(list)
    for ex in found:
        by_task[ex.task].append(ex)
    out = []
    for task, group in by_task.items():
        candidates = [
            Pair(a, b) if a.targets[0] > b.targets[0] else Pair(b, a)
            for i, a in enumerate(group)
            for b in group[i + 1 :]
            if a.targets[0] != b.targets[0]
        ]
        if len(candidates) > max_pairs_per_task:
            candidates = random.Random(f"{seed}/{task}").sample(candidates, max_pairs_per_task)
        out += candidates
    return out


def _task(ep: Episode) -> tuple[str, str, int]:
    return (ep.env, ep.split, int(ep.task_id))


def _layout(ep: Episode, text_tokenizer: Any) -> tuple[list[int], list[int]]:
    """(ids, each turn's last reply token): the episode's own, or its chat re-encoded."""
    if text_tokenizer is None:
        return list(ep.token_ids), [t.span[1] - 1 for t in ep.turns]
    return encode_episode_text(text_tokenizer, ep)


def _orm_example(ep: Episode, label: str, ids: list[int], ends: list[int]) -> Example | None:
    """The episode up to its last reply, labelled there (None: a score that is not a number)."""
    target = float(ep.won) if label == "success" else float(ep.score)
    if not math.isfinite(target):
        return None
    return Example(ids[: ends[-1] + 1], [ends[-1]], [target], _task(ep), ep.rows() if ep.row_starts else None)


def _step_reward_example(ep: Episode, ids: list[int], ends: list[int]) -> Example:
    return Example(ids, ends, [float(t.reward) for t in ep.turns], _task(ep), ep.rows() if ep.row_starts else None)


def _mc_examples(
    played: Sequence[Episode],
    episodes: Sequence[Episode],
    source: str,
    layout: dict[int, tuple[list[int], list[int]]],
    score: bool = False,
) -> list[Example]:
    """Each tree node's MC value, labelled once: on the first path (in file order) that passes it."""
    from omrl.rm.labels_mc import tree_mc_means

    if not any(turn.node_id >= 0 for ep in episodes for turn in ep.turns):
        raise LabelError(
            f"{source} holds chains without tree node ids, so no turn has Monte Carlo labels; "
            "play trees with `omrl rollout --strategy mc_value` (or another search), or use "
            "label=step_reward"
        )
    by_task: dict[tuple, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_task[(ep.env, ep.split, ep.task_id)].append(ep)
    values = {key: tree_mc_means(group, score) for key, group in by_task.items()}
    seen: set[tuple] = set()
    out = []
    for ep in played:
        means = values[(ep.env, ep.split, ep.task_id)]
        ids, ends = layout[id(ep)]
        positions, targets = [], []
        for turn, end in zip(ep.turns, ends):
            key = (ep.env, ep.split, ep.task_id, ep.group, turn.node_id)
            mean = means.get((ep.group, turn.node_id))
            if mean is not None and key not in seen:
                seen.add(key)
                positions.append(end)
                targets.append(mean)
        if positions:
            out.append(Example(ids, positions, targets, _task(ep), ep.rows() if ep.row_starts else None))
    return out
