"""Copying live episodes: an env's own snapshot/restore, or replaying its actions from reset.

A tree search steps many branches of one episode. Each branch point keeps an env
*state* (an opaque value); stepping from it takes an instance from the pool, puts it
in that state and plays one action. Two ways exist (see :func:`omrl.envs.fork_support`):

- ``snapshot``: the env's own ``snapshot()``/``restore(state)`` (cheap, native);
- ``replay``: for ``deterministic`` envs, a :class:`ReplayState` (task id, actions,
  observations) replayed from ``reset``; a replay that sees other observations than
  the first time fails, so a wrongly declared env ends its branch as ``env_error``
  instead of silently playing another episode.

The instance that produced a state stays parked on it for a while, so a branch
that goes on from its latest state (every chain, most of a beam) restores nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from omrl.envs import Env, EnvError, Observation, StepResult, fork_support
from omrl.errors import OmrlError
from omrl.rollout.pool import EnvPool


class ForkError(OmrlError):
    """A tree strategy was asked to search an env that cannot copy an episode."""


@dataclass(frozen=True)
class ReplayState:
    """A deterministic env's state as the way to reach it: the task, then these actions."""

    task_id: int
    actions: tuple[str, ...]
    observations: tuple[str, ...]  # what reset, then each action, showed (checked on replay)


def check_forkable(pool: EnvPool, strategy: str) -> str:
    """The fork method of ``pool``'s env, or ForkError naming the env, the strategy and what it lacks."""
    method = fork_support(pool.probe())
    if method is None:
        raise ForkError(
            f"strategy {strategy!r} branches episodes, but env {pool.name!r} ({pool.env_class.__name__}) cannot copy "
            "one: it has neither snapshot()/restore() nor deterministic = True (to replay actions from reset); "
            "valid strategies for it: chain, best_of_n"
        )
    return method


