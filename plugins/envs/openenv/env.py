"""``openenv``: play an env served by an OpenEnv server (PyPI ``openenv-core``), one session per instance.

Install with ``pip install 'omrl[openenv]'``. An OpenEnv server keeps an episode only inside a
WebSocket session, and holds at most ``max_concurrent_envs`` of them; each omrl env instance opens
a session of its own at its first reset and plays every later episode on it, so the rollout's
parallel episodes run side by side on their own server-side envs (see
:mod:`omrl_plugins.envs.openenv.session` for how sessions are spread over servers).

Options (config block ``plugins.openenv``):

- ``base_url``: the server (``http://127.0.0.1:8000``; ``ws://`` works too), or a list of servers
  serving the same env: new sessions go to the least loaded one with room. List several when the
  env allows one session per server (``SUPPORTS_CONCURRENT_SESSIONS`` unset), or start its server
  with ``max_concurrent_envs`` at least the number of episodes played at once.
- ``max_sessions``: sessions one server takes (its ``max_concurrent_envs``); unset, a server's
  refusal says it. When this process already fills every server, a reset fails at once, naming
  the fix, instead of waiting on episodes that cannot end while it waits.
- ``timeout`` (seconds an answer may take, default 60), ``connect_timeout`` (10), and ``retries``
  (3) / ``backoff`` (0.5): opening a session on a server that is down or full is tried again after
  ``backoff * 2**k`` seconds. A step is never resent (the server may have played it).
- ``task_field`` (``seed``): the reset argument that carries the task id; ``reset_fields``: more
  reset arguments. ``splits``: task ids as in agentgym (``{test: 100, train: 1000}`` counts from 0
  in order, ``{test: [0, 100]}`` gives a range); default test 0..99, train 100..99,999.
- ``action_field``: the field of the server's action model that the reply's text fills. Unset, it
  is the action model's only field (besides ``metadata``), or its only required one, read from
  ``GET /schema``; when there is none, the reply must be the action as a JSON object. The server
  validates (``"7"`` fills an integer field): an action it refuses is an ``invalid`` step that
  names the problem, and the episode goes on.
- ``observation_field``: show only this field of the observation. Unset, an observation with one
  field shows that field; one with several shows a ``field: value`` line each (text as it is,
  other values as JSON, null fields left out). An OpenEnv server sends ``reward`` and ``done``
  beside the observation and drops its ``metadata``, so neither is shown.
- ``instruction`` (text shown above the first observation; OpenEnv has no instruction of its own),
  ``action_help`` (unset: made from the action model's schema), ``max_turns`` (15), and
  ``deterministic`` (false; true lets tree search fork an episode by replaying its actions, for
  envs whose episode depends on its seed and actions alone).
- ``score`` (``sum`` or ``last``), ``reward_scale`` (1) and ``win_score`` (1): the step ``reward``
  is the server's (null is 0); ``score`` in [0, 1] is the running sum of ``reward / reward_scale``
  (``sum``, for envs that reward progress or success once) or the latest one (``last``, for envs
  whose final reward grades the whole episode), clipped to [0, 1]; ``won`` is ``done`` with
  ``score >= win_score``.

Errors: a server down, a session refused, an error answer from the env, a malformed answer or a
timeout is an :class:`~omrl.envs.EnvError` naming the server and the call (the rollout marks that
episode ``env_error``); a lost session is closed, and the next reset opens another.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.envs import Env, EnvError, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError, short_repr
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.agentgym import parse_splits
from omrl_plugins.envs.engines.common import check_running, clip01, require
from omrl_plugins.envs.openenv.servers import check_servers, server_urls
from omrl_plugins.envs.openenv.session import (
    ServerAnswer,
    Session,
    SessionLost,
    Settings,
    describe,
    message,
    open_session,
)

SPLITS = {"test": [0, 100], "train": [100, 100_000]}
SCORES = ("sum", "last")


@dataclass(frozen=True)
class ActionSpec:
    """How a reply becomes the server's action: the one field its text fills (None: the reply is the
    whole action as a JSON object), and the help text shown to the model."""

    field: str | None
    help: str


class OpenEnvEnv(Env):
    """Play an env on an OpenEnv server (openenv-core), a WebSocket session per instance."""

    io_bound = True
    package = "openenv-core"
    extra = "openenv"

    def __init__(
        self,
        base_url: str | list[str] = "http://127.0.0.1:8000",
        max_sessions: int | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        task_field: str = "seed",
        reset_fields: dict[str, Any] | None = None,
        splits: dict[str, Any] | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        instruction: str = "",
        action_help: str | None = None,
        max_turns: int = Env.max_turns,
        deterministic: bool = False,
        score: str = "sum",
        reward_scale: float = 1.0,
        win_score: float = 1.0,
    ):
        require("openenv.core.generic_client", "openenv", "openenv")  # a missing extra says so at once
        self.urls = server_urls(base_url)
        for name, value, low, kinds in (
            ("timeout", timeout, 1e-3, (int, float)),
            ("connect_timeout", connect_timeout, 1e-3, (int, float)),
            ("retries", retries, 0, int),
            ("backoff", backoff, 0, (int, float)),
            ("max_turns", max_turns, 1, int),
            ("reward_scale", reward_scale, 1e-9, (int, float)),
            ("max_sessions", 1 if max_sessions is None else max_sessions, 1, int),
        ):
            if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
                raise ConfigError(f"plugins.openenv.{name} must be a number >= {low:g}, got {value!r}")
        if isinstance(win_score, bool) or not isinstance(win_score, (int, float)) or not 0 < win_score <= 1:
            raise ConfigError(f"plugins.openenv.win_score must be a number in (0, 1], got {win_score!r}")
        if score not in SCORES:
            raise ConfigError(f"plugins.openenv.score must be one of {', '.join(SCORES)}, got {score!r}")
        for name, value in (
            ("task_field", task_field),
            ("action_field", action_field),
            ("observation_field", observation_field),
            ("action_help", action_help),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"plugins.openenv.{name} must be a non-empty string, got {value!r}")
        if not isinstance(instruction, str):
            raise ConfigError(f"plugins.openenv.instruction must be text, got {instruction!r}")
        if reset_fields is not None and not (
            isinstance(reset_fields, dict) and all(isinstance(k, str) for k in reset_fields)
        ):
            raise ConfigError(
                f"plugins.openenv.reset_fields must map reset argument names to values, got {reset_fields!r}"
            )
        if not isinstance(deterministic, bool):
            raise ConfigError(f"plugins.openenv.deterministic must be true or false, got {deterministic!r}")
        self._settings = Settings(float(timeout), float(connect_timeout), retries, float(backoff), max_sessions)
        self._splits = parse_splits(SPLITS if splits is None else splits, "plugins.openenv.splits")
        self._task_field, self._reset_fields = task_field, dict(reset_fields or {})
        self._action_field, self._observation_field = action_field, observation_field
        self._instruction, self._action_help, self._max_turns = instruction, action_help, max_turns
        self.deterministic = deterministic  # fork_support reads it on the instance
        self._score_mode, self._reward_scale, self._win_score = score, float(reward_scale), float(win_score)
        self._lock = threading.Lock()  # one call on the session at a time
        self._session: Session | None = None
        self._spec: ActionSpec | None = None
        self._running = False
        self._score = 0.0

    # -- what the env is -----------------------------------------------------------------------
    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._splits)

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return self._max_turns

    @property
    def action_help(self) -> str:  # type: ignore[override]
        return self._action_spec().help

    def task_ids(self, split: str) -> Sequence[int]:
        if split not in self._splits:
            raise UnknownTaskError(f"openenv has no split {split!r}; valid: {', '.join(self._splits)}")
        return self._splits[split]

    def _action_spec(self) -> ActionSpec:
        """How replies become actions, from the options or else the server's action schema (read once)."""
        if self._spec is None:
            schema = None if self._action_field and self._action_help else self._action_schema()
            self._spec = action_spec(
                schema, self._action_field, self._action_help, self._session.url if self._session else self.urls[0]
            )
        return self._spec

    def _action_schema(self) -> dict[str, Any]:
        import httpx

        url = self._session.url if self._session else self.urls[0]
        try:
            answer = httpx.get(f"{url}/schema", timeout=self._settings.timeout)
            answer.raise_for_status()
            schema = answer.json()["action"]
            if not isinstance(schema, dict):
                raise TypeError(f"expected an object, got {short_repr(schema)}")
            return schema
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise EnvError(
                message(
                    url,
                    "GET /schema",
                    f"{describe(exc)}; set plugins.openenv.action_field and action_help to play without it",
                )
            ) from exc

    # -- episodes ------------------------------------------------------------------------------
    def reset(self, task_id: int) -> Observation:
        if not any(task_id in ids for ids in self._splits.values()):
            ranges = ", ".join(f"{name} {ids.start}..{ids.stop - 1}" for name, ids in self._splits.items())
            raise UnknownTaskError(f"openenv: unknown task id {task_id!r}; valid: {ranges}")
        kwargs = {**self._reset_fields, self._task_field: task_id}
        with self._lock:
            self._running, self._score, first = False, 0.0, None
            if self._session is not None:
                try:
                    first = self._session.reset(kwargs)
                except SessionLost:
                    self._session = None  # e.g. the server restarted or dropped it idle: open another
            if self._session is None:
                self._session, first = open_session(self.urls, kwargs, self._settings)
            self._action_spec()  # read now, so a missing schema fails this reset, not a prompt
            text = self._render(first.observation)
            self._running = not first.done
            return Observation(text, self._instruction, {"task_id": task_id, "server": self._session.url})

    def step(self, action: str) -> StepResult:
        with self._lock:
            check_running("openenv", self._running)
            session, spec = self._session, self._action_spec()
            assert session is not None  # a running episode has its session
            payload, problem = to_action(action, spec.field)
            if payload is None:
                return self._invalid(problem)
            try:
                result = session.step(payload)
            except ServerAnswer as refused:  # the action model's validation: the episode goes on
                return self._invalid(f"the env refused it: {validation_detail(refused.data)}")
            except EnvError as exc:
                self._running = False
                if isinstance(exc, SessionLost):
                    self._session = None
                raise
            reward = 0.0 if result.reward is None else float(result.reward)
            scaled = reward / self._reward_scale
            self._score = clip01(self._score + scaled if self._score_mode == "sum" else scaled)
            self._running = not result.done
            won = bool(result.done) and self._score >= self._win_score
            return StepResult(
                self._render(result.observation), reward, bool(result.done), {"won": won, "score": self._score}
            )

    def _invalid(self, problem: str) -> StepResult:
        return StepResult(
            f"Invalid action: {problem}\n{self.action_help}",
            0.0,
            False,
            {"won": False, "score": self._score, "invalid": True},
        )

    def _render(self, observation: dict[str, Any]) -> str:
        try:
            return render_observation(observation, self._observation_field)
        except KeyError as exc:  # observation_field names a field this env lacks
            self._running = False
            raise ConfigError(str(exc.args[0])) from exc

    def check_reachable(self) -> None:
        check_servers(self.urls, self._settings.connect_timeout)

    def close(self) -> None:
        with self._lock:
            session, self._session, self._running = self._session, None, False
        if session is not None:
            session.close()


