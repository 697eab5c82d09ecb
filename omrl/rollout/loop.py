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
always given the current row. An episode grows by the steps of :mod:`omrl.rollout.live`,
as a search branch does.

Several envs play in one rollout as *lanes* (:func:`collect_lanes`): each lane has its own
pool, template, split and turn cap, their episodes share every generate call, and each turn
steps the lanes' I/O-bound envs concurrently, so a turn waits for the slowest such env's step, not
their sum (in-process envs step on the loop's thread: :func:`per_pool`).

Each turn's ``info`` holds the env's step info plus ``info["rollout"]``:
``truncated`` (cut at the token limit), ``token_exact`` (False when a backend
could only return text) and ``new_tokens``.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.chat import check_history, prompt_ids
from omrl.chat.conformance import check_run_template
from omrl.clock import timed
from omrl.data.trajectory import Episode
from omrl.env_results import EMPTY_OBSERVATION
from omrl.envs import DemoTurn, Env, Observation, check_seats, clean_text, reset_problem
from omrl.errors import OmrlError, short_repr
from omrl.rollout.live import LiveEpisode, TemplateFailure, continue_chat, raised, record_reply, record_step
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.replies import GAVE_UP, StreamedReplies, TurnReplies, expert_replies, no_expert_at_all, turn_caps
from omrl.rollout.spec import RolloutLimits
from omrl.supervisor import StageStalled, on_stall
from omrl.templates import Template


@dataclass(eq=False)
class Lane:
    """One env of a rollout: the pool its instances come from, its action template, the split its
    tasks are drawn from, its turn cap (0: the env's own) and whether its worked example opens each
    chat. A one-env rollout has one lane; a mixture (:mod:`omrl.mixture`) one per env."""

    pool: EnvPool
    template: Template
    split: str = "train"
    max_turns: int = 0
    demonstration: bool = True


@dataclass(kw_only=True)
class _Chain(LiveEpisode):
    """A chain's live episode, with its lane, the env instance that plays it and its chat-template kwargs."""

    lane: Lane
    env: Env
    chat_kwargs: dict[str, Any]


T = TypeVar("T")


def collect(
    pool: EnvPool,
    template: Template,
    tokenizer: Any,
    tasks: Sequence[int],
    *,
    backend: Backend | None = None,
    limits: RolloutLimits | None = None,
    split: str = "train",
    group_size: int = 1,
    seed: int = 0,
    expert: bool = False,
    max_parallel: int = 0,
    demonstration: bool = True,
    progress: RolloutProgress | None = None,
) -> list[Episode]:
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
    lane = Lane(pool, template, split, limits.max_turns, demonstration)
    return collect_lanes(
        [lane],
        tokenizer,
        [(0, int(task)) for task in tasks],
        backend=backend,
        limits=limits,
        group_size=group_size,
        seed=seed,
        expert=expert,
        max_parallel=max_parallel,
        progress=progress,
    )


def collect_lanes(
    lanes: Sequence[Lane],
    tokenizer: Any,
    tasks: Sequence[tuple[int, int]],
    *,
    backend: Backend | None = None,
    limits: RolloutLimits | None = None,
    group_size: int = 1,
    seed: int = 0,
    expert: bool = False,
    max_parallel: int = 0,
    progress: RolloutProgress | None = None,
) -> list[Episode]:
    """:func:`collect` over several envs at once: ``tasks`` are ``(lane index, task id)`` pairs and each
    episode plays in its lane (``limits.max_turns`` is not read: each lane has its own). Episodes of
    every lane share each generate call; a lane whose episodes end early leaves the batch early."""
    limits = limits or RolloutLimits()
    if group_size < 1:
        raise OmrlError(f"group_size must be >= 1, got {group_size}")
    if backend is None and not expert:
        raise OmrlError("collect needs a generation backend, or expert=True to play the env's scripted expert")
    check_history(limits.history)
    for lane in lanes:  # a game's seats each need their own chat: omrl.rollout.seats plays them
        if check_seats(lane.pool.env_class, lane.pool.name):
            raise OmrlError(f"env {lane.pool.name!r} has seats; its games play through omrl.rollout.seats.play_seats")
    # a model's rows, and the expert's it will be fine-tuned on, are laid out as its template lays them out, or not at all
    check_run_template(tokenizer, limits.history, limits.template_kwargs)
    if limits.max_new_tokens < 1 or limits.max_context < 2:
        raise OmrlError(
            f"max_new_tokens must be >= 1 and max_context >= 2, got {limits.max_new_tokens} and {limits.max_context}"
        )
    progress = progress or RolloutProgress()
    queue = deque(
        (group, sample, lanes[lane], int(task))
        for group, (lane, task) in enumerate(tasks)
        for sample in range(group_size)
    )
    finished: list[Episode] = []
    live: list[_Chain] = []
    replies = _reply_source(backend, limits, seed) if not expert else None

    retried: set[tuple[int, int]] = set()  # (group, sample) of episodes played again after a stall

    def finish(state: _Chain) -> None:
        state.record_end()
        ep = state.episode
        problem = state.lane.pool.release(state.env, broken=state.broken)
        if state.stalled and on_stall() == "retry" and (ep.group, ep.sample) not in retried:
            retried.add((ep.group, ep.sample))  # played again from its start, on another instance, once
            queue.appendleft((ep.group, ep.sample, state.lane, ep.task_id))
            if backend is not None:
                backend.release([ep.token_ids[start:end] for start, end in ep.rows()])
            return
        if problem is not None:  # ending its env failed (a restarted server, say): nothing it did is trusted
            ep.end_reason = "env_error"
            ep.error = f"ending the episode's env failed: {raised(problem)}"
        if backend is not None:  # its cached KV states, if the backend keeps some
            backend.release([ep.token_ids[start:end] for start, end in ep.rows()])
        finished.append(ep)
        progress.finished(ep)

    while queue or live:
        room = len(queue) if not max_parallel else max(0, max_parallel - len(live))
        started = [queue.popleft() for _ in range(min(room, len(queue)))]
        for state in _start(tokenizer, started, limits.max_context, limits.template_kwargs):
            if state.end:
                finish(state)
            else:
                live.append(state)
        if not live:
            continue
        if expert:
            ready = list(zip(live, expert_replies(tokenizer, live, turn_caps(live, limits), _expert_actions(live))))
            for state, reply in ready:
                if reply is GAVE_UP:  # the expert's loss, not the env's failure: no turn, and it counts
                    state.end = "expert_gave_up"
        else:
            ready = replies(live)
        progress.generated(sum(len(r.token_ids) for _, r in ready if isinstance(r, Generation)))
        to_step = [
            s
            for s, reply in ready
            if reply is not GAVE_UP
            and record_reply(s, reply, s.lane.template, tokenizer, s.env, s.chat_kwargs) is not None
        ]
        with timed("env"):
            results = per_pool(
                to_step,
                lambda s: s.lane.pool,
                lambda pool, some: pool.step_many([(s.env, s.action) for s in some], [label(s.episode) for s in some]),
            )
        for state, result in zip(to_step, results):
            record_step(state, result)
        # episodes still decoding (a stream's) wait; the ready ones go on or end
        still = [s for s in live if not any(s is r for r, _ in ready)]
        for state, _ in ready:
            if state.end is None:
                # an env's max_turns may be a per-instance option, so ask the instance
                continue_chat(
                    state,
                    tokenizer,
                    state.chat_kwargs,
                    state.lane.max_turns or int(state.env.max_turns),
                    limits.max_context,
                    limits.history,
                )
            if state.end:
                finish(state)
            else:
                still.append(state)
        live = still
    if isinstance(replies, StreamedReplies):
        replies.close()
    if backend is not None:
        backend.release()  # shared openings may stay; the update needs the memory the rest held
    if expert:
        no_expert_at_all(finished)
    return sorted(finished, key=lambda ep: (ep.group, ep.sample))


def _reply_source(backend: Backend | None, limits: RolloutLimits, seed: int) -> TurnReplies | StreamedReplies:
    """The backend's stream when it batches turns as they come, else one generate call a turn."""
    assert backend is not None
    sampling = SamplingParams(temperature=limits.temperature, top_p=limits.top_p)
    stream = backend.stream(sampling)
    return TurnReplies(backend, limits, seed) if stream is None else StreamedReplies(stream, limits, seed)


def demonstration_messages(template: Template, env: Env, demonstration: Sequence[DemoTurn]) -> list[dict[str, str]]:
    """An env's worked example as chat turns: each observation, then the reply in the template's format."""
    messages = []
    for turn in demonstration:
        try:
            reply = template.format_action(turn.action, env, turn.thought)
            if not isinstance(reply, str) or not reply.strip():
                raise TypeError(f"format_action returned {short_repr(reply)}; it must return the reply's text")
        except Exception as exc:
            raise OmrlError(
                f"template {type(template).__name__} cannot write {type(env).__name__}'s worked example "
                f"(action {turn.action!r}): {type(exc).__name__}: {exc}; set env.demonstration=false "
                "to play without it"
            ) from exc
        messages += [{"role": "user", "content": turn.observation}, {"role": "assistant", "content": reply}]
    return messages


def _start(tokenizer: Any, started: list[tuple[int, int, Lane, int]], max_context: int, options: dict) -> list[_Chain]:
    """Reset an env for each new episode (in its lane) and lay out its opening prompt."""
    envs = [lane.pool.acquire() for _, _, lane, _ in started]
    with timed("env"):
        firsts = per_pool(
            list(zip(envs, started)),
            lambda pair: pair[1][2].pool,
            lambda pool, some: pool.reset_many(
                [(env, task) for env, (_, _, _, task) in some],
                [f"task {task} sample {sample}" for _, (_, sample, _, task) in some],
            ),
        )
    states = []
    for env, (group, sample, lane, task), first in zip(envs, started, firsts):
        name = lane.pool.name
        ep = Episode(env=name, task_id=task, split=lane.split, instruction="", group=group, sample=sample)
        opened = open_episode(ep, env, first, lane.template, tokenizer, name, lane.demonstration, options)
        if opened is None:
            states.append(
                _Chain(
                    ep,
                    [],
                    "",
                    lane=lane,
                    env=env,
                    chat_kwargs={},
                    end="env_error",
                    broken=isinstance(first, BaseException),
                    stalled=isinstance(first, StageStalled),
                )
            )
            continue
        messages, kwargs, observation = opened
        # at least one generated token must fit, or the episode cannot start
        end = "max_context" if len(ep.token_ids) >= max_context else None
        states.append(_Chain(ep, messages, observation, lane=lane, env=env, chat_kwargs=kwargs, end=end))
    return states


def _expert_actions(live: list[_Chain]) -> list[Any]:
    """Each episode's scripted expert's (action, thought), or what its env raised."""
    return per_pool(
        live,
        lambda s: s.lane.pool,
        # the thought is asked after the action it explains; an env from before expert_thought has none
        lambda pool, some: pool.call_many(
            lambda env: (env.expert_action(), getattr(env, "expert_thought", str)()), [s.env for s in some]
        ),
    )


def label(ep: Episode) -> str:
    """How a stall's message names an episode."""
    return f"task {ep.task_id} sample {ep.sample}"


def per_pool(
    items: Sequence[Any], pool_of: Callable[[Any], EnvPool], call: Callable[[EnvPool, list[Any]], list[T]]
) -> list[T]:
    """``call(pool, its items)`` for each env pool among ``items``, results back in the items' order. With
    several pools, those of I/O-bound envs run on threads of their own meanwhile (one env's slow steps
    overlap another's); the others run on this thread, one after another: an in-process engine may
    keep state per process (its random generator), which two threads would trample."""
    pools: dict[int, tuple[EnvPool, list[int]]] = {}
    for index, item in enumerate(items):
        pool = pool_of(item)
        pools.setdefault(id(pool), (pool, []))[1].append(index)
    groups = list(pools.values())
    run = lambda group: call(group[0], [items[i] for i in group[1]])  # noqa: E731
    threaded = [group for group in groups if group[0].io_bound] if len(groups) > 1 else []
    if not threaded:  # one pool (every one-env rollout), or none that waits on I/O
        answers = {id(group[0]): run(group) for group in groups}
    else:
        with ThreadPoolExecutor(max_workers=len(threaded), thread_name_prefix="omrl-lane") as threads:
            waiting = {id(group[0]): threads.submit(run, group) for group in threaded}
            answers = {id(group[0]): run(group) for group in groups if id(group[0]) not in waiting}
            answers.update({key: future.result() for key, future in waiting.items()})
    out: list[Any] = [None] * len(items)
    for pool, indices in groups:
        for index, value in zip(indices, answers[id(pool)]):
            out[index] = value
    return out


def open_episode(
    ep: Episode,
    env: Env,
    first: Observation | BaseException,
    template: Template,
    tokenizer: Any,
    env_name: str,
    demonstration: bool,
    options: dict | None = None,
) -> tuple[list[dict[str, str]], dict, str] | None:
    """Fill ``ep``'s instruction and first prompt (ids, masks) from the env's reset answer ``first``.

    Returns the chat so far, the template's chat-template kwargs and the first observation; or None,
    with ``ep.error`` set, when the reset failed or answered something unusable. Chains and search
    trees open their episodes here, so a search path starts with the chain's exact ids.
    """
    problem = None if isinstance(first, BaseException) else reset_problem(first)
    if isinstance(first, BaseException) or problem:
        ep.error = f"reset failed: {raised(first)}" if problem is None else f"reset failed: env {env_name!r} {problem}"
        return None
    ep.instruction = clean_text(first.instruction)
    reported = {key: value for key, value in first.info.items() if key not in ("won", "score")}
    if reported:  # what the task is (its expected answer): a reward reads it where no step reported it
        ep.info["reset"] = reported
    observation = clean_text(first.text) or EMPTY_OBSERVATION
    # the first user message is the instruction plus the first observation (once: some envs repeat it)
    user = observation if ep.instruction in observation else f"{ep.instruction}\n\n{observation}"
    demo = demonstration_messages(template, env, env.demonstration) if demonstration else []
    ep.demo_messages = len(demo)
    system = _system_prompt(template, env)
    if isinstance(system, TemplateFailure):  # a broken template plugin: env_error, the env is not at fault
        ep.error = str(system)
        return None
    messages = [{"role": "system", "content": system}, *demo, {"role": "user", "content": user}]
    kwargs = {**(options or {}), **template.chat_template_kwargs(env)}  # the run's template options, then the env's
    ep.chat_kwargs = dict(kwargs)  # SFT on the episode renders its chat as it was rendered here
    ids = prompt_ids(tokenizer, messages, **kwargs)
    ep.token_ids, ep.loss_mask, ep.logprobs = ids, [0] * len(ids), [0.0] * len(ids)
    ep.prompt_length = len(ids)
    return messages, kwargs, observation


def _system_prompt(template: Template, env: Env) -> str | TemplateFailure:
    """The template's system message for ``env``, or a :class:`TemplateFailure` naming it when it raised or
    gave no text (Jinja then failed on a message without content, and omrl was blamed)."""
    try:
        text = template.system_prompt(env)
    except Exception as exc:  # noqa: BLE001 - a template bug, whatever it raises
        return TemplateFailure.of(template, "system_prompt", f"raised {type(exc).__name__}: {str(exc)[:200]}", exc)
    if not isinstance(text, str):
        return TemplateFailure.of(template, "system_prompt", f"returned {short_repr(text)}; it must return text")
    return text
