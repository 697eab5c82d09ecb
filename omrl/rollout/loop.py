"""The batched, token-exact multi-turn rollout.

Every turn, all live episodes (every task times ``group_size`` samples) are
generated in ONE backend call; then their envs step together (concurrently for
I/O-bound envs). Each episode's ``token_ids`` grow by exactly the sampled ids
(loss_mask 1, with their log-probs) and by the chat-template increments of
:mod:`omrl.chat` (observations, the next generation prompt, and the end-of-turn
text when a turn was cut at its token limit: all loss_mask 0). Nothing is ever
decoded and re-encoded, and no injected token is ever trained on. Under
``chat.history=as_template`` a turn whose template render no longer extends the
episode's current row starts a new row (:mod:`omrl.chat.history`); the backend is
always given the current row.

Each turn's ``info`` holds the env's step info plus ``info["rollout"]``:
``truncated`` (cut at the token limit), ``token_exact`` (False when a backend
could only return text) and ``new_tokens``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.chat import check_history, next_prompt, prompt_ids
from omrl.chat.specials import encode_plain
from omrl.chat.history import native_tool_calls
from omrl.data.trajectory import Episode, Turn
from omrl.envs import DemoTurn, Env, Observation, StepResult, clean_text, reset_problem, step_problem
from omrl.errors import OmrlError
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.templates import ParsedAction, Template

EMPTY_OBSERVATION = "(the environment returned no text)"


@dataclass
class RolloutLimits:
    """How long turns and episodes may get, how replies are sampled, and how history is carried."""

    max_new_tokens: int = 96  # per model turn (lowered to what the context still allows)
    max_context: int = 2048  # tokens per row: its prompt plus its turns (one row per episode, unless split)
    max_turns: int = 0  # 0: the env class's own cap
    temperature: float = 1.0
    top_p: float = 1.0
    history: str = "keep"  # chat.history: keep or as_template (omrl.chat.history)

    @classmethod
    def from_config(cls, generation: Any, max_turns: int = 0, history: str = "keep") -> "RolloutLimits":
        """From a GenerationConfig plus the env config's ``max_turns`` and the chat config's ``history``."""
        return cls(generation.max_new_tokens, generation.max_context, max_turns,
                   generation.temperature, generation.top_p, check_history(history))


@dataclass
class _Live:
    """An episode being played: its env, its chat so far and what its next turn answers."""

    episode: Episode
    env: Env
    chat_kwargs: dict[str, Any]
    messages: list[dict[str, str]]
    answering: str  # the env text (or format feedback) the next turn answers
    next_user: str = ""  # the env text (or format feedback) that answers the current turn
    eos_generated: bool = False
    end: str | None = None
    broken: bool = False
    tool_call: dict | None = None  # the current reply as a structured tool call ({content, tool_calls}), if it is one


def collect(pool: EnvPool, template: Template, tokenizer: Any, tasks: Sequence[int], *,
            backend: Backend | None = None, limits: RolloutLimits | None = None, split: str = "train",
            group_size: int = 1, seed: int = 0, expert: bool = False, max_parallel: int = 0,
            demonstration: bool = True, progress: RolloutProgress | None = None) -> list[Episode]:
    """Play ``group_size`` episodes of each task and return them ordered by (group, sample).

    ``backend`` generates the replies, or, with ``expert=True``, the env's
    scripted expert plays (its actions written by the template's
    ``format_action``). ``max_parallel`` caps how many episodes
    play at once (0: all); a finished episode's env instance then plays the next
    task. Episode.group is the task's index in ``tasks``, Episode.sample the
    sample's index within its group. With ``demonstration`` the env's worked example
    (``env.demonstration``, if it has one) opens every chat, after the system prompt.
    """
    limits = limits or RolloutLimits()
    if group_size < 1:
        raise OmrlError(f"group_size must be >= 1, got {group_size}")
    if backend is None and not expert:
        raise OmrlError("collect needs a generation backend, or expert=True to play the env's scripted expert")
    check_history(limits.history)
    if limits.max_new_tokens < 1 or limits.max_context < 2:
        raise OmrlError(f"max_new_tokens must be >= 1 and max_context >= 2, got "
                        f"{limits.max_new_tokens} and {limits.max_context}")
    progress = progress or RolloutProgress()
    queue = deque((group, sample, int(task)) for group, task in enumerate(tasks) for sample in range(group_size))
    finished: list[Episode] = []
    live: list[_Live] = []
    calls = 0

    def finish(state: _Live, reason: str) -> None:
        ep = state.episode
        ep.end_reason = reason
        ep.messages = [dict(m) for m in state.messages]
        problem = pool.release(state.env, broken=state.broken)
        if problem is not None:  # ending its env failed (a restarted server, say): nothing it did is trusted
            ep.end_reason = "env_error"
            ep.error = f"ending the episode's env failed: {type(problem).__name__}: {problem}"
        if backend is not None:  # its cached KV states, if the backend keeps some
            backend.release([ep.token_ids[start:end] for start, end in ep.rows()])
        finished.append(ep)
        progress.finished(ep)

    while queue or live:
        room = len(queue) if not max_parallel else max(0, max_parallel - len(live))
        started = [queue.popleft() for _ in range(min(room, len(queue)))]
        for state in _start(pool, template, tokenizer, started, split, limits.max_context, demonstration):
            if state.end:
                finish(state, state.end)
            else:
                live.append(state)
        if not live:
            continue
        caps = [min(limits.max_new_tokens, limits.max_context - len(s.episode.current_row())) for s in live]
        if expert:
            replies: list[Generation | BaseException] = _expert_replies(pool, template, tokenizer, live, caps)
        else:
            params = SamplingParams(max_new_tokens=caps, temperature=limits.temperature, top_p=limits.top_p,
                                    seed=seed * 1_000_003 + calls * 10_007)
            replies = list(backend.generate([s.episode.current_row() for s in live], params,  # type: ignore[union-attr]
                                            messages=[s.messages for s in live]))
        calls += 1
        progress.generated(sum(len(r.token_ids) for r in replies if isinstance(r, Generation)))
        to_step = [s for s, reply in zip(live, replies) if _record_reply(s, reply, template, tokenizer)]
        results = pool.step_many([(s.env, s.episode.turns[-1].action) for s in to_step])
        for state, result in zip(to_step, results):
            _record_step(state, result)
        still: list[_Live] = []
        for state in live:
            if state.end is None:
                # an env's max_turns may be a per-instance option, so ask the instance
                _continue_chat(state, tokenizer, limits.max_turns or int(state.env.max_turns), limits.max_context,
                               limits.history)
            if state.end:
                finish(state, state.end)
            else:
                still.append(state)
        live = still
    if backend is not None:
        backend.release()  # shared openings may stay; the update needs the memory the rest held
    return sorted(finished, key=lambda ep: (ep.group, ep.sample))


def demonstration_messages(template: Template, env: Env, demonstration: Sequence[DemoTurn]) -> list[dict[str, str]]:
    """An env's worked example as chat turns: each observation, then the reply in the template's format."""
    messages = []
    for turn in demonstration:
        try:
            reply = template.format_action(turn.action, env, turn.thought)
        except Exception as exc:
            raise OmrlError(f"template {type(template).__name__} cannot write {type(env).__name__}'s worked example "
                            f"(action {turn.action!r}): {type(exc).__name__}: {exc}; set env.demonstration=false "
                            "to play without it") from exc
        messages += [{"role": "user", "content": turn.observation}, {"role": "assistant", "content": reply}]
    return messages


def _start(pool: EnvPool, template: Template, tokenizer: Any, started: list[tuple[int, int, int]],
           split: str, max_context: int, demonstration: bool) -> list[_Live]:
    """Reset an env for each new episode and lay out its opening prompt."""
    envs = [pool.acquire() for _ in started]
    firsts = pool.reset_many([(env, task) for env, (_, _, task) in zip(envs, started)])
    states = []
    for env, (group, sample, task), first in zip(envs, started, firsts):
        ep = Episode(env=pool.name, task_id=task, split=split, instruction="", group=group, sample=sample)
        opened = open_episode(ep, env, first, template, tokenizer, pool.name, demonstration)
        if opened is None:
            states.append(_Live(ep, env, {}, [], "", end="env_error", broken=isinstance(first, BaseException)))
            continue
        messages, kwargs, observation = opened
        # at least one generated token must fit, or the episode cannot start
        end = "max_context" if len(ep.token_ids) >= max_context else None
        states.append(_Live(ep, env, kwargs, messages, observation, end=end))
    return states


def open_episode(ep: Episode, env: Env, first: Observation | BaseException, template: Template, tokenizer: Any,
                 env_name: str, demonstration: bool) -> tuple[list[dict[str, str]], dict, str] | None:
    """Fill ``ep``'s instruction and first prompt (ids, masks) from the env's reset answer ``first``.

    Returns the chat so far, the template's chat-template kwargs and the first observation; or None,
    with ``ep.error`` set, when the reset failed or answered something unusable. Chains and search
    trees open their episodes here, so a search path starts with the chain's exact ids.
    """
    problem = None if isinstance(first, BaseException) else reset_problem(first)
    if isinstance(first, BaseException) or problem:
        ep.error = f"reset failed: {type(first).__name__}: {first}" if problem is None else \
            f"reset failed: env {env_name!r} {problem}"
        return None
    ep.instruction = clean_text(first.instruction)
    observation = clean_text(first.text) or EMPTY_OBSERVATION
    # the first user message is the instruction plus the first observation (once: some envs repeat it)
    user = observation if ep.instruction in observation else f"{ep.instruction}\n\n{observation}"
    demo = demonstration_messages(template, env, env.demonstration) if demonstration else []
    ep.demo_messages = len(demo)
    messages = [{"role": "system", "content": template.system_prompt(env)}, *demo, {"role": "user", "content": user}]
    kwargs = template.chat_template_kwargs(env)
    ids = prompt_ids(tokenizer, messages, **kwargs)
    ep.token_ids, ep.loss_mask, ep.logprobs = ids, [0] * len(ids), [0.0] * len(ids)
    ep.prompt_length = len(ids)
    return messages, kwargs, observation


def _expert_replies(pool: EnvPool, template: Template, tokenizer: Any, live: list[_Live],
                    caps: list[int]) -> list[Generation | BaseException]:
    """The scripted expert's next action per episode, as the ids of the template-formatted reply."""
    actions = pool.call_many(lambda env: env.expert_action(), [s.env for s in live])
    eos = int(tokenizer.eos_token_id)
    out: list[Generation | BaseException] = []
    for state, action, cap in zip(live, actions, caps):
        if isinstance(action, BaseException) or action is None:
            out.append(action if isinstance(action, BaseException) else
                       OmrlError(f"{pool.name} has no scripted expert action here"))
            continue
        text = template.format_action(action, state.env)
        ids = (encode_plain(tokenizer, text) + [eos])[:cap]  # a reply's text is never special tokens
        out.append(Generation(ids, [0.0] * len(ids), "stop" if ids[-1] == eos else "length"))
    return out