# -- pieces, each testable alone ---------------------------------------------------------------
def render_observation(observation: dict[str, Any], field: str | None = None) -> str:
    """An OpenEnv observation (its fields, without reward/done/metadata) as text.

    ``field``: that field alone. Else one field shows as its value; several as ``field: value``
    lines, null fields left out. Text shows as it is, other values as compact JSON.
    """
    if field is not None:
        if field not in observation:
            raise KeyError(
                f"the observation has no field {field!r} (plugins.openenv.observation_field); "
                f"its fields: {', '.join(observation) or '(none)'}"
            )
        return _text(observation[field])
    if len(observation) == 1:
        return _text(next(iter(observation.values())))
    return "\n".join(f"{key}: {_text(value)}" for key, value in observation.items() if value is not None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def action_spec(schema: dict[str, Any] | None, field: str | None, help_text: str | None, url: str) -> ActionSpec:
    """How replies fill the action model whose JSON schema is ``schema`` (None: the options say it all)."""
    if schema is None:
        assert field is not None and help_text is not None
        return ActionSpec(field, help_text)
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    required = [k for k in schema.get("required") or () if k in properties]
    if field is not None and field not in properties:
        raise ConfigError(
            f"plugins.openenv.action_field is {field!r}, but the action of the env at {url} has "
            f"no such field; its fields: {', '.join(properties) or '(none)'}"
        )
    if field is None:
        field = next(iter(properties)) if len(properties) == 1 else required[0] if len(required) == 1 else None
    if help_text is None:
        help_text = _help(schema.get("title") or "action", properties, required, field)
    return ActionSpec(field, help_text)


def _help(title: str, properties: dict[str, Any], required: list[str], field: str | None) -> str:
    def about(name: str) -> tuple[str, str]:
        spec = properties[name] if isinstance(properties[name], dict) else {}
        return str(spec.get("type") or "any"), str(spec.get("description") or spec.get("title") or "")

    if field is not None:
        kind, text = about(field)
        return (
            f"Reply with one action: {text} (the {field!r} field of {title}, {kind})."
            if text
            else f"Reply with one action: the {field!r} field of {title} ({kind})."
        )
    fields = "; ".join(
        f"{name} ({kind}{', required' if name in required else ''}){': ' + text if text else ''}"
        for name in properties
        for kind, text in [about(name)]
    )
    return f"Reply with one action as a JSON object, the {title} with fields: {fields or 'none'}."


def to_action(text: str, field: str | None) -> tuple[dict[str, Any] | None, str]:
    """The action payload for reply ``text``, or (None, why not) when a JSON action does not parse."""
    text = text.strip()
    if field is not None:
        return {field: text}, ""
    try:
        action = json.loads(text)
    except ValueError as exc:
        return None, f"the action must be a JSON object ({exc})"
    if not isinstance(action, dict):
        return None, f"the action must be a JSON object, not {type(action).__name__}"
    return action, ""


def validation_detail(data: dict[str, Any]) -> str:
    """A server's VALIDATION_ERROR as one line: ``guess: Input should be a valid integer; ...``."""
    errors = data.get("errors")
    if not isinstance(errors, list) or not errors:
        return str(data.get("message") or "invalid action")
    parts = []
    for error in errors[:5]:
        if isinstance(error, dict):
            where = ".".join(str(p) for p in error.get("loc") or () if p not in ("data",))
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts) or str(data.get("message") or "invalid action")


@hookimpl
def register_envs(register):
    register("openenv", OpenEnvEnv)
