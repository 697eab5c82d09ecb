"""How each AgentGym env server speaks: the ``agentgym`` client's table of request and answer shapes.

Read from the servers' own code (AgentGym's ``agentenv-*`` packages): what ``/create``, ``/reset``,
``/step`` and ``/close`` take and answer, per env. The client builds every body and reads every
answer through a :class:`ServerSpec`, so a known server gets exactly the fields it declares and
an answer missing one of its keys is a malformed answer (an EnvError naming the key), not a
guess. Any name that is not in :data:`KNOWN_SERVERS` is an ``omrl env serve`` server (or one
that speaks like it): :data:`GENERIC_SERVER`, which also takes the looser shapes a custom
AgentGym-style server may answer; so is a known name's server whose ``/create`` answer names an
omrl instance (:func:`as_omrl_server`).

The ``id`` dialect (the env id travels as ``id``):

- textcraft: ``/create`` takes a JSON body (optional ``commands``, ``goal``: ``{}`` is sent; no
  body gets HTTP 422) and answers ``{"id", "observation", "done", "reward"}``; ``/reset``
  ``{"id", "data_idx"}``; ``/close`` ``{"id"}``.
- babyai, sciworld: ``/create`` without a body -> ``{"id"}``; ``/reset`` ``{"id", "data_idx"}``
  answers the running ``score`` too (sciworld adds ``task_name``, ``var_num``,
  ``task_description``); ``/step`` adds ``score``, which these envs' clients take as the reward.
- alfworld: ``/reset`` ``{"id", "game", "world_type"}``; answers carry ``available_actions``; no
  ``/close``.
- maze, wordle (LMRL-Gym, routes under ``/maze`` and ``/wordle``): ``/reset`` ``{"id", "game"}``
  and ``{"id", "seed"}``; no ``/close``.

The ``env_idx`` dialect:

- webshop: ``/create`` -> a bare int (random, and a live one again once 8,000 envs exist);
  ``/reset`` ``{"env_idx", "session_id"}`` -> ``[observation, null]``; ``/step`` -> ``{"state",
  "reward", "done", "info"}``; the instruction from ``GET /instruction_text``; no ``/close``.
- sqlgym: as webshop (a live id again once 8 envs exist), with ``item_id``; the first observation
  from ``GET /observation``.
- searchqa and the tool envs (academia, movie, sheet, todo, weather): ``/create`` takes
  ``{"id": task}`` -> a bare int; ``/reset`` ``{"env_idx", "id"}`` -> the observation string;
  ``/step`` -> ``{"observation", "reward", "done"}``. SearchQA has ``/close``, the tools do not.
- webarena: ``/create`` -> ``{"env_idx"}``; ``/reset`` ``{"env_idx", "seed": 0, "idx"}`` ->
  ``{"observation"}``; ``/step`` -> ``{"observation", "reward", "terminated", "truncated",
  "info"}``; ``/close`` answers the text ``closed``.

Scoring (``score`` in [0, 1], ``won`` on every step): the sum of rewards, clipped, by default
(reward 1 at the goal); the server's running ``score`` for babyai (won at >= 0.5, its own done
rule) and sciworld (/ 100, won at 100); the latest reward for the tool envs, whose reward is a
progress rate that ends as 1 on success.

Checking an env id (:func:`same_env`): textcraft, babyai, sciworld, alfworld, maze and wordle keep
each env's latest observation (set by every create, reset and step) and answer it at ``GET
/observation?id=N`` (BabyAI: an object whose ``observation`` puts the goal line first; a
finished env's is refused by all but TextCraft), so a client can tell that another client has
acted on its env id since its last call. Searchqa, the tool envs and webarena answer something
else there (the task), WebShop and SQLGym draw random ids.

Refused actions: these servers answer an action they did not play as an ordinary step, with the
reason as the observation; the step's ``info["invalid"]`` is true when it begins as a refusal of
its server does (textcraft "Could not ...", babyai "The action is not recognized...", sciworld
"No known action matches...", alfworld "Nothing happens."), so ``invalid_action_rate`` counts
them. An omrl server says ``invalid`` itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from omrl.envs import Env
from omrl_plugins.envs.agentgym.transport import snippet

DIALECTS = ("id", "env_idx")
#: keys of a reset answer that are protocol, not information about the task
RESET_PROTOCOL_KEYS = frozenset(
    {
        "id",
        "env_idx",
        "observation",
        "state",
        "instruction",
        "task_description",
        "available_actions",
        "reward",
        "score",
        "done",
        "deleted",
        "info",
    }
)


class MalformedAnswer(ValueError):
    """An answer without the shape its server's spec gives (the client reports it as a ServerFailure)."""


