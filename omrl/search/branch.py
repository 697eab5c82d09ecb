"""Roots and branches, token-exact: the same id layout as :mod:`omrl.rollout.loop`.

A root opens its episode as a chain does (:func:`omrl.rollout.loop.open_episode`). A
child node starts as a copy of its parent's episode, a
:class:`~omrl.rollout.live.LiveEpisode` that then grows by the chain rollout's own steps
(:mod:`omrl.rollout.live`): its sampled ids appended as they are, the env's answer and
the next generation prompt as the chain appends them. Nothing is decoded and re-encoded,
so every root-to-leaf path holds exactly the ids the model sampled, whichever branch it
took; ``tests/search/test_runner.py`` checks that a search with one candidate per node
gives the chain rollout's episodes id for id.
"""

from __future__ import annotations

from typing import Any

from omrl.data.trajectory import Episode
from omrl.envs import Env, Observation
from omrl.rollout.live import LiveEpisode
from omrl.rollout.loop import open_episode
from omrl.search.tree import Node, copy_episode
from omrl.templates import Template


def root_node(
    env: Env,
    first: Observation | BaseException,
    template: Template,
    tokenizer: Any,
    *,
    env_name: str,
    task_id: int,
    split: str,
    group: int,
    max_context: int,
    demonstration: bool,
    options: dict | None = None,
) -> tuple[Node, dict]:
    """The root of a task's tree (the prompt alone) and the chat-template kwargs of its chats."""
    ep = Episode(env=env_name, task_id=task_id, split=split, instruction="", group=group)
    opened = open_episode(ep, env, first, template, tokenizer, env_name, demonstration, options)
    if opened is None:
        ep.end_reason = "env_error"
        return Node(0, None, ep, [], "", end="env_error"), {}
    messages, kwargs, observation = opened
    end = "max_context" if len(ep.token_ids) >= max_context else None
    if end:
        ep.end_reason, ep.messages = end, [dict(m) for m in messages]
    return Node(0, None, ep, messages, observation, end=end), kwargs


def child_of(parent: Node) -> LiveEpisode:
    """A new branch from ``parent``: copies of its episode and chat, its next turn still to come."""
    return LiveEpisode(copy_episode(parent.episode), [dict(m) for m in parent.messages], parent.answering)