def _record_reply(state: _Live, reply: Generation | BaseException, template: Template, tokenizer: Any) -> bool:
    """Append the sampled ids as a new turn and parse them; True when the env should step."""
    if isinstance(reply, BaseException):
        state.end, state.broken = "env_error", True
        state.episode.error = f"{type(reply).__name__}: {reply}"
        return False
    return append_reply(state, reply, template, tokenizer, state.env) is not None


def append_reply(state: Any, reply: Generation, template: Template, tokenizer: Any, env: Env) -> str | None:
    """Append ``reply`` to ``state``'s episode as a new turn and parse it; the action, or None (the
    turn's parse error set, the next user message saying why, or ``state.end`` when it was empty).

    ``state`` holds episode, messages, answering, eos_generated, next_user, tool_call and end: a
    chain's live episode, or a search branch (:mod:`omrl.search.branch`), which grow the same way.
    """
    ep = state.episode
    start = len(ep.token_ids)
    ep.token_ids += reply.token_ids
    ep.loss_mask += [1] * len(reply.token_ids)
    ep.logprobs += reply.logprobs
    state.eos_generated = bool(reply.token_ids) and reply.token_ids[-1] == tokenizer.eos_token_id
    body = reply.token_ids[:-1] if state.eos_generated else reply.token_ids
    response = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    rollout_info = {"truncated": not state.eos_generated, "token_exact": reply.token_exact,
                    "new_tokens": len(reply.token_ids)}
    turn = Turn(observation=state.answering, response=response, action=None, format_ok=False, reward=0.0,
                done=False, info={"rollout": rollout_info}, span=(start, len(ep.token_ids)))
    ep.turns.append(turn)
    state.messages.append({"role": "assistant", "content": response})
    state.tool_call = None
    if not response.strip():
        turn.parse_error = "the reply was empty"
        state.end = "empty_response"
        return None
    parsed = _parse(template, response, env)
    turn.format_ok, turn.parse_error, turn.action = parsed.format_ok, parsed.error, parsed.action
    if parsed.tool_call is not None and parsed.action is not None:  # the reply as a structured tool call
        state.tool_call = {"content": parsed.thought or "", "tool_calls": [parsed.tool_call]}
    if parsed.action is None:
        reason = parsed.error or "no action found in the reply."
        if env.action_help not in reason:  # react and xml errors name the env's actions already
            reason = f"{reason}\n{env.action_help}"
        state.next_user = f"Your reply could not be parsed: {reason}"
    return parsed.action