@dataclass(frozen=True)
class ServerSpec:
    """How one kind of server speaks (options override ``dialect``, ``task_field``, ``reset_fields``, splits)."""

    dialect: str = "id"  # the key naming the env id in every call: "id" or "env_idx"
    task_field: str = "data_idx"  # the reset field that picks the task
    reset_fields: dict[str, Any] = field(default_factory=dict)  # more reset fields (ALFWorld's world_type)
    route_prefix: str = ""  # LMRL-Gym serves maze and wordle under /maze and /wordle
    #: the /create body: "none" (no body), "empty" ({}), "task" ({"id": task id}, SearchQA and tools)
    create_body: str = "none"
    create_keys: tuple[str, ...] = ("id",)  # the keys of a create answer that may hold the env id
    bare_id: bool = False  # the create answer may be the env id itself, a JSON int
    #: what /reset answers: "object" ({observation, ...}), "pair" ([observation, null]), "text";
    #: () when the answer is not read (the first observation comes from GET /observation)
    reset_shapes: tuple[str, ...] = ("object",)
    observe_after_reset: bool = False  # SQLGym: GET /observation holds the first observation
    observation_keys: tuple[str, ...] = ("observation",)  # where an answer holds the observation
    done_keys: tuple[str, ...] = ("done",)  # the episode ends when one of them is true
    instruction_key: str | None = None  # a reset answer's key holding the task text (SciWorld)
    instruction_route: str | None = None  # a GET route answering the task text (WebShop)
    #: split -> (start, stop[, step]); None: the server lists them (GET /tasks, omrl servers)
    splits: dict[str, tuple[int, ...]] | None = None
    score_field: str | None = None  # an answer field holding the running score (else: sum rewards)
    score_scale: float = 1.0
    win_score: float = 1.0
    has_close: bool = True
    #: keep one env id per client across episodes unless ``reuse_ids`` says otherwise: WebShop and
    #: SQLGym have no /close and hand out live ids again once they hold 8,000 and 8 envs, so a new
    #: env per episode would leak until two clients share one (their random ids hardly survive a
    #: restart as another client's id)
    reuse_ids: bool = False
    actions_route: str | None = None  # a GET route with the admissible actions (WebShop)
    #: how the server's step observation begins when it refused the action (played nothing): these
    #: servers answer a refusal as an ordinary step, so ``info["invalid"]`` is read from the text
    refused: tuple[str, ...] = ()
    expert_route: str | None = None  # omrl servers: GET /expert_action
    #: a GET route answering the env's latest observation as the server keeps it (AgentGym's
    #: ``info[id]["observation"]``, set by every create, reset and step): the client checks with it
    #: that its env id still holds the env it left, since a restarted server hands the same ids to
    #: other clients (:func:`same_env`); None: the server has no such route
    observation_route: str | None = None
    observation_goal_line: bool = False  # BabyAI's route puts the episode's goal line before a step's observation
    random_ids: bool = False  # ids drawn at random (WebShop, SQLGym): a restart hardly hands one out again
    action_help: str = Env.action_help
    max_turns: int = Env.max_turns


_TOOL_HELP = (
    'One action per turn: "Action: <tool> with Action Input: <JSON arguments>"; end with '
    '"Action: finish with Action Input: {\\"answer\\": ...}".'
)


