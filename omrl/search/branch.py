"""One turn of one branch, token-exact: the same id layout as :mod:`omrl.rollout.loop`.

A child node starts as a copy of its parent's episode. Its sampled ids are appended
as they are (loss_mask 1, with their log-probs); the env's answer and the next
generation prompt are appended as the chain rollout appends them
(:func:`omrl.rollout.loop.extend_chat`, loss_mask 0; under ``chat.history=as_template``
perhaps as a new row). Nothing is decoded and re-encoded, so every root-to-leaf path
holds exactly the ids the model sampled, whichever branch it took. A reply and the env's
answer are recorded by the chain rollout's own :func:`~omrl.rollout.loop.append_reply`
and :func:`~omrl.rollout.loop.apply_step_result`; ``tests/search/test_runner.py`` checks that a search with one
candidate per node gives the chain rollout's episodes id for id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omrl.backends.base import Generation
from omrl.data.trajectory import Episode
from omrl.envs import Env, Observation, StepResult
from omrl.rollout.loop import append_reply, apply_step_result, extend_chat, open_episode
from omrl.search.tree import Node, copy_episode
from omrl.templates import Template


@dataclass
class Growing:
    """A child node being built: its episode, chat, and what its turn still needs."""

    episode: Episode
    messages: list[dict[str, str]]
    answering: str
    next_user: str = ""
    eos_generated: bool = False
    end: str | None = None
    action: str | None = None  # the parsed action, when the env should step
    tool_call: dict | None = None  # the reply as a structured tool call, as in the chain rollout


def root_node(env: Env, first: Observation | BaseException, template: Template, tokenizer: Any, *, env_name: str,
              task_id: int, split: str, group: int, max_context: int, demonstration: bool) -> tuple[Node, dict]:
    """The root of a task's tree (the prompt alone) and the chat-template kwargs of its chats."""
    ep = Episode(env=env_name, task_id=task_id, split=split, instruction="", group=group)
    opened = open_episode(ep, env, first, template, tokenizer, env_name, demonstration)
    if opened is None:
        ep.end_reason = "env_error"
        return Node(0, None, ep, [], "", end="env_error"), {}
    messages, kwargs, observation = opened
    end = "max_context" if len(ep.token_ids) >= max_context else None
    if end:
        ep.end_reason, ep.messages = end, [dict(m) for m in messages]
    return Node(0, None, ep, messages, observation, end=end), kwargs


def add_reply(parent: Node, reply: Generation | BaseException, template: Template, tokenizer: Any,
              env: Env) -> Growing:
    """A copy of ``parent``'s episode with ``reply`` appended as a new turn, parsed."""
    ep = copy_episode(parent.episode)
    child = Growing(ep, [dict(m) for m in parent.messages], parent.answering)
    if isinstance(reply, BaseException):
        child.end = "env_error"
        ep.error = f"{type(reply).__name__}: {reply}"
        return child
    child.action = append_reply(child, reply, template, tokenizer, env)
    return child


def add_step(child: Growing, result: StepResult | BaseException) -> None:
    """Fill the new turn with the env's answer; an env that raised or answered nonsense ends the branch."""
    if isinstance(result, BaseException):
        child.episode.error = f"step failed: {type(result).__name__}: {result}"
        child.end = "env_error"
        return
    apply_step_result(child, result)


def continue_chat(child: Growing, tokenizer: Any, chat_kwargs: dict, turn_cap: int, max_context: int,
                  history: str = "keep") -> None:
    """Append what leads to the next turn (the chain rollout's :func:`~omrl.rollout.loop.extend_chat`),
    or end the branch at a limit."""
    ep = child.episode
    if child.end is None and len(ep.turns) >= turn_cap:
        child.end = "max_turns"
    if child.end is None:
        child.end = extend_chat(child, tokenizer, chat_kwargs, max_context, history)
    if child.end is not None:
        ep.end_reason, ep.messages = child.end, [dict(m) for m in child.messages]
