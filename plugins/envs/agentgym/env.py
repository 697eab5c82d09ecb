"""``agentgym``: play an env that runs on an AgentGym-style HTTP server (or ``omrl env serve``).

Options (config block ``plugins.agentgym``):

- ``base_url``: the server, e.g. ``http://127.0.0.1:36001``.
- ``env_name``: which server it is: textcraft, babyai, sciworld, alfworld, maze, wordle,
  webshop, sqlgym, searchqa, academia, movie, sheet, todo, weather, webarena, or any other name
  for an ``omrl env serve`` server (generic: it lists its own tasks and says ``won``/``score``
  itself). Each known name fixes the requests and answers of that server, bodies included
  (the table and its sources: :mod:`omrl_plugins.envs.agentgym.dialects`).
- ``dialect`` (``id`` or ``env_idx``), ``task_field`` (the reset field that picks the task:
  data_idx, game, seed, item_id, session_id...) and ``reset_fields`` (extra reset fields, e.g.
  ALFWorld's ``world_type``) override what ``env_name`` implies.
- ``splits``: AgentGym servers do not list their tasks, so most known envs have default splits
  (below); ``{test: 100, train: 444}`` lays counts out from id 0 in that order, and
  ``{test: [0, 100], train: [100, 544, 2]}`` gives explicit ranges (start, stop[, step]).
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
are read the omrl way once its ``/create`` answer names its instance.

Replay forks (tree search): an ``omrl env serve`` server says in its ``/create`` answer whether
its env is ``deterministic``; the client sets its own ``deterministic`` to that at each create,
so :func:`omrl.envs.fork_support` offers replay for a deterministic served env once the client
has created an env there. Foreign servers never say it: False.

Env ids and server restarts: a restarted server numbers its ids from 0 again, so an id kept from
before the restart may now be another client's env. An ``omrl env serve`` server names its
instance in the ``/create`` answer; the client sends that name with every call about the id, and
a restarted server refuses it (HTTP 410) instead of acting on another client's env, so such an id
is kept across episodes. A foreign server cannot tell, so its ids live one episode: ``reset``
creates a new env, and an episode's env is closed the moment it ends (:meth:`end_episode`, which
the rollout's pool calls for episodes cut short by a turn cap too), where a refused close (the
server no longer knew the id: it restarted, or another client closed it) makes a finished
episode's last step an EnvError, since another client may have shared the env. A bare ``false``
(AgentGym's answer for an id it does not hold) is such a refusal. The clients of one process share
what they see of a foreign server's ids: a create answered with an id one of them holds, or (ids
counting up) one not above an id answered before, means the server restarted or handed the env
out again, and the holder's next call (a step, a retry, a close) becomes an EnvError instead of
reaching the other client's env. One process's clients share one ledger of a server however its
URL is spelled (:func:`server_key`: ``127.0.0.1``, ``localhost``, ``::1`` and this machine's host
name are one host).

A restart whose new ids go to another process's clients first is not in any answer this process
gets, so the env itself is asked: AgentGym's servers keep each env's latest observation (the one
the last create, reset or step answered) and answer it at ``GET /observation?id=N`` (textcraft,
babyai with its goal line first, sciworld, alfworld, maze and wordle under their prefix; a server
of any other name is asked too when it names no instance). Before
every step (and every resend of one), before closing an unfinished episode's env, and before
resetting a kept id, the client reads it: anything but the last observation the server answered
this client means another client's create, reset or step reached the env, and the call is not
sent: the step raises EnvError (the episode ends ``env_error``, never trained on nor counted), a
close is skipped (the env is another client's now). Right after each reset the route must answer
the reset's own observation, or the server is refused with a ConfigError (a server without the
route, or whose route answers something else), unless ``accept_shared_server_risk`` (then that
client plays unchecked). A known server without such a route (searchqa, the tool envs, webarena)
is refused at its first create unless ``accept_shared_server_risk``; WebShop and SQLGym draw random
ids, which a restart hardly hands out again, and are played unchecked. The check costs one GET
per step (about a millisecond on loopback). What it cannot see: another client's env in the very
state this client left (e.g. the same task just reset, nothing played yet), and a restart between
the check and the step a moment later.

Servers without ``/close`` (WebShop, SQLGym, ALFWorld, LMRL-Gym, the tool envs) are never sent one and
then keep one env per episode in memory; ``reuse_ids=true`` trades that for the risk above (and
compares created ids only with held ones). It is the default for WebShop and SQLGym, which hand
out live ids again once they hold 8,000 and 8 envs (one env per episode would soon make two
clients share one) and draw random ids, which a restart hardly hands to another client. A server
answering a close with a bare 404 or 405 (no such route) is not sent another.
A step answered 404 or 410 names the lost id in its EnvError. An id dropped after a failure on
an omrl server is closed at the next ``reset`` or ``close`` (the instance name makes that safe),
so timeouts do not leak envs there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, Sequence

from omrl.envs import DemoTurn, Env, EnvError, EpisodeFinishedError, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl.serve import INSTANCE_HEADER, TOKEN_ENV
from omrl_plugins.envs.agentgym.dialects import (
    DIALECTS,
    GENERIC_SERVER,
    KNOWN_SERVERS,
    MalformedAnswer,
    as_omrl_server,
    as_text,
    create_body,
    observed,
    read_create,
    read_reset,
    read_step,
    same_env,
)
from omrl_plugins.envs.agentgym.ids import Claim, ledger, server_key
from omrl_plugins.envs.agentgym.transport import HttpTransport, ServerFailure, ServerRefused, snippet

GONE = (404, 410)  # statuses that say the server no longer has the env id
MAX_ORPHANS = 32  # dropped omrl ids remembered for closing (a server down for long drops more)
MALFORMED = (KeyError, TypeError, ValueError, OverflowError)  # what reading a malformed answer raises


def parse_splits(splits: Any, where: str = "plugins.agentgym.splits") -> dict[str, range]:
    """``{test: 100, train: 444}`` (counts from 0, in order) or ``{test: [0, 100]}`` -> ranges."""
    if not isinstance(splits, dict) or not splits:
        raise ConfigError(f"{where} must map split names to a count or [start, stop(, step)], got {splits!r}")
    out, next_start = {}, 0
    for name, value in splits.items():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[str(name)] = range(next_start, next_start + value)
        elif (
            isinstance(value, (list, tuple))
            and len(value) in (2, 3)
            and list(value[2:]) != [0]
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            out[str(name)] = range(*value)
        else:
            raise ConfigError(
                f"{where}.{name} must be a task count or [start, stop(, step)] of integers, got {value!r}"
            )
        next_start = out[str(name)].stop
    return out


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
        chosen = splits if splits is not None else spec.splits
        self._splits = parse_splits(chosen) if chosen is not None else None
        self._id_key = self._spec.dialect  # the body/query key naming the env id: "id" or "env_idx"
        self._server = HttpTransport(
            base_url, float(timeout), retries, float(backoff), _request_headers(token, headers)
        )
        if reuse_ids is not None and not isinstance(reuse_ids, bool):
            raise ConfigError(f"plugins.agentgym.reuse_ids must be true or false, got {reuse_ids!r}")
        self._reuse_ids = spec.reuse_ids if reuse_ids is None else reuse_ids
        if not isinstance(accept_shared_server_risk, bool):
            raise ConfigError(
                f"plugins.agentgym.accept_shared_server_risk must be true or false, got {accept_shared_server_risk!r}"
            )
        self._accept_risk = accept_shared_server_risk
        # checking that an env id still holds this client's env (a foreign server's observation route)
        self._checks = self._spec.observation_route is not None
        self._seen: str | None = None  # the last observation the server answered about this env
        self._first_seen = ""  # the episode's first observation
        self._deterministic: bool | None = None  # what the last /create answer said
        self._description: dict[str, Any] | None = None
        self._lock = threading.Lock()  # calls on one env id are serialized
        self._env_id: int | None = None
        self._instance: str | None = None  # the omrl server instance that handed out _env_id
        self._claim: Claim | None = None  # this client's hold on a foreign server's _env_id
        self._ledger = ledger(server_key(self._server.base_url) + self._spec.route_prefix)
        self._orphans: list[tuple[int, str]] = []  # dropped omrl ids to close: (id, instance)
        self._started = False
        self._done = False
        self._score = 0.0
        self._actions: list[str] | None = None
        self._has_expert = self._spec.expert_route is not None
        self._omrl_answers = False  # True once a known env's server turned out to be an omrl server
        self._has_close = self._spec.has_close  # False once the server turns out to lack /close

    # -- what the server is --------------------------------------------------------------
    def _described(self) -> dict[str, Any]:
        """An omrl server's self-description (GET /tasks): splits, action help, turn cap."""
        if self._description is None:
            try:
                answer = self._server.call("GET", self._route("/tasks"))
            except ServerRefused as exc:
                if exc.status not in (404, 405):  # a token, a busy server: not a missing route
                    raise
                raise ConfigError(
                    f"the server at {self._server.base_url} does not list its tasks ({exc}) and env_name "
                    f"{self.env_name!r} has no default splits; set plugins.agentgym.splits, e.g. "
                    "{test: [0, 100]}"
                ) from exc
            if not isinstance(answer, dict) or not isinstance(answer.get("splits"), dict):
                raise ServerFailure(
                    self._server.message("GET /tasks", f"expected {{'splits': ...}}, got {snippet(json.dumps(answer))}")
                )
            self._description = answer
        return self._description

    def _split_ids(self) -> dict[str, Sequence[int]]:
        if self._splits is None:
            splits = {}
            for name in self._described()["splits"]:
                answer = self._server.call("GET", self._route("/tasks"), params={"split": name})
                ids = _task_ids_of(answer)
                if ids is None:
                    problem = "expected {'range': [start, stop, step]} or {'task_ids': [...]}, got "
                    raise ServerFailure(
                        self._server.message(f"GET /tasks?split={name}", problem + snippet(str(answer)))
                    )
                splits[name] = ids
            self._splits = splits
        return self._splits

    @property
    def deterministic(self) -> bool:  # type: ignore[override]
        """Whether the server's env is deterministic: its last /create answer says so; before one, an omrl
        server's GET /tasks (so tree search can check the env before any episode); foreign servers: False."""
        if self._deterministic is None and self._self_describing:
            return self._described().get("deterministic") is True
        return bool(self._deterministic)

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._split_ids())

    @property
    def action_help(self) -> str:  # type: ignore[override]
        if self._self_describing:
            return str(self._described().get("action_help") or self._spec.action_help)
        return self._spec.action_help

    @property
    def demonstration(self) -> tuple[DemoTurn, ...]:  # type: ignore[override]
        """An omrl server's worked example (GET /tasks); AgentGym's own servers have none."""
        if self._self_describing:
            return tuple(DemoTurn(*turn) for turn in self._described().get("demonstration") or ())
        return ()

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        if self._self_describing:
            return int(self._described().get("max_turns") or self._spec.max_turns)
        return self._spec.max_turns

    def task_ids(self, split: str) -> Sequence[int]:
        splits = self._split_ids()
        if split not in splits:
            raise UnknownTaskError(f"agentgym env {self.env_name!r} has no split {split!r}; valid: {', '.join(splits)}")
        return splits[split]

    # -- episodes ------------------------------------------------------------------------
    def reset(self, task_id: int) -> Observation:
        splits = self._split_ids()
        if not any(task_id in ids for ids in splits.values()):
            ranges = ", ".join(f"{n} {_describe_ids(ids)}" for n, ids in splits.items())
            raise UnknownTaskError(f"agentgym env {self.env_name!r}: unknown task id {task_id!r}; valid: {ranges}")
        with self._lock:
            self._started = self._done = False
            self._close_orphans()
            if self._env_id is not None and not self._reusable():
                self._close_id()  # a foreign server's id lives one episode
            try:
                answer = self._reset_on_server(task_id)
                observation, instruction, info = self._parse_reset(answer)
                self._check_route()
            except ServerFailure:
                self._drop_id()  # the server may have lost it: the next reset makes a new one
                raise
            self._check_claim("POST /reset")
            self._started = True
            return Observation(observation, instruction, {"task_id": task_id, **info})

    def _reusable(self) -> bool:
        """Whether the env id may play another episode: an omrl server refuses ids of another
        instance (410), so its ids are safe to keep; a foreign server's only with ``reuse_ids``."""
        return self._instance is not None or self._reuse_ids

    def _reset_on_server(self, task_id: int) -> Any:
        body = {self._spec.task_field: task_id, **self._spec.reset_fields}
        if self._env_id is not None:
            try:
                self._check_env_is_ours("POST /reset")  # a kept foreign id: still this client's env?
                return self._call_with_id("POST", "/reset", body)
            except ServerFailure:
                raise
            except ServerRefused as exc:  # e.g. a restarted server (410): make a new one
                self._drop_id(gone=exc.status in GONE or exc.unknown_id)
            except EnvError:  # another client's env now: left alone, and a new one made
                self._drop_id(gone=True)
        self._env_id, self._instance = self._create(task_id)
        return self._call_with_id("POST", "/reset", body)

    def _create(self, task_id: int) -> tuple[int, str | None]:
        """A new env id, and the omrl server instance that handed it out (None: a foreign server)."""
        route = self._route("/create")
        seen = self._ledger.before_create()
        answer = self._server.call("POST", route, body=create_body(self._spec, task_id))
        try:
            env_id, instance, self._deterministic = read_create(self._spec, answer)
        except MALFORMED as exc:
            raise ServerFailure(self._server.message(f"POST {route}", str(exc))) from exc
        if instance is None and not (self._spec.observation_route or self._spec.random_ids or self._accept_risk):
            if self._has_close:
                try:
                    self._close_on_server(env_id, None)
                except EnvError:
                    pass
            raise self._shared_risk(
                f"the server at {self._server.base_url} (env_name {self.env_name!r}) answered its create with "
                "no instance name and has no route that shows an env's latest observation"
            )
        if instance is None:  # an omrl server's instance name guards its ids; a foreign server's, the ledger
            self._claim = self._ledger.claim(env_id, seen, counts_up=not self._reuse_ids)
        if instance is not None and not self._self_describing and not self._omrl_answers:
            self._spec, self._omrl_answers = as_omrl_server(self._spec), True  # e.g. `omrl env serve webshop`
            self._has_expert = True
        return env_id, instance

    def _parse_reset(self, answer: Any) -> tuple[str, str, dict[str, Any]]:
        echoed = answer.get(self._id_key) if isinstance(answer, dict) else None
        if type(echoed) is int and echoed != self._env_id:  # TextCraft's and omrl's answers name the id
            raise ServerFailure(
                self._server.message(
                    f"POST {self._route('/reset')}",
                    f"the answer is about env id {echoed}, not {self._env_id}: another client's env",
                )
            )
        try:
            parts = read_reset(self._spec, answer)
        except MALFORMED as exc:
            problem = f"malformed answer ({type(exc).__name__}: {exc})"
            if not isinstance(exc, MalformedAnswer):
                problem += f": {snippet(json.dumps(answer))}"
            raise ServerFailure(self._server.message(f"POST {self._route('/reset')}", problem)) from exc
        self._actions, self._score = parts.actions, parts.score or 0.0
        observation = parts.observation
        if self._spec.observe_after_reset or observation is None:
            observation = self._call_with_id("GET", "/observation")
        self._seen = self._first_seen = as_text(observation)
        instruction = parts.instruction
        if self._spec.instruction_route and not instruction:
            instruction = str(self._call_with_id("GET", self._spec.instruction_route))
        return as_text(observation), instruction, parts.info

    def step(self, action: str) -> StepResult:
        with self._lock:
            if self._started and self._done:  # (a foreign server's finished env is closed already)
                raise EpisodeFinishedError(f"agentgym env {self.env_name!r}: the episode is over; reset first")
            if not self._started or self._env_id is None:
                raise EnvError(f"agentgym env {self.env_name!r}: call reset(task_id) before step")
            env_id = self._env_id
            try:  # checked before each attempt: the env may have become another client's
                answer = self._call_with_id("POST", "/step", {"action": action}, resend_safe=False, checked=True)
                result = self._parse_step(answer)
            except ServerRefused as exc:
                if exc.status not in GONE and not exc.unknown_id:
                    raise
                self._drop_id(gone=True)  # never closed: the number may be another client's env by then
                raise ServerRefused(
                    f"{exc} (the server no longer knows env id {env_id}: it restarted, or another client closed it)",
                    exc.status,
                ) from exc
            except ServerFailure:
                self._drop_id()
                raise
            self._check_claim("POST /step")  # a restart seen while the step was away: the answer may be another's
            self._done = result.done
            if result.done and not self._reusable():
                self._close_finished(env_id)
            return result

    def _close_finished(self, env_id: int) -> None:
        """Close a finished episode's env on a server whose ids live one episode.

        A refused close means the server no longer knew the env (it restarted, or another client
        closed it), so another client may have played it too: the episode is not trusted.
        """
        self._forget_id()
        if not self._has_close:
            return
        try:
            self._close_on_server(env_id, None)
        except ServerRefused as exc:
            if exc.status in (404, 405) and not exc.error_body:  # no such route, not an unknown id
                self._has_close = False
                return
            raise EnvError(
                f"agentgym env {self.env_name!r}: the episode ended, but closing env id {env_id} "
                f"was refused ({exc}): the server no longer knew it, so another client may have "
                "shared this env (a server restart?); its result is not trusted"
            ) from exc
        except ServerFailure:
            pass  # the server went away after its answer: the answer itself stands

    def _parse_step(self, answer: Any) -> StepResult:
        try:
            parts = read_step(self._spec, answer, self._score)
        except MALFORMED as exc:
            problem = f"malformed answer ({type(exc).__name__}: {exc}): {snippet(json.dumps(answer))}"
            raise ServerFailure(self._server.message(f"POST {self._route('/step')}", problem)) from exc
        self._score, self._actions, self._seen = parts.score, parts.actions, parts.observation
        return StepResult(
            parts.observation, parts.reward, parts.done, {**parts.info, "won": parts.won, "score": parts.score}
        )

    def admissible_actions(self) -> list[str] | None:
        with self._lock:
            if self._actions is not None or not self._spec.actions_route or self._env_id is None:
                return None if self._actions is None else list(self._actions)
            answer = self._call_with_id("GET", self._spec.actions_route)
        if isinstance(answer, dict) and "clickables" in answer:  # WebShop
            search = ["search[<keywords>]"] if answer.get("has_search_bar") else []
            return search + [f"click[{c}]" for c in answer["clickables"]]
        return [str(a) for a in answer] if isinstance(answer, list) else None

    def expert_action(self) -> str | None:
        with self._lock:
            if not self._has_expert or self._env_id is None or not self._started:
                return None
            try:
                answer = self._call_with_id("GET", self._spec.expert_route)
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
            if self._env_id is not None and not self._reusable():
                self._close_id()
            self._started = False

    def close(self) -> None:
        with self._lock:
            self._close_orphans()
            self._close_id()
            self._started = False
            self._server.close()

    # -- env ids -------------------------------------------------------------------------
    def _check_claim(self, what: str) -> None:
        """EnvError when another client may now share this episode's env (the ledger saw the server
        hand its id out again); the id is forgotten unclosed, since closing it would end that client's env."""
        if self._claim is None or not self._claim.lost:
            return
        env_id, why = self._env_id, self._claim.lost
        self._drop_id(gone=True)
        raise EnvError(
            self._server.message(
                what, f"env id {env_id} may now be another client's env ({why}); this episode is not trusted"
            )
        )

    def _check_env_is_ours(self, what: str) -> None:
        """Before a call that acts on the env id (a step, a close, the reset of a kept id): EnvError
        when another client may now share the env. The ledger says what this process saw; on a
        foreign server with an observation route the env itself says the rest: its latest
        observation there must be the last one the server answered this client, else a create,
        reset or step of another client reached it since (a restart that only another process saw
        hands this id to that process's next env). The id is then forgotten unclosed."""
        self._check_claim(what)
        if not self._checks or self._instance is not None or self._seen is None or self._env_id is None:
            return
        env_id, route = self._env_id, self._route(self._spec.observation_route or "")
        try:
            answer = self._server.call("GET", route, params={self._id_key: env_id}, json_answer=False)
        except ServerRefused as exc:
            self._drop_id(gone=True)  # never closed: the number may be another client's env by then
            raise ServerRefused(
                self._server.message(
                    what, f"not sent: checking env id {env_id} first was refused ({self._detail(exc)})"
                ),
                exc.status,
                error_body=exc.error_body,
                unknown_id=exc.unknown_id,
            ) from exc
        now = observed(answer)
        if not same_env(self._spec, now, self._seen, self._first_seen):
            seen = self._seen
            self._drop_id(gone=True)
            raise EnvError(
                self._server.message(
                    what,
                    f"not sent: env id {env_id} may now be another client's env: its observation on the server "
                    f"is {snippet(now)}, not {snippet(seen)}, the last one the server answered this client (a "
                    "restart that only another process saw hands the id to that process's next env); this "
                    "episode is not trusted",
                )
            )

    def _check_route(self) -> None:
        """After a reset on a foreign server whose env ids are checked: its observation route must
        answer the observation the reset just answered, or the check could not tell another client's
        env from this one. A server without the route, or whose route answers something else, is
        refused unless ``accept_shared_server_risk`` (then this client plays unchecked)."""
        if not self._checks or self._instance is not None or self._env_id is None or self._seen is None:
            return
        route = self._route(self._spec.observation_route or "")
        try:
            answer = self._server.call("GET", route, params={self._id_key: self._env_id}, json_answer=False)
        except ServerRefused as exc:
            if exc.error_body:  # the server's own error about the env: gone already, or another's
                self._drop_id(gone=True)
                raise
            problem = str(exc)  # no such route (a 404, 405 or 422 without an error body)
        else:
            if same_env(self._spec, observed(answer), self._seen, self._first_seen):
                return
            problem = self._server.message(
                f"GET {route}",
                f"answered {snippet(observed(answer))}, not the observation the reset had just answered "
                f"({snippet(self._seen)})",
            )
        if self._accept_risk:
            self._checks = False  # played unchecked, as accepted
            return
        self._close_id(check=False)
        raise self._shared_risk(f"{problem}: this server's env ids cannot be checked")

    def _detail(self, exc: EnvError) -> str:
        """``exc``'s message without the server's name (for a message that names it already)."""
        return str(exc).removeprefix(f"agentgym server {self._server.base_url}: ")

    def _shared_risk(self, why: str) -> ConfigError:
        """The refusal of a foreign server whose env ids cannot be checked, saying why and what to do."""
        return ConfigError(
            f"agentgym env {self.env_name!r}: {why}. A restarted AgentGym server numbers its env ids from "
            "0 again: when only another process sharing it (another trainer, rank or eval) sees the "
            "restart, that process's next env gets this client's id, and this client would play, score "
            "and train on it. Give each process its own server, or set "
            "plugins.agentgym.accept_shared_server_risk: true to play it anyway"
        )

    def _forget_id(self) -> None:
        """No env id any more (and no hold on it in the ledger)."""
        if self._claim is not None:
            self._ledger.release(self._claim)
        self._env_id, self._instance, self._claim = None, None, None
        self._seen, self._first_seen = None, ""

    def _drop_id(self, gone: bool = False) -> None:
        """Forget the env id after a failure; an omrl server's id that may live on is kept for
        closing later (its instance name makes that safe even after a restart)."""
        if self._env_id is not None and not gone and self._instance is not None and self._has_close:
            self._orphans = [*self._orphans, (self._env_id, self._instance)][-MAX_ORPHANS:]
        self._forget_id()
        self._started = False

    def _close_id(self, check: bool = True) -> None:
        """Close the env id, best effort: the server may be gone, and it frees ids on restart. An id
        that may be another client's env now (the ledger saw it handed out again, or, for an unfinished
        episode, the env's observation on the server is not this client's last) is not closed."""
        if check and self._env_id is not None and self._has_close and not self._done:
            try:
                self._check_env_is_ours(f"POST {self._route('/close')}")
            except EnvError:
                self._forget_id()  # (forgotten already, unless the server could not be reached)
                return
        env_id, instance, lost = self._env_id, self._instance, self._claim is not None and self._claim.lost
        self._forget_id()
        if env_id is not None and self._has_close and not lost:
            try:
                self._close_on_server(env_id, instance)
            except EnvError:
                pass

    def _close_orphans(self) -> None:
        orphans, self._orphans = self._orphans, []
        for env_id, instance in orphans:
            try:
                self._close_on_server(env_id, instance)
            except EnvError:
                pass  # gone already, or the server is down: a restart frees it

    def _close_on_server(self, env_id: int, instance: str | None) -> None:
        """``POST /close`` for ``env_id``, tried once; refusals and failures raise EnvError.

        Any answer but an error is a success: servers answer a bool, an object or (WebArena) text.
        """
        headers = {INSTANCE_HEADER: instance} if instance else None
        self._server.call(
            "POST", self._route("/close"), body={self._id_key: env_id}, headers=headers, retry=False, json_answer=False
        )

    # -- plumbing ------------------------------------------------------------------------
    def _route(self, path: str) -> str:
        return self._spec.route_prefix + path

    def _call_with_id(self, method: str, path: str, body: dict | None = None, checked: bool = False, **kw: Any) -> Any:
        """A call about this instance's env id (in the body for POST, the query for GET), naming the
        omrl server instance that handed it out, so a restarted server refuses it. Before each
        attempt the ledger is asked whether the id may be another client's now; ``checked``: the env
        itself too (:meth:`_check_env_is_ours`), for calls that act on it."""
        headers = {INSTANCE_HEADER: self._instance} if self._instance else None
        what = f"{method} {self._route(path)}"
        if checked:
            check = lambda: self._check_env_is_ours(what)  # noqa: E731
        else:
            check = None if self._claim is None else lambda: self._check_claim(what)
        if method == "GET":
            return self._server.call(
                method, self._route(path), params={self._id_key: self._env_id}, headers=headers, before_send=check, **kw
            )
        return self._server.call(
            method,
            self._route(path),
            body={self._id_key: self._env_id, **(body or {})},
            headers=headers,
            before_send=check,
            **kw,
        )