def _tool_env(**kw: Any) -> ServerSpec:
    """SearchQA and the tool envs: ``{"id": task}`` creates, ``{"env_idx", "id"}`` resets, text answers."""
    return ServerSpec(
        dialect="env_idx",
        task_field="id",
        create_body="task",
        create_keys=(),
        bare_id=True,
        reset_shapes=("text",),
        **kw,
    )


def _state_env(**kw: Any) -> ServerSpec:
    """WebShop and SQLGym: ``/create`` answers the bare id, ids are reused, the observation is
    ``state``, and there is no ``/close``."""
    return ServerSpec(
        dialect="env_idx",
        create_keys=(),
        bare_id=True,
        observation_keys=("state",),
        has_close=False,
        reuse_ids=True,
        random_ids=True,
        **kw,
    )


KNOWN_SERVERS: dict[str, ServerSpec] = {
    "textcraft": ServerSpec(
        create_body="empty",
        observation_route="/observation",
        splits={"test": (0, 100), "train": (100, 544)},
        max_turns=20,
        refused=("Could not ", "Wrong item format"),  # TextCraftEnv.step's ActionFailed messages
        action_help="One command per turn: get [count] [item], craft [count] [target] using "
        "[count] [ingredient], ..., or inventory.",
    ),
    "babyai": ServerSpec(
        splits={"test": (0, 400), "train": (400, 4400)},
        score_field="score",
        observation_route="/observation",
        observation_goal_line=True,
        win_score=0.5,
        refused=("The action is not recognized", "There is a barrier in front of you"),  # check_action_is_valid
        max_turns=20,
        action_help="One action per turn: turn left, turn right, move forward, go to <object>, "
        "pick up <object>, go through <door>, toggle and go through <door>, toggle.",
    ),
    "sciworld": ServerSpec(
        splits={"test": (0, 4639, 10), "train": (1, 4639, 2)},
        score_field="score",
        observation_route="/observation",
        instruction_key="task_description",
        refused=("No known action matches that input",),  # ScienceWorld's parser
        score_scale=100.0,
        max_turns=30,
        action_help="One command per turn, e.g. look around, go to LOC, open OBJ, pick up OBJ, "
        "move OBJ to OBJ, use OBJ on OBJ, focus on OBJ, wait.",
    ),
    "alfworld": ServerSpec(
        task_field="game",
        splits={"train": (0, 2420), "test": (2420, 2620)},
        refused=("Nothing happens",),
        reset_fields={"world_type": "Text"},
        observation_route="/observation",
        has_close=False,
        max_turns=30,
        action_help="One command per turn, e.g. go to LOC, take OBJ from RECEP, put OBJ in/on "
        "RECEP, open RECEP, heat/cool/clean OBJ with RECEP, use OBJ, look.",
    ),
    "maze": ServerSpec(
        task_field="game",
        route_prefix="/maze",
        observation_route="/observation",
        splits={"train": (0, 26), "test": (0, 26)},
        has_close=False,
        action_help='One move per turn: "move up", "move down", "move left" or "move right".',
    ),
    "wordle": ServerSpec(
        task_field="seed",
        route_prefix="/wordle",
        observation_route="/observation",
        splits={"test": (0, 200), "train": (200, 10200)},
        has_close=False,
        max_turns=6,
        action_help='Guess a 5-letter word from the vocabulary as spaced letters, e.g. "s h i r e".',
    ),
    "webshop": _state_env(
        task_field="session_id",
        reset_shapes=("pair",),
        splits={"test": (0, 500), "train": (1500, 12087)},
        actions_route="/available_actions",
        instruction_route="/instruction_text",
        action_help="search[keywords] (where there is a search bar) or click[value] with a clickable from the page.",
    ),
    "sqlgym": _state_env(
        task_field="item_id",
        reset_shapes=(),
        observe_after_reset=True,
        max_turns=5,
        action_help="One SQLite statement per turn, on one line.",
    ),
    "searchqa": _tool_env(
        max_turns=10,
        action_help="Search with <search> query </search>; give the final answer as <answer> answer </answer>.",
    ),
    **{
        name: _tool_env(has_close=False, score_field="reward", max_turns=20, action_help=_TOOL_HELP)
        for name in ("academia", "movie", "sheet", "todo", "weather")
    },
    "webarena": ServerSpec(
        dialect="env_idx",
        task_field="idx",
        reset_fields={"seed": 0},
        create_keys=("env_idx",),
        done_keys=("terminated", "truncated"),
        max_turns=30,
        action_help="One browser action per turn between ``` marks, e.g. ```click [12]```, "
        "```type [5] [red shoes] [1]```, ```stop [answer]```.",
    ),
}
#: any other name: an `omrl env serve` server (or a compatible one) that describes itself
GENERIC_SERVER = ServerSpec(
    create_keys=("id", "env_idx"),
    bare_id=True,
    reset_shapes=("object", "pair", "text"),
    observation_keys=("observation", "state"),
    instruction_key="instruction",
    expert_route="/expert_action",
    observation_route="/observation",  # checked only on a server that names no instance (not omrl's)
)


