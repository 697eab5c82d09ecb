"""``agentgym``: play an env that runs on an AgentGym-style HTTP server (or ``omrl env serve``).

Options (config block ``plugins.agentgym``):

- ``base_url``: the server, e.g. ``http://127.0.0.1:36001``.
- ``env_name``: which server it is: textcraft, babyai, sciworld, alfworld, maze, wordle,
  webshop, sqlgym, searchqa, academia, movie, sheet, todo, weather, webarena, or any other name
  for an ``omrl env serve`` server (generic: it lists its own tasks and says ``won``/``score``
  itself). Each known name fixes the requests and answers of that server, bodies included
  (the table and its sources: :mod:`omrl_plugins.envs.agentgym.servers`).
- ``dialect`` (``id`` or ``env_idx``), ``task_field`` (the reset field that picks the task:
  data_idx, game, seed, item_id, session_id...) and ``reset_fields`` (extra reset fields, e.g.
  ALFWorld's ``world_type``) override what ``env_name`` implies.
- ``splits``: AgentGym servers do not list their tasks, so most known envs have default splits
  (below; an omrl server lists its own, which win); ``{test: 100, train: 444}`` lays counts out
  from id 0 in that order, and ``{test: [0, 100], train: [100, 544, 2]}`` gives explicit ranges
  (start, stop[, step]); set, they win over both.
- ``timeout`` (seconds per HTTP call), ``retries`` and ``backoff``: a call is retried after
  ``backoff * 2**k`` seconds when it could not reach the server, and creates, resets, closes and
  reads also after an HTTP 5xx or a timeout. A step is never sent twice once it may have reached
  the server (the server may have played it before failing): a 5xx or a read timeout there is an
  EnvError for that episode. A server that stays down fails after ``retries + 1`` attempts, so no
  call hangs longer than about ``(retries + 1) * timeout + backoff * (2**retries - 1)`` seconds.
- ``token``: sent as ``Authorization: Bearer <token>`` (an ``omrl env serve --token`` server);
  unset, the ``OMRL_SERVE_TOKEN`` environment variable is used, which keeps it out of config
  files and run directories. ``headers``: extra HTTP headers for every call (e.g. a gateway's).
- ``reuse_ids``: let a foreign server's env id play more than one episode (see below); unset,
  true for webshop and sqlgym (their servers hand out live ids again), false otherwise.
- ``accept_shared_server_risk``: play a foreign server whose env ids the client cannot check (see
  "Env ids and server restarts"); unset (false), such a server is refused with a ConfigError
  saying why.

Defaults per ``env_name``: splits (task ids), and how ``score`` (in [0, 1]) and ``won`` (in
``info`` on every step) are derived:

- textcraft: test 0-99, train 100-543 (544 goals); score = sum of rewards (1 on crafting the
  goal), won = done with score 1. alfworld: train 0-2419, test 2420-2619 (AgentGym's mapping
  files), reward 1 = won, as textcraft. maze: both splits are the 26 start positions; wordle:
  test seeds 0-199, train 200-10199; both as textcraft (reward 1 at the goal / right word).
- babyai: test 0-399, train 400-4399 (id % 40 + 1 = level, id // 40 = seed); score = the
  server's ``score``; won = done with score >= 0.5 (the server's own done rule).
- sciworld: test every 10th of the 4,639 variations, train the odd ids; score = the server's
  ``score`` / 100 (negative, i.e. failed, clips to 0); won at 100.
- webshop: test 0-499, train 1500-12086 (WebShop's goal split); score = the purchase reward,
  won = reward 1.0. sqlgym, searchqa, webarena: as textcraft; the tool envs (academia, movie,
  sheet, todo, weather): score = the latest reward (a progress rate, 1 on success). These have
  no default splits: set ``splits``.
- any other name (an ``omrl env serve`` server): splits from ``GET /tasks``; won and score as
  the server sends them.

The step ``reward`` is the server's reward, or the change in score for envs that report a
running score (babyai, sciworld, the tool envs); the score is the running sum (clipped) of
rewards otherwise.

Errors: AgentGym servers answer failures with HTTP 200 and ``{"error": ...}``; that, a 4xx, or a
body that is not JSON, lacks a key its server answers, or holds a reward or score that is not a
finite number or a ``done``/``won`` that is not a boolean becomes an :class:`~omrl.envs.EnvError`
naming the server, the call and the message. A step whose server died raises EnvError (the
rollout marks the episode ``env_error`` instead of scoring it 0) and the next ``reset`` creates
a new env id.

An ``omrl env serve`` server of an env named like a known one (``omrl env serve webshop``, played
with ``env_name=webshop``) is sent that known server's requests, which it takes, and its answers
are read the omrl way once its ``/create`` answer names its instance. Its splits (unless
``splits`` is set), turn cap, action help and example are its own, from ``GET /tasks``, asked at
their first use (AgentGym's servers answer 404 there: the table above);
:mod:`omrl_plugins.envs.agentgym.tasks`.

Replay forks (tree search): an ``omrl env serve`` server says in its ``/create`` answer whether
its env is ``deterministic``; the client sets its own ``deterministic`` to that at each create,
so :func:`omrl.envs.fork_support` offers replay for a deterministic served env once the client
has created an env there. Foreign servers never say it: False.

Env ids and server restarts (a restarted server numbers its ids from 0 again, so an id kept from
before may be another client's env now): :mod:`omrl_plugins.envs.agentgym.held_env`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, Sequence

from omrl.envs import DemoTurn, Env, EnvError, EpisodeFinishedError, Observation, StepResult
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.agentgym.dialects import (
    DIALECTS,
    GENERIC_SERVER,
    KNOWN_SERVERS,
    MalformedAnswer,
    as_omrl_server,
    as_text,
    create_body,
    read_create,
    read_reset,
    read_step,
)
from omrl_plugins.envs.agentgym.held_env import GONE, HeldEnv
from omrl_plugins.envs.agentgym.splits import parse_splits
from omrl_plugins.envs.agentgym.tasks import ServerTasks
from omrl_plugins.envs.agentgym.transport import HttpTransport, ServerFailure, ServerRefused, request_headers, snippet

__all__ = ["AgentGymEnv", "parse_splits", "register_envs"]

MALFORMED = (KeyError, TypeError, ValueError, OverflowError)  # what reading a malformed answer raises


class AgentGymEnv(Env):
    """Play an env served over HTTP by an AgentGym server or `omrl env serve`."""

    io_bound = True

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        env_name: str = "textcraft",
        dialect: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        splits: dict[str, Any] | None = None,
        task_field: str | None = None,
        reset_fields: dict[str, Any] | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        reuse_ids: bool | None = None,
        accept_shared_server_risk: bool = False,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"plugins.agentgym.base_url must be an http(s) URL, got {base_url!r}")
        if dialect is not None and dialect not in DIALECTS:
            raise ConfigError(f"plugins.agentgym.dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
        for name, value, low, kinds in (
            ("timeout", timeout, 1e-3, (int, float)),
            ("retries", retries, 0, int),
            ("backoff", backoff, 0, (int, float)),
        ):
            if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
                raise ConfigError(f"plugins.agentgym.{name} must be a number >= {low}, got {value!r}")
        if not isinstance(env_name, str) or not env_name:
            raise ConfigError(
                f"plugins.agentgym.env_name must name the server's env (e.g. textcraft), got {env_name!r}"
            )
        self.env_name = env_name
        spec = KNOWN_SERVERS.get(env_name.lower(), GENERIC_SERVER)
        self._self_describing = spec is GENERIC_SERVER
        self._spec = dataclasses.replace(
            spec,
            dialect=dialect or spec.dialect,
            task_field=task_field or spec.task_field,
            reset_fields={**spec.reset_fields, **(reset_fields or {})},
        )
        listed = parse_splits(splits) if splits is not None else None  # None: the server's or the table's
        table = parse_splits(spec.splits) if spec.splits is not None else None
        self._server = HttpTransport(base_url, float(timeout), retries, float(backoff), request_headers(token, headers))
        if reuse_ids is not None and not isinstance(reuse_ids, bool):
            raise ConfigError(f"plugins.agentgym.reuse_ids must be true or false, got {reuse_ids!r}")
        self._reuse_ids = spec.reuse_ids if reuse_ids is None else reuse_ids
        if not isinstance(accept_shared_server_risk, bool):
            raise ConfigError(
                f"plugins.agentgym.accept_shared_server_risk must be true or false, got {accept_shared_server_risk!r}"
            )
        self._held = HeldEnv(self._server, self._spec, env_name, accept_shared_server_risk)
        self._tasks = ServerTasks(self._server, self._held, env_name, listed, table, known=not self._self_describing)
        self._deterministic: bool | None = None  # what the last /create answer said
        self._lock = threading.Lock()  # calls on one env id are serialized
        self._score = 0.0
        self._actions: list[str] | None = None
        self._has_expert = self._spec.expert_route is not None
        self._omrl_answers = False  # True once a known env's server turned out to be an omrl server

    @property
    def _env_id(self) -> int | None:
        """The env id held on the server (None: none yet, or dropped)."""
        return self._held.id

    @property
    def deterministic(self) -> bool:  # type: ignore[override]
        """Whether the server's env is deterministic: its last /create answer says so; before one, an omrl
        server's GET /tasks (so tree search can check the env before any episode); foreign servers: False."""
        if self._deterministic is None and self._self_describing:
            return self._tasks.described().get("deterministic") is True
        return bool(self._deterministic)

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._tasks.split_ids())

    @property
    def action_help(self) -> str:  # type: ignore[override]
        """An omrl server's own (GET /tasks, whatever its env's name); else the known server's."""
        return str(self._tasks.described().get("action_help") or self._spec.action_help)

    @property
    def action_example(self) -> str:  # type: ignore[override]
        """An omrl server's example action for the prompt (GET /tasks): the prompt is the one its env gives."""
        return str(self._tasks.described().get("action_example") or "")

    @property
    def demonstration(self) -> tuple[DemoTurn, ...]:  # type: ignore[override]
        """An omrl server's worked example (GET /tasks); AgentGym's own servers have none."""
        return tuple(DemoTurn(*turn) for turn in self._tasks.described().get("demonstration") or ())

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        """An omrl server's own turn cap (GET /tasks, whatever its env's name); else the known server's."""
        return int(self._tasks.described().get("max_turns") or self._spec.max_turns)

    def task_ids(self, split: str) -> Sequence[int]:
        return self._tasks.task_ids(split)

    # -- episodes ------------------------------------------------------------------------
    def reset(self, task_id: int) -> Observation:
        self._tasks.check_task(task_id)
        with self._lock:
            self._held.started = self._held.done = False
            self._held.close_orphans()
            if self._held.id is not None and not self._reusable():
                self._held.close()  # a foreign server's id lives one episode
            try:
                answer = self._reset_on_server(task_id)
                observation, instruction, info = self._parse_reset(answer)
                self._held.check_route()
            except ServerFailure:
                self._held.drop()  # the server may have lost it: the next reset makes a new one
                raise
            self._held.check_claim("POST /reset")
            self._held.started = True
            return Observation(observation, instruction, {"task_id": task_id, **info})

    def _reusable(self) -> bool:
        """Whether the env id may play another episode: an omrl server refuses ids of another
        instance (410), so its ids are safe to keep; a foreign server's only with ``reuse_ids``."""
        return self._held.instance is not None or self._reuse_ids

    def _reset_on_server(self, task_id: int) -> Any:
        body = {self._spec.task_field: task_id, **self._spec.reset_fields}
        if self._held.id is not None:
            try:
                self._held.check_ours("POST /reset")  # a kept foreign id: still this client's env?
                return self._held.call("POST", "/reset", body)
            except ServerFailure:
                raise
            except ServerRefused as exc:  # e.g. a restarted server (410): make a new one
                self._held.drop(gone=exc.status in GONE or exc.unknown_id)
            except EnvError:  # another client's env now: left alone, and a new one made
                self._held.drop(gone=True)
        self._held.id, self._held.instance = self._create(task_id)
        return self._held.call("POST", "/reset", body)

    def _create(self, task_id: int) -> tuple[int, str | None]:
        """A new env id, and the omrl server instance that handed it out (None: a foreign server)."""
        route = self._held.route("/create")
        seen = self._held.ledger.before_create()
        answer = self._server.call("POST", route, body=create_body(self._spec, task_id))
        try:
            env_id, instance, self._deterministic = read_create(self._spec, answer)
        except MALFORMED as exc:
            raise ServerFailure(self._server.message(f"POST {route}", str(exc))) from exc
        if instance is None and not (self._spec.observation_route or self._spec.random_ids or self._held.accept_risk):
            if self._held.has_close:
                try:
                    self._held.close_on_server(env_id, None)
                except EnvError:
                    pass
            raise self._held.shared_risk(
                f"the server at {self._server.base_url} (env_name {self.env_name!r}) answered its create with "
                "no instance name and has no route that shows an env's latest observation"
            )
        if instance is None:  # an omrl server's instance name guards its ids; a foreign server's, the ledger
            self._held.claim = self._held.ledger.claim(env_id, seen, counts_up=not self._reuse_ids)
        if instance is not None and not self._self_describing and not self._omrl_answers:
            self._spec, self._omrl_answers = as_omrl_server(self._spec), True  # e.g. `omrl env serve webshop`
            self._held.has_close = True  # unlike the env's own server, an omrl one closes ids: they are not left
            self._has_expert = True
            self._tasks.omrl_server_seen()
        return env_id, instance

    def _parse_reset(self, answer: Any) -> tuple[str, str, dict[str, Any]]:
        echoed = answer.get(self._held.id_key) if isinstance(answer, dict) else None
        if type(echoed) is int and echoed != self._held.id:  # TextCraft's and omrl's answers name the id
            raise ServerFailure(
                self._server.message(
                    f"POST {self._held.route('/reset')}",
                    f"the answer is about env id {echoed}, not {self._held.id}: another client's env",
                )
            )
        try:
            parts = read_reset(self._spec, answer)
        except MALFORMED as exc:
            problem = f"malformed answer ({type(exc).__name__}: {exc})"
            if not isinstance(exc, MalformedAnswer):
                problem += f": {snippet(json.dumps(answer))}"
            raise ServerFailure(self._server.message(f"POST {self._held.route('/reset')}", problem)) from exc
        self._actions, self._score = parts.actions, parts.score or 0.0
        observation = parts.observation
        if self._spec.observe_after_reset or observation is None:
            observation = self._held.call("GET", "/observation")
        self._held.seen = self._held.first_seen = as_text(observation)
        instruction = parts.instruction
        if self._spec.instruction_route and not instruction:
            instruction = str(self._held.call("GET", self._spec.instruction_route))
        return as_text(observation), instruction, parts.info

    def step(self, action: str) -> StepResult:
        with self._lock:
            if self._held.started and self._held.done:  # (a foreign server's finished env is closed already)
                raise EpisodeFinishedError(f"agentgym env {self.env_name!r}: the episode is over; reset first")
            if not self._held.started or self._held.id is None:
                raise EnvError(f"agentgym env {self.env_name!r}: call reset(task_id) before step")
            env_id = self._held.id
            try:  # checked before each attempt: the env may have become another client's
                answer = self._held.call("POST", "/step", {"action": action}, resend_safe=False, checked=True)
                result = self._parse_step(answer)
            except ServerRefused as exc:
                if exc.status not in GONE and not exc.unknown_id:
                    raise
                self._held.drop(gone=True)  # never closed: the number may be another client's env by then
                raise ServerRefused(
                    f"{exc} (the server no longer knows env id {env_id}: it restarted, or another client closed it)",
                    exc.status,
                ) from exc
            except ServerFailure:
                self._held.drop()
                raise
            self._held.check_claim("POST /step")  # a restart seen while the step was away: the answer may be another's
            self._held.done = result.done
            if result.done and not self._reusable():
                self._held.close_finished(env_id)
            return result

    def _parse_step(self, answer: Any) -> StepResult:
        try:
            parts = read_step(self._spec, answer, self._score)
        except MALFORMED as exc:
            problem = f"malformed answer ({type(exc).__name__}: {exc}): {snippet(json.dumps(answer))}"
            raise ServerFailure(self._server.message(f"POST {self._held.route('/step')}", problem)) from exc
        self._score, self._actions, self._held.seen = parts.score, parts.actions, parts.observation
        return StepResult(
            parts.observation, parts.reward, parts.done, {**parts.info, "won": parts.won, "score": parts.score}
        )

    def admissible_actions(self) -> list[str] | None:
        with self._lock:
            if self._actions is not None or not self._spec.actions_route or self._held.id is None:
                return None if self._actions is None else list(self._actions)
            answer = self._held.call("GET", self._spec.actions_route)
        if isinstance(answer, dict) and "clickables" in answer:  # WebShop
            search = ["search[<keywords>]"] if answer.get("has_search_bar") else []
            return search + [f"click[{c}]" for c in answer["clickables"]]
        return [str(a) for a in answer] if isinstance(answer, list) else None

    def expert_action(self) -> str | None:
        with self._lock:
            if not self._has_expert or self._held.id is None or not self._held.started:
                return None
            try:
                answer = self._held.call("GET", self._spec.expert_route)
            except ServerRefused as exc:
                if exc.status != 404:
                    raise
                self._has_expert = False  # a server without the omrl extension
                return None
        action = answer.get("action") if isinstance(answer, dict) else None
        return None if action is None else str(action)

    def end_episode(self) -> None:
        """The episode is over, finished or not (a turn cap, a full context): a foreign server's env
        id lives one episode, so it is closed now, not at the next reset, when the server may have
        restarted and handed the number to another client (whose env that close would end)."""
        with self._lock:
            if self._held.id is not None and not self._reusable():
                self._held.close()
            self._held.started = False

    def check_reachable(self) -> None:
        self._server.check_reachable()

    def close(self) -> None:
        with self._lock:
            self._held.close_orphans()
            self._held.close()
            self._held.started = False
            self._server.close()


@hookimpl
def register_envs(register):
    register("agentgym", AgentGymEnv)
