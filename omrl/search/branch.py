"""One turn of one branch, token-exact: the same id layout as :mod:`omrl.rollout.loop`.

A child node starts as a copy of its parent's episode. Its sampled ids are appended
as they are (loss_mask 1, with their log-probs); the env's answer and the next
generation prompt are appended as :func:`omrl.chat.next_turn_ids` increments
(loss_mask 0). Nothing is decoded and re-encoded, so every root-to-leaf path holds
exactly the ids the model sampled, whichever branch it took. The steps mirror the
chain rollout's (``_start``, ``_record_reply``, ``_record_step``, ``_continue_chat``
in loop.py); ``tests/search/test_runner.py`` checks that a search with one
candidate per node gives the chain rollout's episodes id for id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omrl.backends.base import Generation
from omrl.chat import next_turn_ids, prompt_ids
from omrl.data.trajectory import Episode, Turn
from omrl.envs import Env, Observation, StepResult, clean_text, reset_problem, step_problem
from omrl.rollout.loop import EMPTY_OBSERVATION, demonstration_messages
from omrl.search.tree import Node, copy_episode
from omrl.templates import ParsedAction, Template


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


def root_node(env: Env, first: Observation | BaseException, template: Template, tokenizer: Any, *, env_name: str,
              task_id: int, split: str, group: int, max_context: int, demonstration: bool) -> tuple[Node, dict]:
    """The root of a task's tree (the prompt alone) and the chat-template kwargs of its chats."""
    ep = Episode(env=env_name, task_id=task_id, split=split, instruction="", group=group)
    problem = None if isinstance(first, BaseException) else reset_problem(first)
    if isinstance(first, BaseException) or problem:
        ep.error = f"reset failed: {type(first).__name__}: {first}" if problem is None else \
            f"reset failed: env {env_name!r} {problem}"
        ep.end_reason = "env_error"
        return Node(0, None, ep, [], "", end="env_error"), {}
    ep.instruction = clean_text(first.instruction)
    observation = clean_text(first.text) or EMPTY_OBSERVATION
    # as the chain rollout: the instruction plus the first observation, once
    user = observation if ep.instruction in observation else f"{ep.instruction}\n\n{observation}"
    demo = demonstration_messages(template, env, env.demonstration) if demonstration else []
    ep.demo_messages = len(demo)
    messages = [{"role": "system", "content": template.system_prompt(env)}, *demo, {"role": "user", "content": user}]
    kwargs = template.chat_template_kwargs(env)
    ids = prompt_ids(tokenizer, messages, **kwargs)
    ep.token_ids, ep.loss_mask, ep.logprobs = ids, [0] * len(ids), [0.0] * len(ids)
    ep.prompt_length = len(ids)
    end = "max_context" if len(ids) >= max_context else None
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
    start = len(ep.token_ids)
    ep.token_ids += reply.token_ids
    ep.loss_mask += [1] * len(reply.token_ids)
    ep.logprobs += reply.logprobs
    child.eos_generated = bool(reply.token_ids) and reply.token_ids[-1] == tokenizer.eos_token_id
    body = reply.token_ids[:-1] if child.eos_generated else reply.token_ids
    response = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    rollout_info = {"truncated": not child.eos_generated, "token_exact": reply.token_exact,
                    "new_tokens": len(reply.token_ids)}
    turn = Turn(observation=parent.answering, response=response, action=None, format_ok=False, reward=0.0,
                done=False, info={"rollout": rollout_info}, span=(start, len(ep.token_ids)))
    ep.turns.append(turn)
    child.messages.append({"role": "assistant", "content": response})
    if not response.strip():
        turn.parse_error = "the reply was empty"
        child.end = "empty_response"
        return child
    parsed = _parse(template, response, env)
    turn.format_ok, turn.parse_error, turn.action = parsed.format_ok, parsed.error, parsed.action
    if parsed.action is None:
        reason = parsed.error or "no action found in the reply."
        if env.action_help not in reason:
            reason = f"{reason}\n{env.action_help}"
        child.next_user = f"Your reply could not be parsed: {reason}"
    child.action = parsed.action
    return child


def add_step(child: Growing, result: StepResult | BaseException) -> None:
    """Fill the new turn with the env's answer; an env that raised or answered nonsense ends the branch."""
    ep, turn = child.episode, child.episode.turns[-1]
    if isinstance(result, BaseException):
        ep.error = f"step failed: {type(result).__name__}: {result}"
        child.end = "env_error"
        return
    problem = step_problem(result)
    if problem:
        ep.error = f"step failed: env {ep.env!r} {problem}"
        child.end = "env_error"
        return
    turn.reward, turn.done = float(result.reward), bool(result.done)
    turn.info = {**result.info, "rollout": turn.info["rollout"]}
    ep.won, ep.score = result.won, result.score
    child.next_user = clean_text(result.observation) or EMPTY_OBSERVATION
    if result.done:
        child.end = "done"


def continue_chat(child: Growing, tokenizer: Any, chat_kwargs: dict, turn_cap: int, max_context: int) -> None:
    """Append the increment that leads to the next turn, or end the branch at a limit."""
    ep = child.episode
    if child.end is None and len(ep.turns) >= turn_cap:
        child.end = "max_turns"
    if child.end is None:
        increment = next_turn_ids(tokenizer, child.messages, child.next_user, child.eos_generated, **chat_kwargs)
        if len(ep.token_ids) + len(increment) >= max_context:
            child.end = "max_context"
        else:
            ep.token_ids += increment
            ep.loss_mask += [0] * len(increment)
            ep.logprobs += [0.0] * len(increment)
            child.messages.append({"role": "user", "content": child.next_user})
            child.answering = child.next_user
    if child.end is not None:
        ep.end_reason, ep.messages = child.end, [dict(m) for m in child.messages]


def _parse(template: Template, response: str, env: Env) -> ParsedAction:
    """``template.parse``; whatever a template raises or returns amiss becomes a parse error (as loop.py)."""
    name = type(template).__name__
    try:
        parsed = template.parse(response, env)
    except Exception as exc:  # noqa: BLE001 - a template bug must cost the branch a turn, not the search
        return ParsedAction(None, False, error=f"template {name} failed on this reply: {type(exc).__name__}: "
                                               f"{str(exc)[:200]}")
    if not isinstance(parsed, ParsedAction):
        return ParsedAction(None, False, error=f"template {name} returned a {type(parsed).__name__}, "
                                               "not a ParsedAction")
    return parsed
