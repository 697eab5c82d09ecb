"""Episodes played by agent programs through the gateway: the agent counterpart of :func:`omrl.rollout.loop.collect`.

For each task (times ``group_size``) an env instance is reset to give the task, the agent runs with its
own API key on a thread of its own (all of a group's members at once), and the episode is what the
gateway recorded of its calls. Then it is scored: by the run's reward function (``agent.reward``), given
the task with the env's ground truth where the env gives one, or else by the env itself, which takes
the agent's answer as one step (the ``dataset`` env matches it against the answers).

The answer is the agent's return value when it is text (or a mapping with an ``answer``), else the
content of the last reply the model gave it. An agent or reward function that fails or outlives its
limit, an env that fails, an agent that never called the model, and one whose client hung up on every
call before its reply (a client timeout shorter than the model takes: :func:`timed_out`) end the
episode as ``env_error`` with the reason: such an episode is no measure of the model and is never
trained on. A call that found the episode's context full, or came after ``agent.max_calls`` calls, was
answered ``finish_reason: "length"`` and the episode ends ``max_context`` or ``max_turns`` (truncated),
scored as it stands; an agent whose error names a reply cut
at the run's ``max_new_tokens`` (a framework refusing an incomplete response) is scored as it stands too,
while any other error after such a reply is the agent's (``env_error``). Agents that share one client, so that
episodes' calls arrive with each other's keys, fail the run (:class:`SharedClient`).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from omrl.data.trajectory import Episode
from omrl.envs import step_problem
from omrl.errors import OmrlError
from omrl.gateway.agents import (
    AgentFailure,
    Launch,
    call_agent,
    check_agent,
    check_command,
    check_reward,
    load_callable,
    run_command,
    score,
)
from omrl.gateway.server import SHARED_CLIENT, Gateway
from omrl.rollout.live import raised
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress

SCORED = "agent_reward"  # Turn.info key of the reward function's components
NEVER_CALLED = "the agent finished without calling the model"


class SharedClient(OmrlError):
    """Episodes' calls arrived with each other's keys: their agents share one client (:data:`SHARED_CLIENT`)."""


@dataclass(frozen=True)
class AgentSpec:
    """What plays the episodes and what scores them, from a run's ``agent`` config section."""

    run: Callable[..., Any] | None  # a callable agent, or
    command: list[str] | None  # a command
    reward: Callable[..., Any] | None  # None: the env scores the answer
    timeout_s: float = 300.0
    reward_timeout_s: float = 60.0

    @classmethod
    def from_config(cls, agent: Any) -> "AgentSpec | None":
        """None when the section names no agent; a ConfigError for a name that does not load."""
        from omrl.errors import ConfigError

        for key in ("callable", "command", "reward"):  # an unset shell variable: no agent would play, in silence
            value = getattr(agent, key)
            if isinstance(value, str) and value and not value.strip():
                raise ConfigError(f"agent.{key} is blank ({value!r}); give it, or leave it out")
        if not agent.callable and not agent.command:
            if agent.reward:
                raise ConfigError(
                    "agent.reward scores an agent's episodes; name the agent too (--agent or --agent-cmd)"
                )
            return None
        if agent.callable and agent.command:
            raise ConfigError("give one agent: agent.callable (--agent) or agent.command (--agent-cmd), not both")
        for key in ("timeout_s", "reward_timeout_s"):
            if not getattr(agent, key) > 0:
                raise ConfigError(f"agent.{key} must be > 0 seconds, got {getattr(agent, key)!r}")
        return cls(
            run=check_agent(load_callable(agent.callable, "agent.callable"), agent.callable)
            if agent.callable
            else None,
            command=check_command(agent.command) if agent.command else None,
            reward=check_reward(load_callable(agent.reward, "agent.reward"), agent.reward) if agent.reward else None,
            timeout_s=float(agent.timeout_s),
            reward_timeout_s=float(agent.reward_timeout_s),
        )