#: what an omrl server answers under any env name (``omrl env serve webshop`` is played as
#: ``env_name=webshop``): its create answer names an instance, and from then on its answers are
#: read with GENERIC_SERVER's shapes and routes (it takes the known server's requests as they are)
OMRL_ANSWER_FIELDS = (
    "reset_shapes",
    "observe_after_reset",
    "observation_keys",
    "done_keys",
    "instruction_key",
    "instruction_route",
    "actions_route",
    "expert_route",
    "refused",
)


def as_omrl_server(spec: ServerSpec) -> ServerSpec:
    """``spec`` with the answers of an ``omrl env serve`` server (requests unchanged)."""
    return dataclasses.replace(spec, **{name: getattr(GENERIC_SERVER, name) for name in OMRL_ANSWER_FIELDS})


def create_body(spec: ServerSpec, task_id: int) -> dict[str, Any] | None:
    """The ``/create`` body of ``spec``'s server for an episode of ``task_id``."""
    return {"none": None, "empty": {}, "task": {"id": task_id}}[spec.create_body]


def read_create(spec: ServerSpec, answer: Any) -> tuple[int, str | None, bool]:
    """(env id, omrl server instance or None, deterministic) from a ``/create`` answer."""
    instance, deterministic = None, False
    if isinstance(answer, dict):
        if isinstance(answer.get("instance"), str) and answer["instance"]:
            instance = answer["instance"]
        if "deterministic" in answer:
            deterministic = flag(answer, "deterministic")
        keys = ("id", *spec.create_keys) if instance else spec.create_keys  # an omrl server answers "id"
        key = next((k for k in keys if k in answer), None)
        env_id = answer[key] if key is not None else None
    else:
        env_id = answer if spec.bare_id else None
    if isinstance(env_id, bool) or not isinstance(env_id, int):
        shapes = [f"{{{k!r}: <int>}}" for k in spec.create_keys] + (["a bare int"] if spec.bare_id else [])
        raise MalformedAnswer(f"expected an env id ({' or '.join(shapes)}), got {snippet(json.dumps(answer))}")
    return env_id, instance, deterministic


@dataclass
class ResetParts:
    """What a ``/reset`` answer says: observation (None: ask GET /observation), instruction, and more."""

    observation: Any = None
    instruction: str = ""
    actions: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    score: float | None = None  # the running score the episode starts at (babyai, sciworld)


