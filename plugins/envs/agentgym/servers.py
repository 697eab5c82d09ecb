"""The AgentGym env servers the ``agentgym`` client knows, one :class:`ServerSpec` each: what their
``/create``, ``/reset``, ``/step`` and ``/close`` take and answer, their splits, scoring and routes.

Read from the servers' own code (AgentGym's ``agentenv-*`` packages); the client reads and writes
through these specs (:mod:`.dialects`). Any name that is not in :data:`KNOWN_SERVERS` is an ``omrl
env serve`` server (or one that speaks like it): :data:`GENERIC_SERVER`, which also takes the looser
shapes a custom AgentGym-style server may answer; so is a known name's server whose ``/create``
answer names an omrl instance (:func:`as_omrl_server`).

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

Checking an env id (:func:`~omrl_plugins.envs.agentgym.dialects.same_env`): textcraft, babyai, sciworld, alfworld, maze and wordle keep
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
from dataclasses import dataclass, field
from typing import Any

from omrl.envs import Env

DIALECTS = ("id", "env_idx")


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
    #: other clients (:func:`~omrl_plugins.envs.agentgym.dialects.same_env`); None: the server has no such route
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


def _lmrl_env(name: str, **kw: Any) -> ServerSpec:
    """LMRL-Gym's maze and wordle: routes under ``/<name>``, the latest observation kept, no ``/close``."""
    return ServerSpec(route_prefix=f"/{name}", observation_route="/observation", has_close=False, **kw)


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
    "maze": _lmrl_env(
        "maze",
        task_field="game",
        splits={"train": (0, 26), "test": (0, 26)},
        action_help='One move per turn: "move up", "move down", "move left" or "move right".',
    ),
    "wordle": _lmrl_env(
        "wordle",
        task_field="seed",
        splits={"test": (0, 200), "train": (200, 10200)},
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