class Forker:
    """Puts pool instances into tree states and steps them; keeps instances parked on fresh states."""

    def __init__(self, pool: EnvPool, method: str | None, max_parked: int = 256):
        self.pool = pool
        self.method = method  # "snapshot", "replay" or None (only fresh resets are possible)
        # an env that cannot be restored keeps every parked instance: each is the only way on
        self.max_parked = max_parked if method else 1 << 30
        self._parked: OrderedDict[int, tuple[Any, Env]] = OrderedDict()  # id(state) -> (state, env on it)
        self._holding: dict[int, Any] = {}  # id(env) -> the state it is in, for parked instances
        self.restores = 0  # instances put into a state they did not reach themselves (tests read it)

    def start(self, tasks: Sequence[int]) -> list[tuple[Observation | BaseException, Any]]:
        """Reset one instance per task: (first observation or the exception, the root state)."""
        envs = [self.pool.acquire() for _ in tasks]
        firsts = self.pool.reset_many(list(zip(envs, tasks)))
        out: list[tuple[Observation | BaseException, Any]] = []
        for env, task, first in zip(envs, tasks, firsts):
            if isinstance(first, BaseException):
                self.pool.release(env, broken=True)
                out.append((first, None))
                continue
            try:
                state = self._state_after(env, None, task, None, getattr(first, "text", ""))
            except Exception as exc:  # noqa: BLE001 - a snapshot that fails ends this task's search
                self.pool.release(env, broken=True)
                out.append((exc, None))
                continue
            self._park(state, env)
            out.append((first, state))
        return out

    def step_many(self, jobs: Sequence[tuple[Any, int, str]]) -> list[tuple[StepResult | BaseException, Any]]:
        """Play ``action`` from ``state`` for each ``(state, task_id, action)``: (result, new state).

        Every job gets its own instance, so two jobs from one state never share one.
        A job whose env raises gets the exception and no state; its instance is dropped.
        """
        envs = [self._take(state) for state, _, _ in jobs]
        work = {id(env): (job, self._holding.pop(id(env), None)) for env, job in zip(envs, jobs)}

        def play(env: Env) -> tuple[StepResult, Any]:
            (state, task, action), holding = work[id(env)]
            if holding is not state:
                self._restore(env, state)
            result = env.step(action)
            observation = result.observation if isinstance(result, StepResult) else None
            new_state = (
                None if getattr(result, "done", True) else self._state_after(env, state, task, action, observation)
            )
            return result, new_state

        outcomes = self.pool.call_many(play, envs)
        out: list[tuple[StepResult | BaseException, Any]] = []
        for env, outcome in zip(envs, outcomes):
            if isinstance(outcome, BaseException):
                self.pool.release(env, broken=True)
                out.append((outcome, None))
                continue
            result, new_state = outcome
            if new_state is None:  # the episode ended: nothing goes on from here
                self.pool.release(env)
            else:
                self._park(new_state, env)
            out.append((result, new_state))
        return out

    @contextmanager
    def holding(self, states: Sequence[Any]) -> Iterator[list[Env | BaseException | None]]:
        """An instance in each of ``states``, in their order (None for a None state), to read that state:
        parse a reply against the env where its branch stands, as the chain rollout parses against its own
        env. Each is the instance parked there, else a free one restored into it (an exception in its
        slot when that fails: the instance is dropped). On leaving, each is parked on its state again, so
        :meth:`step_many` plays from it without restoring; nothing may step them in between.
        """
        held: dict[int, tuple[Any, Env]] = {}
        for state in states:
            if state is not None and id(state) not in held:
                held[id(state)] = (state, self._take(state))
        stale = [(state, env) for state, env in held.values() if self._holding.get(id(env)) is not state]
        wanted = {id(env): state for state, env in stale}
        outcomes = self.pool.call_many(lambda env: self._restore(env, wanted[id(env)]), [env for _, env in stale])
        got: dict[int, Env | BaseException] = {key: env for key, (_, env) in held.items()}
        for (state, env), outcome in zip(stale, outcomes):
            self._holding.pop(id(env), None)
            if isinstance(outcome, BaseException):
                self.pool.release(env, broken=True)
                got[id(state)] = outcome
                del held[id(state)]
        try:
            yield [None if state is None else got[id(state)] for state in states]
        finally:
            for state, env in held.values():  # parked only now: parking may hand evicted instances out again
                self._park(state, env)

    def close(self) -> None:
        """Give every parked instance back to the pool."""
        for _, env in self._parked.values():
            self.pool.release(env)
        self._parked.clear()
        self._holding.clear()

    def drop(self, states: Sequence[Any]) -> None:
        """Give back the instances parked on ``states``: nothing will go on from them (a finished search)."""
        for state in states:
            parked = self._parked.pop(id(state), None)
            if parked is not None:
                self._holding.pop(id(parked[1]), None)
                self.pool.release(parked[1])

    # -- internals -------------------------------------------------------------------------------

    def _state_after(self, env: Env, before: Any, task: int, action: str | None, observation: str | None) -> Any:
        if self.method == "snapshot":
            return env.snapshot()
        if before is None:
            return ReplayState(task, (), (observation or "",))
        return ReplayState(task, (*before.actions, action), (*before.observations, observation or ""))

    def _take(self, state: Any) -> Env:
        """The instance parked on ``state`` (used once), else any free instance."""
        parked = self._parked.pop(id(state), None)
        if parked is not None:
            return parked[1]  # still in _holding: play() sees it needs no restore
        return self.pool.acquire()

    def _restore(self, env: Env, state: Any) -> None:
        self.restores += 1
        if self.method is None and state.actions:
            raise ForkError(f"env {self.pool.name!r} cannot copy an episode (no snapshot/restore, not deterministic)")
        if self.method == "snapshot":
            env.restore(state)
            return
        # replay (also the only way for an env without a fork method to reach a root: reset)
        first = env.reset(state.task_id)
        seen = [getattr(first, "text", "")]
        for action in state.actions:
            seen.append(env.step(action).observation)
        if tuple(o or "" for o in seen) != state.observations:
            at = next(i for i, (a, b) in enumerate(zip(seen, state.observations)) if (a or "") != b)
            if self.method is None:
                raise EnvError(
                    f"env {self.pool.name!r} showed another first observation when task {state.task_id} "
                    "was reset again, so chains cannot share its prompt; valid strategy for it: chain"
                )
            raise EnvError(
                f"env {self.pool.name!r} is declared deterministic, but replaying task {state.task_id} "
                f"showed another observation at step {at}; set deterministic = False or add "
                "snapshot()/restore()"
            )

    def _park(self, state: Any, env: Env) -> None:
        earlier = self._parked.pop(id(state), None)
        if earlier is not None:  # an env whose snapshot() hands out one cached value: one instance is enough
            self._holding.pop(id(earlier[1]), None)
            self.pool.release(earlier[1])
        self._holding[id(env)] = state
        self._parked[id(state)] = (state, env)  # the entry keeps ``state`` alive, so its id stays unique
        while len(self._parked) > self.max_parked:
            _, (_, old) = self._parked.popitem(last=False)
            self._holding.pop(id(old), None)
            self.pool.release(old)