def _parse(template: Template, response: str, env: Env) -> ParsedAction:
    """``template.parse(response)``; whatever a template raises or returns amiss becomes a parse error.

    Templates must never raise, but a model reply is arbitrary text: one that
    trips a template bug must cost the episode a turn, not end the whole run.
    """
    name = type(template).__name__
    try:
        parsed = template.parse(response, env)
    except Exception as exc:  # noqa: BLE001 - a template bug, whatever it raises
        return ParsedAction(None, False, error=f"template {name} failed on this reply: {type(exc).__name__}: "
                                               f"{str(exc)[:200]}")
    if not isinstance(parsed, ParsedAction):
        return ParsedAction(None, False, error=f"template {name} returned a {type(parsed).__name__}, "
                                               "not a ParsedAction")
    return parsed


def _record_step(state: _Live, result: StepResult | BaseException) -> None:
    """Fill the turn with the env's answer; an env that raised or answered nonsense ends its episode (env_error)."""
    if isinstance(result, BaseException):
        state.episode.error = f"step failed: {type(result).__name__}: {result}"
        state.end, state.broken = "env_error", True
        return
    apply_step_result(state, result)


def apply_step_result(state: Any, result: StepResult) -> None:
    """Fill ``state``'s last turn with the env's answer; one outside the protocol ends the episode as
    env_error (the instance still works: its next reset starts afresh). ``state`` as in :func:`append_reply`."""
    ep, turn = state.episode, state.episode.turns[-1]
    problem = step_problem(result)
    if problem:
        ep.error = f"step failed: env {ep.env!r} {problem}"
        state.end = "env_error"
        return
    turn.reward, turn.done = float(result.reward), bool(result.done)
    turn.info = {**result.info, "rollout": turn.info["rollout"]}
    ep.won, ep.score = result.won, result.score
    state.next_user = clean_text(result.observation) or EMPTY_OBSERVATION
    if result.done:
        state.end = "done"


