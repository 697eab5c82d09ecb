"""One episode as the page shows it in full: its turns, rewards and token arrays, cut to the page's bounds.

The row comes from :mod:`omrl.view.readers`; :func:`episode_detail` turns it into the JSON the episode view
draws, each text and token list cut as :mod:`omrl.view.bounds` says.
"""

from __future__ import annotations

import json
import math
from typing import Any

from omrl.view import agents, evals, groups
from omrl.view.bounds import TextBudget, cut_tokens
from omrl.view.tokens import TokenText


def episode_detail(summary: dict[str, Any], row: dict[str, Any], token_text: TokenText | None) -> dict[str, Any]:
    """The page's view of one episode row (see :mod:`omrl.view.readers` for the row's shape), its texts
    and token lists cut as :mod:`omrl.view.bounds` says."""
    cut = TextBudget()
    rewards = dict(row.get("rewards") or [])
    row_starts = [int(x) for x in row.get("row_starts") or []]  # chat.history=as_template, or an agent's new prompt
    turns, infos = [], []
    for i, turn in enumerate(row.get("turns") or []):
        span = list(turn.get("span") or [0, 0])
        info = groups.info_dict(turn.get("info"))
        infos.append(info)
        turns.append(
            {
                "row": sum(start <= span[0] for start in row_starts),
                "observation": cut(turn.get("observation") or ""),
                "response": cut(turn.get("response") or ""),
                "action": cut(turn.get("action")),
                "format_ok": turn.get("format_ok"),
                "parse_error": cut(turn.get("parse_error")),
                "reward": turn.get("reward"),
                "done": turn.get("done"),
                "info": _cut_info(info, cut),
                "tool_calls": agents.tool_attempts(info, cut),
                "agent_result": agents.agent_result(info, cut),
                "agent_reward": agents.agent_reward(info),
                "rewards": {name: values[i] for name, values in rewards.items() if values and i < len(values)},
                "span": list(turn.get("span") or [0, 0]),
                "node": turn.get("node_id"),
                "parent": turn.get("parent_id"),
            }
        )
    ids, mask = list(row.get("token_ids") or []), list(row.get("loss_mask") or [])
    tokens = {
        "ids": ids,
        "mask": mask,
        "logprob": [None if x is None or not math.isfinite(x) else round(x, 4) for x in row.get("logprobs") or []],
        "text": token_text.pieces(ids) if token_text is not None and ids else None,
        "advantage": None,
        "advantage_note": "",
        "return": None,
        "value": None,
    }
    for key, column in (("advantage", "advantages"), ("return", "returns"), ("value", "values")):
        tokens[key] = _trained_values(row.get(column), mask)
    if tokens["advantage"] is not None:
        tokens["advantage_note"] = "as the trainer recorded it"
    return {
        "summary": summary,
        "instruction": cut(row.get("instruction") or ""),
        "turns": turns,
        "final_answer": turns[-1]["action"] if turns else None,  # the last turn's parsed action
        "expected": cut_answer(evals.expected_answer(infos), cut),  # what the env recorded as right, if it did
        "reward_totals": evals.component_sums(rewards),
        "prompt_length": row.get("prompt_length") or 0,
        "demo_messages": row.get("demo_messages") or 0,
        "row_starts": row_starts,
        "played_by_agent": agents.played_by_agent(infos),  # how the page words its rows
        "tool_calls": agents.status_counts(turns),
        "tokens": cut_tokens(tokens),
    }


def _trained_values(values: Any, mask: list[int]) -> list[float | None] | None:
    """A recorded per-token column on the trained tokens (None elsewhere); None when not recorded."""
    if not values or len(values) != len(mask):
        return None
    return [round(x, 4) if trained and x is not None and math.isfinite(x) else None for x, trained in zip(values, mask)]


def cut_answer(value: str | list[str] | None, cut: TextBudget) -> str | list[str] | None:
    """An expected answer (one text, or the list of those that count) with each text cut."""
    return [cut(v) for v in value] if isinstance(value, list) else cut(value)


def _cut_info(info: dict[str, Any], cut: TextBudget) -> dict[str, Any]:
    """A turn's info as the page shows it: whole, or, when its JSON is long (an env may put a whole
    page there), that JSON as one cut text."""
    text = json.dumps(info, default=str)
    shown = cut(text)
    return info if shown == text else {"cut": shown}