def _request_headers(token: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """The headers of every call: ``headers`` plus the bearer token (option, else OMRL_SERVE_TOKEN)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigError(f"plugins.agentgym.token must be a non-empty string, got {type(token).__name__}")
    if headers is not None and not (
        isinstance(headers, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise ConfigError(f"plugins.agentgym.headers must map header names to strings, got {headers!r}")
    return {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}


def _task_ids_of(answer: Any) -> Sequence[int] | None:
    """The ids in an omrl server's ``{"range": [start, stop, step]}`` or ``{"task_ids": [...]}``."""
    if not isinstance(answer, dict):
        return None
    bounds, ids = answer.get("range"), answer.get("task_ids")
    if isinstance(bounds, list) and len(bounds) == 3 and all(type(b) is int for b in bounds) and bounds[2]:
        return range(*bounds)
    return ids if isinstance(ids, list) and all(type(i) is int for i in ids) else None


def _describe_ids(ids: Sequence[int]) -> str:
    if isinstance(ids, range):
        step = f" step {ids.step}" if ids.step != 1 else ""
        return f"{ids.start}..{ids[-1]}{step}" if len(ids) else "(empty)"
    return f"({len(ids)} ids)"


@hookimpl
def register_envs(register):
    register("agentgym", AgentGymEnv)