def read_reset(spec: ServerSpec, answer: Any) -> ResetParts:
    """The parts of a ``/reset`` answer, in one of ``spec.reset_shapes`` (MalformedAnswer otherwise)."""
    if not spec.reset_shapes:
        return ResetParts()
    if "object" in spec.reset_shapes and isinstance(answer, dict):
        observation = answer[_present(answer, spec.observation_keys)]
        key = spec.instruction_key
        parts = ResetParts(
            observation,
            str(answer[key]) if key and answer.get(key) else "",
            _action_list(answer.get("available_actions")),
            {k: v for k, v in answer.items() if k not in RESET_PROTOCOL_KEYS},
        )
        if isinstance(answer.get("info"), dict):  # an omrl server's env info
            parts.info.update(answer["info"])
        if spec.score_field and spec.score_field in answer:
            parts.score = clip(number(answer, spec.score_field) / spec.score_scale)
        return parts
    if "pair" in spec.reset_shapes and isinstance(answer, list) and len(answer) == 2:
        return ResetParts(answer[0])
    if "text" in spec.reset_shapes and isinstance(answer, str):
        return ResetParts(answer)
    shapes = {"object": "an object with an observation", "pair": "[observation, null]", "text": "a string"}
    raise MalformedAnswer(
        f"expected {' or '.join(shapes[s] for s in spec.reset_shapes)}, got {snippet(json.dumps(answer))}"
    )


@dataclass
class StepParts:
    """What a ``/step`` answer says, with the score and won derived as ``spec`` gives."""

    observation: str
    reward: float
    done: bool
    score: float
    won: bool
    info: dict[str, Any]
    actions: list[str] | None


def read_step(spec: ServerSpec, answer: Any, score_before: float) -> StepParts:
    """The parts of a ``/step`` answer; ``score_before`` is the episode's score so far.

    KeyError, TypeError or ValueError for a malformed answer (a key missing, a reward that is not a
    finite number, a ``done`` that is not a boolean).
    """
    if not isinstance(answer, dict):
        raise TypeError(f"expected an object, got {type(answer).__name__}")
    observation = answer[_present(answer, spec.observation_keys)]
    done = [flag(answer, key) for key in spec.done_keys]  # each is checked, not only the first true one
    if "won" in answer and "score" in answer:  # omrl servers say it themselves
        reward, score, won = number(answer, "reward"), number(answer, "score"), flag(answer, "won")
    else:
        if spec.score_field:
            score = clip(number(answer, spec.score_field) / spec.score_scale)
            reward = score - score_before
        else:
            reward = number(answer, "reward")
            score = clip(score_before + reward)
        won = any(done) and score >= spec.win_score
    info = dict(answer["info"]) if isinstance(answer.get("info"), dict) else {}
    text = as_text(observation)
    if spec.refused and "invalid" not in info:  # an omrl server says it itself, in info
        info["invalid"] = text.lstrip().startswith(spec.refused)
    return StepParts(text, reward, any(done), score, won, info, _action_list(answer.get("available_actions")))


def observed(answer: Any) -> str:
    """The observation in an answer of a server's ``observation_route`` (BabyAI's is an object)."""
    if isinstance(answer, dict) and "observation" in answer:
        answer = answer["observation"]
    return as_text(answer)


def same_env(spec: ServerSpec, observed: str, last: str, first: str) -> bool:
    """Whether ``observed`` (what ``spec``'s observation route answered about an env id) is what the
    client left there: ``last``, the last observation the server answered it about the env, or for
    BabyAI the episode's goal line (the first of ``first``, the reset's observation) before ``last``.
    Anything else means a create, reset or step of another client reached the env since."""
    if observed == last:
        return True
    goal_line = first.split("\n", 1)[0]
    return spec.observation_goal_line and observed == f"{goal_line}\n{last}"


def number(answer: dict[str, Any], key: str) -> float:
    """``answer[key]`` as a float; NaN, infinities, strings and booleans are malformed."""
    value = answer[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a finite number, got {_short(value)}")
    return float(value)


def flag(answer: dict[str, Any], key: str) -> bool:
    """``answer[key]``, which must be a JSON boolean (``bool("no")`` would be True)."""
    value = answer[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key!r} must be true or false, got {_short(value)}")
    return value


def clip(value: float) -> float:
    return min(1.0, max(0.0, value))


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _present(answer: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` in ``answer`` (KeyError naming the first when none is)."""
    return next((k for k in keys if k in answer), keys[0])


def _action_list(value: Any) -> list[str] | None:
    """The admissible actions of an answer; None where it lists none (unknown: an omrl server answers
    [] for an env that does not know them, and no actions at all would help no policy)."""
    return [str(a) for a in value] if isinstance(value, list) and value else None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