def _continue_chat(state: _Live, tokenizer: Any, turn_cap: int, max_context: int, history: str) -> None:
    """Append what leads to the next turn, or end the episode at a limit."""
    if len(state.episode.turns) >= turn_cap:
        state.end = "max_turns"
        return
    state.end = extend_chat(state, tokenizer, state.chat_kwargs, max_context, history)


def extend_chat(state: Any, tokenizer: Any, chat_kwargs: dict, max_context: int, history: str) -> str | None:
    """Append the ids that lead from ``state``'s last reply to its next turn: an increment of the current
    row, or under ``as_template`` perhaps a new row. Returns "max_context" (appending nothing) when the
    row would not leave room for one generated token.

    ``state.next_user`` answers the reply as a user message; after a native tool call, where the chat
    template renders them, the reply is recorded with its structured ``tool_calls`` (its content the
    text before the call) and the answer is a ``tool`` message. ``state`` as in :func:`append_reply`.
    """
    ep = state.episode
    structured = getattr(state, "tool_call", None)
    if structured is not None and native_tool_calls(tokenizer, chat_kwargs):
        state.messages[-1] = {"role": "assistant", **structured}
        name = structured["tool_calls"][0]["function"]["name"]
        new = [{"role": "tool", "content": state.next_user, "name": name}]
    else:
        new = [{"role": "user", "content": state.next_user}]
    ids, starts_row = next_prompt(tokenizer, history, ep.current_row(), state.messages, new, state.eos_generated,
                                  **chat_kwargs)
    if (0 if starts_row else len(ep.current_row())) + len(ids) >= max_context:
        return "max_context"
    if starts_row:
        ep.row_starts.append(len(ep.token_ids))
    ep.token_ids += ids
    ep.loss_mask += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)
    state.messages += new
    state.answering = state.next_user
    return None

