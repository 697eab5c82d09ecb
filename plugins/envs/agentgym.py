"""``agentgym``: play an env that runs on an AgentGym-style HTTP server (or ``omrl env serve``).

Options (config block ``plugins.agentgym``):

- ``base_url``: the server, e.g. ``http://127.0.0.1:36001``.
- ``env_name``: which server it is: textcraft, babyai, sciworld, alfworld, maze, wordle,
  webshop, sqlgym, or any other name for an ``omrl env serve`` server (generic: it lists its
  own tasks and says ``won``/``score`` itself).
- ``dialect`` (``id`` or ``env_idx``), ``task_field`` (the reset field that picks the task:
  data_idx, game, seed, item_id, session_id...) and ``reset_fields`` (extra reset fields, e.g.
  ALFWorld's ``world_type``) override what ``env_name`` implies.
- ``splits``: AgentGym servers do not list their tasks, so each known env has default splits
  (below); ``{test: 100, train: 444}`` lays counts out from id 0 in that order, and
  ``{test: [0, 100], train: [100, 544, 2]}`` gives explicit ranges (start, stop[, step]).
- ``timeout`` (seconds per HTTP call), ``retries`` and ``backoff``: connection errors and HTTP 5xx
  are retried after ``backoff * 2**k`` seconds; a server that stays down fails after
  ``retries + 1`` attempts, so no call hangs longer than about
  ``(retries + 1) * timeout + backoff * (2**retries - 1)`` seconds.

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
  won = reward 1.0. sqlgym, searchqa...: no default, set ``splits``.
- any other name (an ``omrl env serve`` server): splits from ``GET /tasks``; won and score as
  the server sends them.

The step ``reward`` is the server's reward, or the change in score for envs that report a
running score (babyai, sciworld); the score is the running sum (clipped) of rewards otherwise.

Errors: AgentGym servers answer failures with HTTP 200 and ``{"error": ...}``; that, a 4xx, or a
body that is not JSON or lacks a key becomes an :class:`~omrl.envs.EnvError` naming the server,
the call and the message. A step whose server died raises EnvError (the rollout marks the
episode ``env_error`` instead of scoring it 0) and the next ``reset`` creates a new env id.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from omrl.envs import DemoTurn, Env, EnvError, EpisodeFinishedError, Observation, StepResult, UnknownTaskError
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.agentgym_http import HttpTransport, ServerFailure, ServerRefused, snippet

DIALECTS = ("id", "env_idx")


@dataclass(frozen=True)
class ServerSpec:
    """How one kind of AgentGym server speaks (options override any of it)."""

    dialect: str = "id"
    task_field: str = "data_idx"
    #: split -> (start, stop[, step]); None: the server lists them (GET /tasks, omrl servers)
    splits: dict[str, tuple[int, ...]] | None = None
    route_prefix: str = ""
    reset_fields: dict[str, Any] = field(default_factory=dict)
    score_field: str | None = None  # a step field holding the running score (else: sum rewards)
    score_scale: float = 1.0
    win_score: float = 1.0
    has_close: bool = True
    actions_route: str | None = None  # a GET route with the admissible actions (WebShop)
    instruction_route: str | None = None
    expert_route: str | None = None  # omrl servers: GET /expert_action
    action_help: str = Env.action_help
    max_turns: int = Env.max_turns


KNOWN_SERVERS: dict[str, ServerSpec] = {
    "textcraft": ServerSpec(
        splits={"test": (0, 100), "train": (100, 544)}, max_turns=20,
        action_help="One command per turn: get [count] [item], craft [count] [target] using "
                    "[count] [ingredient], ..., or inventory."),
    "babyai": ServerSpec(
        splits={"test": (0, 400), "train": (400, 4400)}, score_field="score", win_score=0.5,
        max_turns=20,
        action_help="One action per turn: turn left, turn right, move forward, go to <object>, "
                    "pick up <object>, go through <door>, toggle and go through <door>, toggle."),
    "sciworld": ServerSpec(
        splits={"test": (0, 4639, 10), "train": (1, 4639, 2)}, score_field="score",
        score_scale=100.0, max_turns=30,
        action_help="One command per turn, e.g. look around, go to LOC, open OBJ, pick up OBJ, "
                    "move OBJ to OBJ, use OBJ on OBJ, focus on OBJ, wait."),
    "alfworld": ServerSpec(
        task_field="game", splits={"train": (0, 2420), "test": (2420, 2620)},
        reset_fields={"world_type": "Text"}, has_close=False, max_turns=30,
        action_help="One command per turn, e.g. go to LOC, take OBJ from RECEP, put OBJ in/on "
                    "RECEP, open RECEP, heat/cool/clean OBJ with RECEP, use OBJ, look."),
    "maze": ServerSpec(
        task_field="game", route_prefix="/maze", splits={"train": (0, 26), "test": (0, 26)},
        has_close=False, action_help='One move per turn: "move up", "move down", "move left" or "move right".'),
    "wordle": ServerSpec(
        task_field="seed", route_prefix="/wordle", splits={"test": (0, 200), "train": (200, 10200)},
        has_close=False, max_turns=6,
        action_help='Guess a 5-letter word from the vocabulary as spaced letters, e.g. "s h i r e".'),
    "webshop": ServerSpec(
        dialect="env_idx", task_field="session_id", splits={"test": (0, 500), "train": (1500, 12087)},
        has_close=False, actions_route="/available_actions", instruction_route="/instruction_text",
        action_help="search[keywords] (where there is a search bar) or click[value] with a "
                    "clickable from the page."),
    "sqlgym": ServerSpec(dialect="env_idx", task_field="item_id", has_close=False, max_turns=5,
                         action_help="One SQLite statement per turn, on one line."),
}
#: any other name: an `omrl env serve` server (or a compatible one) that describes itself
GENERIC_SERVER = ServerSpec(expert_route="/expert_action")


def parse_splits(splits: Any, where: str = "plugins.agentgym.splits") -> dict[str, range]:
    """``{test: 100, train: 444}`` (counts from 0, in order) or ``{test: [0, 100]}`` -> ranges."""
    if not isinstance(splits, dict) or not splits:
        raise ConfigError(f"{where} must map split names to a count or [start, stop(, step)], got {splits!r}")
    out, next_start = {}, 0
    for name, value in splits.items():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[str(name)] = range(next_start, next_start + value)
        elif (isinstance(value, (list, tuple)) and len(value) in (2, 3) and list(value[2:]) != [0]
              and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            out[str(name)] = range(*value)
        else:
            raise ConfigError(f"{where}.{name} must be a task count or [start, stop(, step)] of "
                              f"integers, got {value!r}")
        next_start = out[str(name)].stop
    return out


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))


class AgentGymEnv(Env):
    """Play an env served over HTTP by an AgentGym server or `omrl env serve`."""

    io_bound = True

    def __init__(self, base_url: str = "http://127.0.0.1:8000", env_name: str = "textcraft",
                 dialect: str | None = None, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5, splits: dict[str, Any] | None = None,
                 task_field: str | None = None, reset_fields: dict[str, Any] | None = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"plugins.agentgym.base_url must be an http(s) URL, got {base_url!r}")
        if dialect is not None and dialect not in DIALECTS:
            raise ConfigError(f"plugins.agentgym.dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
        for name, value, low, kinds in (("timeout", timeout, 1e-3, (int, float)), ("retries", retries, 0, int),
                                        ("backoff", backoff, 0, (int, float))):
            if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
                raise ConfigError(f"plugins.agentgym.{name} must be a number >= {low}, got {value!r}")
        if not isinstance(env_name, str) or not env_name:
            raise ConfigError(f"plugins.agentgym.env_name must name the server's env (e.g. textcraft), "
                              f"got {env_name!r}")
        self.env_name = env_name
        spec = KNOWN_SERVERS.get(env_name.lower(), GENERIC_SERVER)
        self._self_describing = spec is GENERIC_SERVER
        self._spec = dataclasses.replace(
            spec, dialect=dialect or spec.dialect, task_field=task_field or spec.task_field,
            reset_fields={**spec.reset_fields, **(reset_fields or {})})
        chosen = splits if splits is not None else spec.splits
        self._splits = parse_splits(chosen) if chosen is not None else None
        self._id_key = "id" if self._spec.dialect == "id" else "env_idx"
        self._server = HttpTransport(base_url, float(timeout), retries, float(backoff))
        self._description: dict[str, Any] | None = None
        self._lock = threading.Lock()  # calls on one env id are serialized
        self._env_id: int | None = None
        self._started = False
        self._done = False
        self._score = 0.0
        self._actions: list[str] | None = None
        self._has_expert = self._spec.expert_route is not None

    # -- what the server is --------------------------------------------------------------
    def _described(self) -> dict[str, Any]:
        """An omrl server's self-description (GET /tasks): splits, action help, turn cap."""
        if self._description is None:
            try:
                answer = self._server.call("GET", self._route("/tasks"))
            except ServerRefused as exc:
                raise ConfigError(
                    f"the server at {self._server.base_url} does not list its tasks ({exc}) and env_name "
                    f"{self.env_name!r} has no default splits; set plugins.agentgym.splits, e.g. "
                    "{test: [0, 100]}") from exc
            if not isinstance(answer, dict) or not isinstance(answer.get("splits"), dict):
                raise ServerFailure(self._server.message("GET /tasks", f"expected {{'splits': ...}}, got "
                                                                        f"{snippet(json.dumps(answer))}"))
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
                    raise ServerFailure(self._server.message(f"GET /tasks?split={name}",
                                                             problem + snippet(str(answer))))
                splits[name] = ids
            self._splits = splits
        return self._splits

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
            raise UnknownTaskError(f"agentgym env {self.env_name!r} has no split {split!r}; "
                                   f"valid: {', '.join(splits)}")
        return splits[split]

    # -- episodes ------------------------------------------------------------------------
    def reset(self, task_id: int) -> Observation:
        splits = self._split_ids()
        if not any(task_id in ids for ids in splits.values()):
            ranges = ", ".join(f"{n} {_describe_ids(ids)}" for n, ids in splits.items())
            raise UnknownTaskError(f"agentgym env {self.env_name!r}: unknown task id {task_id!r}; valid: {ranges}")
        body = {self._spec.task_field: task_id, **self._spec.reset_fields}
        with self._lock:
            self._started = self._done = False
            try:
                answer = self._reset_on_server(body)
                observation, instruction, info = self._parse_reset(answer)
            except ServerFailure:
                self._env_id = None  # the server may have lost it: the next reset makes a new one
                raise
            self._started, self._score = True, 0.0
            return Observation(observation, instruction, {"task_id": task_id, **info})

    def _reset_on_server(self, body: dict[str, Any]) -> Any:
        if self._env_id is not None:
            try:
                return self._call_with_id("POST", "/reset", body)
            except ServerRefused:
                pass  # e.g. a restarted server that no longer knows this id: make a new one
        self._env_id = None
        self._env_id = self._create()
        return self._call_with_id("POST", "/reset", body)

    def _create(self) -> int:
        answer = self._server.call("POST", self._route("/create"))
        if isinstance(answer, dict):
            answer = next((answer[k] for k in (self._id_key, "id", "env_idx") if k in answer), None)
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise ServerFailure(self._server.message(f"POST {self._route('/create')}",
                                                     f"expected an env id, got {answer!r}"))
        return answer

    def _parse_reset(self, answer: Any) -> tuple[str, str, dict[str, Any]]:
        info: dict[str, Any] = {}
        if isinstance(answer, list) and answer:  # WebShop: [observation, null]
            answer = answer[0]
        if isinstance(answer, dict):
            observation = answer.get("observation", answer.get("state"))
            instruction = next((str(answer[k]) for k in ("instruction", "task_description", "goal")
                                if answer.get(k)), "")
            self._actions = _action_list(answer.get("available_actions"))
            info = {k: v for k, v in answer.items() if k not in (
                "observation", "state", "instruction", "task_description", "available_actions", "id", "env_idx")}
        else:
            observation, instruction, self._actions = answer, "", None
        if observation is None:  # SQLGym-style resets answer nothing: ask for the observation
            observation = self._call_with_id("GET", "/observation")
        if self._spec.instruction_route and not instruction:
            instruction = str(self._call_with_id("GET", self._spec.instruction_route))
        return _as_text(observation), instruction, info

    def step(self, action: str) -> StepResult:
        with self._lock:
            if not self._started or self._env_id is None:
                raise EnvError(f"agentgym env {self.env_name!r}: call reset(task_id) before step")
            if self._done:
                raise EpisodeFinishedError(f"agentgym env {self.env_name!r}: the episode is over; reset first")
            try:
                answer = self._call_with_id("POST", "/step", {"action": action}, resend_safe=False)
                result = self._parse_step(answer)
            except ServerFailure:
                self._env_id, self._started = None, False
                raise
            self._done = result.done
            return result

    def _parse_step(self, answer: Any) -> StepResult:
        try:
            observation = answer["observation"] if "observation" in answer else answer["state"]
            done = bool(answer["done"])
            if "won" in answer and "score" in answer:  # omrl servers say it themselves
                reward, score = float(answer["reward"]), float(answer["score"])
                won = bool(answer["won"])
            else:
                if self._spec.score_field:
                    score = _clip(float(answer[self._spec.score_field]) / self._spec.score_scale)
                    reward = score - self._score
                else:
                    reward = float(answer["reward"])
                    score = _clip(self._score + reward)
                won = done and score >= self._spec.win_score
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"malformed answer ({type(exc).__name__}: {exc}): {snippet(json.dumps(answer))}"
            raise ServerFailure(self._server.message(f"POST {self._route('/step')}", problem)) from exc
        self._score = score
        self._actions = _action_list(answer.get("available_actions"))
        server_info = answer.get("info") if isinstance(answer.get("info"), dict) else {}
        return StepResult(_as_text(observation), reward, done, {**server_info, "won": won, "score": score})

    def admissible_actions(self) -> list[str] | None:
        with self._lock:
            if self._actions is not None or not self._spec.actions_route or self._env_id is None:
                return None if self._actions is None else list(self._actions)
            answer = self._call_with_id("GET", self._spec.actions_route)
        if isinstance(answer, dict) and "clickables" in answer:  # WebShop
            search = ["search[<keywords>]"] if answer.get("has_search_bar") else []
            return search + [f"click[{c}]" for c in answer["clickables"]]
        return _action_list(answer)

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

    def close(self) -> None:
        with self._lock:
            if self._env_id is not None and self._spec.has_close:
                try:
                    self._call_with_id("POST", "/close", {}, retry=False)
                except EnvError:
                    pass  # best effort: the server may be gone, and it frees ids on restart
            self._env_id, self._started = None, False
            self._server.close()

    # -- plumbing ------------------------------------------------------------------------
    def _route(self, path: str) -> str:
        return self._spec.route_prefix + path

    def _call_with_id(self, method: str, path: str, body: dict | None = None, **kw: Any) -> Any:
        """A call about this instance's env id (in the body for POST, the query for GET)."""
        if method == "GET":
            return self._server.call(method, self._route(path), params={self._id_key: self._env_id}, **kw)
        return self._server.call(method, self._route(path), body={self._id_key: self._env_id, **(body or {})}, **kw)


def _task_ids_of(answer: Any) -> Sequence[int] | None:
    """The ids in an omrl server's ``{"range": [start, stop, step]}`` or ``{"task_ids": [...]}``."""
    if not isinstance(answer, dict):
        return None
    bounds, ids = answer.get("range"), answer.get("task_ids")
    if isinstance(bounds, list) and len(bounds) == 3 and all(type(b) is int for b in bounds) and bounds[2]:
        return range(*bounds)
    return ids if isinstance(ids, list) and all(type(i) is int for i in ids) else None


def _action_list(value: Any) -> list[str] | None:
    return [str(a) for a in value] if isinstance(value, list) else None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _describe_ids(ids: Sequence[int]) -> str:
    if isinstance(ids, range):
        step = f" step {ids.step}" if ids.step != 1 else ""
        return f"{ids.start}..{ids[-1]}{step}" if len(ids) else "(empty)"
    return f"({len(ids)} ids)"


@hookimpl
def register_envs(register):
    register("agentgym", AgentGymEnv)