def play_agents(
    spec: AgentSpec,
    gateway: Gateway,
    pool: EnvPool,
    tasks: Sequence[int],
    *,
    split: str = "train",
    group_size: int = 1,
    max_parallel: int = 0,
    progress: RolloutProgress | None = None,
) -> list[Episode]:
    """Play ``group_size`` episodes of each task with the agent; ordered by (group, sample)."""
    progress = progress or RolloutProgress()
    jobs = [(group, sample, int(task)) for group, task in enumerate(tasks) for sample in range(group_size)]
    gateway.begin_play()
    lock = threading.Lock()  # the pool and the progress are not thread-safe
    stop = threading.Event()  # set when the run stops under the agents: each one's wait ends at once

    def one(job: tuple[int, int, int]) -> Episode:
        group, sample, task = job
        ep = Episode(env=pool.name, task_id=task, split=split, instruction="", group=group, sample=sample)
        with lock:
            env = pool.acquire()
        broken = False
        try:
            broken = _play(spec, gateway, env, ep, stop)
        finally:
            with lock:
                problem = pool.release(env, broken=broken)
                if problem is not None and ep.end_reason != "env_error":
                    ep.end_reason, ep.error = (
                        "env_error",
                        f"ending the episode's env failed: {raised(problem)}",
                    )
                progress.generated(sum(ep.loss_mask))
                progress.finished(ep)
        return ep

    workers = max(1, min(len(jobs), max_parallel or len(jobs)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="omrl-agent") as threads:
        try:
            futures = [threads.submit(one, job) for job in jobs]
            if not gateway.batcher.serves_itself:  # generate on this thread while the agents play
                gateway.batcher.drive(until=lambda: all(future.done() for future in futures))
            episodes = [future.result() for future in futures]
        except BaseException:  # Ctrl-C, SIGTERM, a broken engine: no worker waits out its agent's limit
            stop.set()
            threads.shutdown(wait=False, cancel_futures=True)
            raise
    if gateway.batcher.failure is not None:  # the engine broke: no episode measured the agent
        failure = gateway.batcher.failure
        raise RuntimeError(f"generation failed in the gateway: {type(failure).__name__}: {failure}") from failure
    # a call with another episode's key, or an agent that never called beside a same-task key that got its
    # chat opened again: the agents share a client, and the episodes hold each other's chats (an agent that
    # asks its opening chat twice on purpose, self-consistency, leaves no episode without a call)
    if gateway.misrouted or any(ep.error == NEVER_CALLED and ep.task_id in gateway.strayed for ep in episodes):
        raise SharedClient(gateway.misrouted or SHARED_CLIENT)
    return episodes


def _play(spec: AgentSpec, gateway: Gateway, env: Any, ep: Episode, stop: threading.Event) -> bool:
    """Play and score one episode in ``ep``; whether its env instance broke (it raised)."""
    try:
        first = env.reset(ep.task_id)
    except Exception as exc:  # noqa: BLE001 - the env's failure, recorded
        _failed(ep, f"reset failed: {raised(exc)}")
        return True
    task = {"id": ep.task_id, "split": ep.split, "env": ep.env, "prompt": first.text, "instruction": first.instruction}
    key, recorder = gateway.open(ep, str(first.text or ""))
    returned = False
    try:
        result = _run_agent(spec, task, gateway, key, stop)
        returned = True
    except AgentFailure as exc:
        # first: an agent thread left running past its limit can write no more
        gateway.end(key, agent_returned=exc.ended_itself)
        ep.messages = recorder.chat()
        cut = bool(recorder.cut) or (_cut_by_the_run(ep) and exc.names_a_cut)
        if not (exc.ended_itself and ep.turns) or not (cut or _rejected_a_tool_call(ep)):
            _failed(ep, _agents_failure(exc, ep, recorder.undone))
            return False
        # the model's doing: its framework raised on a "length" answer the agent did not ask for (the budget's,
        # or a reply cut at the run's max_new_tokens: the Agents SDK raises on that), or refused a malformed call
        ep.turns[-1].done = True
        ep.turns[-1].info["agent_error"] = str(exc)
        if cut:  # truncated, scored as it stands
            ep.end_reason = recorder.cut or "done"
            return _score(spec, env, ep, task, None)
        ep.end_reason, ep.won, ep.score = "done", False, 0.0
        return False
    finally:
        gateway.end(key, agent_returned=returned)  # whatever happened, the key is refused from now on
    ep.messages = recorder.chat()
    if not ep.turns:
        _failed(ep, timed_out(recorder.undone) if recorder.undone else NEVER_CALLED)
        return False
    ep.end_reason = recorder.cut or "done"
    ep.turns[-1].done = True
    ep.turns[-1].info["agent_result"] = _short(result)
    return _score(spec, env, ep, task, result)


def _agents_failure(exc: AgentFailure, ep: Episode, undone: Sequence[float]) -> str:
    """Why an episode ended ``env_error`` in its agent: the agent's error, with what explains it."""
    if undone and not ep.turns:
        return f"{exc} ({timed_out(undone)})"
    if exc.ended_itself and ep.turns and _cut_by_the_run(ep):  # an error of its own after a cut that it does not name
        return (
            f"{exc} (after a reply cut at generation.max_new_tokens; the error does not name that cut, so it is the "
            "agent's failure, not the model's)"
        )
    if exc.names_a_cut and _cap(ep) == "max_tokens":  # the agent's own cap: its framework refused what it asked for
        return (
            f"{exc} (after a reply cut at the max_tokens the agent's own call set: its framework refused the cut it "
            "asked for, so the episode is the agent's failure; raise that cap, or leave it out so the run's "
            "generation.max_new_tokens cuts the reply and the episode is trained as it stands)"
        )
    return str(exc)


def timed_out(took: Sequence[float]) -> str:
    """Why an episode whose agent called the model has no turn: its client hung up on every call before the
    reply (``took``: how long each of those calls took), so each reply was undone."""
    return (
        f"the agent's calls timed out before their replies: its client hung up on all {len(took)} (retries "
        f"included), though the model answered each within {max(took):.1f} s; its client's timeout is likely "
        f"under {min(took):.1f} s (openai.OpenAI(timeout=...), or its framework's request timeout): give it "
        "longer than the model takes to answer"
    )


def _run_agent(spec: AgentSpec, task: dict[str, Any], gateway: Gateway, key: str, stop: threading.Event) -> Any:
    launch = Launch(task, gateway.base_url, key, gateway.model_name, spec.timeout_s, stop)
    return call_agent(spec.run, launch) if spec.run is not None else run_command(spec.command or [], launch)


def _cut_by_the_run(ep: Episode) -> bool:
    """Whether the last reply was cut at a cap the agent did not set (``generation.max_new_tokens``)."""
    return _cap(ep) == "max_new_tokens"


def _cap(ep: Episode) -> str | None:
    """The cap the last reply was cut at (``max_new_tokens``, the agent's ``max_tokens``, ``max_context``), or None."""
    rollout = ep.turns[-1].info.get("rollout", {}) if ep.turns else {}
    return rollout.get("cap") if rollout.get("truncated") else None


def _rejected_a_tool_call(ep: Episode) -> bool:
    """Whether the agent failed right after a reply whose tool calls did not all parse cleanly: frameworks
    raise on an unknown tool or arguments that are not JSON (the OpenAI Agents SDK's ModelBehaviorError,
    pydantic-ai's UnexpectedModelBehavior), which is the model's mistake, not the world's."""
    return bool(ep.turns) and any(a["status"] != "ok" for a in ep.turns[-1].info.get("tool_calls", []))


def _score(spec: AgentSpec, env: Any, ep: Episode, task: dict[str, Any], result: Any) -> bool:
    """Score the finished episode (the env steps on the answer, then the reward function where there is
    one); whether the env instance broke."""
    try:
        stepped = env.step(_answer(result, ep))
    except Exception as exc:  # noqa: BLE001 - the env's failure, whatever scores the answer
        _failed(ep, f"the env could not score the agent's answer: {type(exc).__name__}: {exc}")
        return True
    problem = step_problem(stepped)
    if problem:  # a result the env protocol does not allow: the env is broken, not the agent
        _failed(ep, f"the env could not score the agent's answer: the env {ep.env!r} {problem}")
        return False
    last = ep.turns[-1]
    if spec.reward is None:
        last.reward = float(stepped.reward)
        last.info.update({k: v for k, v in stepped.info.items() if k not in last.info})
        ep.won, ep.score = stepped.won, stepped.score
        return False
    truth = stepped.info.get("ground_truth")
    try:
        components = score(spec.reward, {**task, "ground_truth": truth}, result, ep.messages, spec.reward_timeout_s)
    except AgentFailure as exc:
        _failed(ep, str(exc))
        return False
    total = sum(components.values())
    last.reward = total
    last.info[SCORED] = components
    ep.won, ep.score = total >= 1.0, min(1.0, max(0.0, total))
    return False


def _answer(result: Any, ep: Episode) -> str:
    """What the env steps on: the agent's result (text, a number, or a mapping's ``answer``), else its last reply."""
    answer = result.get("answer") if isinstance(result, dict) else result
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return str(answer)
    replies = [m for m in ep.messages if m["role"] == "assistant"]
    return replies[-1]["content"] if replies else ""


def _failed(ep: Episode, reason: str) -> None:
    ep.end_reason, ep.error = "env_error", reason


def _short(value: Any, limit: int = 500) -> Any:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def reward_components(episodes: Sequence[Episode]) -> dict[str, float]:
    """Rewards of episodes a reward function scored: each component and the total on the last turn of
    each (``Episode.rewards``; 0 on an ``env_error`` episode's turns), and their means over the episodes
    that played, for logging."""
    played = [ep for ep in episodes if ep.end_reason != "env_error"]
    names = [*sorted({name for ep in played for name in ep.turns[-1].info.get(SCORED, {})}), "total"]
    sums = dict.fromkeys(names, 0.0)
    for ep in episodes:
        components = ep.turns[-1].info.get(SCORED, {}) if ep.turns and ep.end_reason != "env_error" else {}
        for name in names:
            value = sum(components.values()) if name == "total" else components.get(name, 0.0)
            ep.rewards[name] = [0.0] * len(ep.turns)
            if ep.turns:
                ep.rewards[name][-1] = value
            sums[name] += value
    return {name: value / max(1, len(played)) for name, value in sums.items()}
