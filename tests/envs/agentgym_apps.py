"""Test servers as strict as AgentGym's real ones: one small FastAPI app factory per env family.

Each app takes the request bodies its real server declares (pydantic models with exactly the
real fields: a missing required body or field gets HTTP 422, extra keys are accepted, as
pydantic does by default) and answers with only the keys the real server answers. The
``id``-dialect servers report failures as HTTP 200 ``{"error": ...}``; the ``env_idx`` servers
(WebShop, SQLGym, SearchQA and the tools) have no error handling, so an unknown env index is
their HTTP 500; WebArena is a Flask app (a missing key is a 500, a body that is not JSON a 415,
``/close`` answers the text ``closed``). The ``id``-dialect apps answer ``GET /observation`` as
their servers do: the env's latest observation (BabyAI: an object, the goal line first; a finished
env's is refused but by TextCraft). Routes a real server lacks are missing here too (no
``/close`` on ALFWorld, LMRL-Gym, WebShop, SQLGym and the tools). Sources: AgentGym's
``agentenv-*`` servers, summarized in ../shared/reference/agentgym-protocol.md and
plugins/envs/agentgym/servers.py.

The games are tiny and scripted (one winning action per task), enough to play a full episode.
:class:`Recorder` wraps any app and keeps every request (method, path, query, JSON body) so tests
can assert exactly what a client sent.
"""

import copy
import itertools
import json
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

# -- the real servers' request bodies -------------------------------------------------------


class TextCraftCreate(BaseModel):
    commands: Optional[str] = None
    goal: Optional[str] = None


class TextCraftReset(BaseModel):
    id: int
    data_idx: Optional[int] = 0


class IdStep(BaseModel):
    id: int
    action: str


class DataIdxReset(BaseModel):  # BabyAI, SciWorld
    id: int
    data_idx: int


class AlfWorldReset(BaseModel):
    id: int
    game: int
    world_type: str


class MazeReset(BaseModel):
    id: int
    game: int


class WordleReset(BaseModel):
    id: int
    seed: int


class IdClose(BaseModel):
    id: int


class EnvIdxStep(BaseModel):
    env_idx: int
    action: str


class WebShopReset(BaseModel):
    env_idx: int
    session_id: Optional[int] = None


class SqlGymReset(BaseModel):
    env_idx: int
    item_id: int


class ToolCreate(BaseModel):  # SearchQA and the tool envs
    id: int


class ToolReset(BaseModel):
    env_idx: int
    id: Optional[int] = None


class EnvIdxClose(BaseModel):
    env_idx: int


# -- recording ------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any  # the decoded JSON body; None when none was sent


class Recorder:
    """ASGI wrapper that records every HTTP request to ``app`` in ``calls`` (then passes it on)."""

    def __init__(self, app):
        self.app = app
        self.calls: list[Call] = []

    def sent(self, *paths: str) -> list[tuple[str, str, Any]]:
        """(method, path, body) of the calls, those to ``paths`` only when given."""
        return [(c.method, c.path, c.body) for c in self.calls if not paths or c.path in paths]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:  # read the whole body first, then hand it to the app unchanged
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            decoded = json.loads(body) if body else None
        except ValueError:
            decoded = body.decode("latin-1")
        self.calls.append(
            Call(scope["method"], scope["path"], dict(parse_qsl(scope["query_string"].decode())), decoded)
        )
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def not_valid(env_id: int) -> dict:
    """The id-dialect servers' answer (HTTP 200) for an id they do not hold."""
    return {"error": f"The id {env_id} is not valid."}


def finished(env_id: int) -> dict:
    return {"error": f"The task with environment {env_id} has finished."}


def step_refusal(envs: dict[int, dict], env_id: int) -> Optional[dict]:
    """The id-dialect servers' answer to a step of an id ``envs`` does not hold (:func:`not_valid`) or of an
    episode that is done (:func:`finished`); None when the step may be played."""
    if env_id not in envs:
        return not_valid(env_id)
    return finished(env_id) if envs[env_id].get("done") else None


def id_app(new_env: Any, **answer: Any) -> tuple[FastAPI, dict[int, Any]]:
    """An id-dialect app whose body-less ``/create`` files a copy of ``new_env`` under the next id (0, 1, ...)
    and answers ``{"id": ..., **answer}``: the app, to add the other routes to, and its envs by id."""
    app = FastAPI()
    envs: dict[int, Any] = {}
    ids = itertools.count()

    @app.post("/create")
    def create():
        env_id = next(ids)
        envs[env_id] = copy.copy(new_env)
        return {"id": env_id, **answer}

    return app, envs


def crash() -> PlainTextResponse:
    """What an ``env_idx`` server answers when its handler raises (an unknown index: a KeyError)."""
    return PlainTextResponse("Internal Server Error", status_code=500)


# -- the id dialect -------------------------------------------------------------------------


def textcraft_app() -> FastAPI:
    """TextCraft: /create needs a JSON body and answers task ``id``'s observation; steps after the
    end are accepted silently; ``/close``."""
    app = FastAPI()
    envs: dict[int, dict] = {}
    ids = itertools.count()

    def first_observation(task: int) -> str:
        return f"Crafting commands:\ncraft 1 stick{task} using 2 planks\nGoal: craft stick{task}."

    @app.get("/")
    def hello():
        return "This is environment TextCraft."

    @app.post("/create")
    def create(body: TextCraftCreate):
        env_id = next(ids)
        envs[env_id] = {"task": env_id, "observation": first_observation(env_id)}
        return {"id": env_id, "observation": envs[env_id]["observation"], "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: TextCraftReset):
        if body.id not in envs:
            return not_valid(body.id)
        envs[body.id] = {"task": body.data_idx, "observation": first_observation(body.data_idx)}
        return {"id": body.id, "observation": envs[body.id]["observation"], "done": False, "reward": 0}

    @app.post("/step")
    def step(body: IdStep):
        if body.id not in envs:
            return not_valid(body.id)
        env = envs[body.id]
        won = body.action == f"craft 1 stick{env['task']} using 2 planks"
        env["observation"] = f"Crafted 1 minecraft:stick{env['task']}" if won else "Could not find enough items."
        return {"observation": env["observation"], "reward": 1 if won else 0, "done": won}

    @app.get("/observation")
    def observation(id: int):
        return envs[id]["observation"] if id in envs else not_valid(id)

    @app.post("/close")
    def close(body: IdClose):
        return True if envs.pop(body.id, None) is not None else not_valid(body.id)

    return app


def running_score_app(env: str) -> FastAPI:
    """BabyAI or SciWorld: body-less creates, answers with the running ``score``; a finished env
    refuses steps; ``/close``.

    BabyAI: "go to red ball" wins (reward 0.8, score += reward). SciWorld: "focus on water" scores
    50, then "heat water" 100 (reward = the change in score); the reset names the task.
    """
    app, envs = id_app({"started": False})

    @app.post("/reset")
    def reset(body: DataIdxReset):
        if body.id not in envs:
            return not_valid(body.id)
        envs[body.id] = {"started": True, "done": False, "score": 0, "task": body.data_idx}
        if env == "babyai":
            envs[body.id]["seen"] = f"level {body.data_idx % 40 + 1}"  # the goal line is kept apart
            return {
                "observation": f"Your goal: go to the red ball\nlevel {body.data_idx % 40 + 1}",
                "reward": 0,
                "score": 0,
                "deleted": False,
                "done": False,
            }
        envs[body.id]["seen"] = "This room is called the kitchen."
        return {
            "task_name": "boil",
            "var_num": body.data_idx,
            "task_description": "Your task is to boil water.",
            "observation": "This room is called the kitchen.",
            "reward": 0,
            "score": 0,
            "deleted": False,
            "done": False,
        }

    @app.post("/step")
    def step(body: IdStep):
        if (refused := step_refusal(envs, body.id)) is not None:
            return refused
        state = envs[body.id]
        if not state["started"]:  # BabyAI must be reset before its first step
            return {"error": f"{body.id}"}
        if env == "babyai":
            reward = 0.8 if body.action == "go to red ball" else 0.0
            state["score"] += reward
            state["done"] = reward > 0.5
        else:
            before = state["score"]
            state["score"] = {"focus on water": max(before, 50), "heat water": 100}.get(body.action, before)
            reward, state["done"] = state["score"] - before, state["score"] == 100
        state["seen"] = f"You did {body.action}."
        return {
            "observation": f"You did {body.action}.",
            "reward": reward,
            "score": state["score"],
            "done": state["done"],
        }

    @app.get("/observation")
    def observation(id: int):
        """SciWorld: the last observation; BabyAI: an object, the goal line before the last observation."""
        if (refused := step_refusal(envs, id)) is not None:
            return refused
        state = envs[id]
        if env == "sciworld":
            return state["seen"] if state["started"] else not_valid(id)
        if not state["started"]:
            return {
                "observation": "Environment not initialized",
                "reward": 0,
                "score": 0,
                "done": False,
                "deleted": False,
            }
        seen = f"Your goal: go to the red ball\n{state['seen']}"
        return {"observation": seen, "reward": 0, "score": state["score"], "done": False, "deleted": False}

    @app.post("/close")
    def close(body: IdClose):
        return True if envs.pop(body.id, None) is not None else not_valid(body.id)

    return app


def alfworld_app() -> FastAPI:
    """ALFWorld: resets take ``game`` and ``world_type``; answers carry ``available_actions``; no /close."""
    app, envs = id_app({"done": False})

    @app.post("/reset")
    def reset(body: AlfWorldReset):
        if body.world_type not in ("Text", "Embody", "Hybrid"):
            return {"error": 'world_type must be one of "Text", "Embody" and "Hybrid"'}
        if body.id not in envs:
            return not_valid(body.id)
        seen = f"You are in the middle of a room. Your task is to: put a mug {body.game} in the cabinet."
        envs[body.id] = {"done": False, "seen": seen}
        return {
            "id": body.id,
            "observation": seen,
            "available_actions": ["go to cabinet 1", "look"],
            "task_type": "pick_and_place",
        }

    @app.post("/step")
    def step(body: IdStep):
        if (refused := step_refusal(envs, body.id)) is not None:
            return refused
        won = body.action == "put mug in cabinet 1"
        envs[body.id]["done"] = won
        envs[body.id]["seen"] = "You put the mug in the cabinet 1." if won else "Nothing happens."
        return {
            "observation": envs[body.id]["seen"],
            "reward": float(won),
            "available_actions": [] if won else ["put mug in cabinet 1", "look"],
            "done": won,
        }

    @app.get("/observation")
    def observation(id: int):
        return step_refusal(envs, id) or envs[id]["seen"]

    return app


def lmrlgym_app() -> FastAPI:
    """LMRL-Gym: maze and wordle under /maze and /wordle; reward 1 at the goal / right word; no /close."""
    app = FastAPI()
    envs: dict[str, dict[int, dict]] = {"maze": {}, "wordle": {}}

    def game_routes(game: str, goal: str) -> None:
        """``/<game>/create`` and ``/<game>/step``, where ``goal`` wins."""
        ids = itertools.count()

        @app.post(f"/{game}/create")
        def create():
            env_id = next(ids)
            envs[game][env_id] = {"done": False}
            return {"id": env_id}

        @app.post(f"/{game}/step")
        def step(body: IdStep):
            if (refused := step_refusal(envs[game], body.id)) is not None:
                return refused
            won = body.action == goal
            envs[game][body.id]["done"] = won
            envs[game][body.id]["seen"] = "You reached the goal." if won else "You moved."
            return {"observation": envs[game][body.id]["seen"], "reward": float(won), "done": won}

        @app.get(f"/{game}/observation")
        def observation(id: int):
            return step_refusal(envs[game], id) or envs[game][id]["seen"]

    game_routes("maze", "move down")
    game_routes("wordle", "s h i r e")

    @app.post("/maze/reset")
    def maze_reset(body: MazeReset):
        if body.id not in envs["maze"]:
            return not_valid(body.id)
        if body.game >= 26:
            return {"error": f"The game {body.game} is not valid."}
        seen = f"The goal is at position 8, 6. Your current position is at position 1, {body.game}."
        envs["maze"][body.id] = {"done": False, "seen": seen}
        return {"observation": seen}

    @app.post("/wordle/reset")
    def wordle_reset(body: WordleReset):
        if body.id not in envs["wordle"]:
            return not_valid(body.id)
        envs["wordle"][body.id] = {"done": False, "seen": "Let's start Wordle!"}
        return {"id": body.id, "observation": "Let's start Wordle!"}

    return app


# -- the env_idx dialect --------------------------------------------------------------------


def webshop_app() -> FastAPI:
    """WebShop: bare-int creates (not numbered from 0), ``[observation, null]`` resets, ``state`` in
    step answers, ``info: null``; the instruction and the clickables from GET routes; no /close.
    (The real server also hands out live ids again once it holds 8,000 envs: see sqlgym_app.)"""
    app = FastAPI()
    pages: dict[int, str] = {}
    ids = itertools.count(48_000_000, 7)

    @app.post("/create")
    def create():
        env_idx = next(ids)
        pages[env_idx] = "search"
        return env_idx

    @app.post("/reset")
    def reset(body: WebShopReset):
        if body.env_idx not in pages:
            return crash()
        pages[body.env_idx] = "search"
        return [f"WebShop [SEP] Instruction: [SEP] goal {body.session_id} [SEP] Search", None]

    @app.get("/instruction_text")
    def instruction_text(env_idx: int):
        return "i need red shoes, price lower than 40.00 dollars" if env_idx in pages else crash()

    @app.get("/observation")
    def observation(env_idx: int):
        return f"page {pages[env_idx]}" if env_idx in pages else crash()

    @app.get("/available_actions")
    def available_actions(env_idx: int):
        if env_idx not in pages:
            return crash()
        clickables = {"search": ["search"], "results": ["back to search", "b01"], "item": ["back to search", "buy now"]}
        return {"has_search_bar": pages[env_idx] == "search", "clickables": clickables[pages[env_idx]]}

    @app.post("/step")
    def step(body: EnvIdxStep):
        if body.env_idx not in pages:
            return crash()
        if body.action == "click[buy now]":
            return {"state": "Thank you for shopping with us!", "reward": 1.0, "done": True, "info": None}
        pages[body.env_idx] = {"search": "results", "results": "item"}.get(pages[body.env_idx], "item")
        return {"state": f"page after {body.action}", "reward": 0.0, "done": False, "info": None}

    return app


def sqlgym_app() -> FastAPI:
    """SQLGym: as WebShop, with ``item_id``; the question comes from GET /observation; no /close.
    Like the real server it holds 8 envs, then hands out the live ones again, in turn."""
    app = FastAPI()
    items: dict[int, int | None] = {}
    ids, turns = itertools.count(300_000, 11), itertools.count()

    @app.post("/create")
    def create():
        if len(items) == 8:
            return list(items)[next(turns) % 8]
        env_idx = next(ids)
        items[env_idx] = None
        return env_idx

    @app.post("/reset")
    def reset(body: SqlGymReset):
        if body.env_idx not in items:
            return crash()
        items[body.env_idx] = body.item_id
        return [f"item {body.item_id}", None]

    @app.get("/observation")
    def observation(env_idx: int):
        if items.get(env_idx) is None:
            return crash()
        return f"Schema: CREATE TABLE t{items[env_idx]} (x INT). Question: how many rows?"

    @app.post("/step")
    def step(body: EnvIdxStep):
        if items.get(body.env_idx) is None:
            return crash()
        right = body.action == f"SELECT COUNT(*) FROM t{items[body.env_idx]}"
        return {"state": "[(3,)]" if right else "no such table", "reward": float(right), "done": right, "info": {}}

    return app


def tool_app(with_close: bool) -> FastAPI:
    """SearchQA (``with_close``) and the tool envs: ``/create`` needs ``{"id"}`` (the task), resets
    answer the observation string, steps ``{observation, reward, done, info: null}``. ``look`` makes
    progress (reward 0.5), ``finish`` ends the task (reward 1.0)."""
    app = FastAPI()
    tasks: dict[int, int] = {}
    ids = itertools.count()

    @app.post("/create")
    def create(body: ToolCreate):
        env_idx = next(ids)
        tasks[env_idx] = body.id
        return env_idx

    @app.post("/reset")
    def reset(body: ToolReset):
        if body.env_idx not in tasks:
            return crash()
        if body.id is not None:
            tasks[body.env_idx] = body.id
        return f"Now new trial starts.\nYou should perform actions to accomplish the goal: goal {tasks[body.env_idx]}"

    @app.post("/step")
    def step(body: EnvIdxStep):
        if body.env_idx not in tasks:
            return crash()
        done = body.action == "finish"
        reward = 1.0 if done else 0.5 if body.action == "look" else 0.0
        return {"observation": f"Observation: {body.action} done", "reward": reward, "done": done, "info": None}

    @app.get("/observation")
    def observation(env_idx: int):
        return "Observation: ..." if env_idx in tasks else crash()

    if with_close:

        @app.post("/close")
        def close(body: EnvIdxClose):
            return tasks.pop(body.env_idx, None) is not None

    return app


def webarena_app() -> FastAPI:
    """WebArena, a Flask server: reads ``request.json`` (a 415 without a JSON body, a 500 for a
    missing key), ``{"env_idx"}`` creates, ``terminated``/``truncated`` instead of ``done``, and a
    plain-text ``closed`` for ``/close``."""
    app = FastAPI()
    tasks: dict[int, int | None] = {}
    ids = itertools.count()

    async def flask_json(request: Request, *keys: str) -> dict | PlainTextResponse:
        if request.headers.get("content-type") != "application/json":
            return PlainTextResponse("<h1>Unsupported Media Type</h1>", status_code=415, media_type="text/html")
        body = await request.json()
        if not isinstance(body, dict) or any(k not in body for k in keys):
            return PlainTextResponse("<h1>Internal Server Error</h1>", status_code=500, media_type="text/html")
        return body

    @app.post("/create")
    def create():
        env_idx = next(ids)
        tasks[env_idx] = None
        return {"env_idx": env_idx}

    @app.post("/reset")
    async def reset(request: Request):
        body = await flask_json(request, "env_idx", "seed", "idx")
        if not isinstance(body, dict):
            return body
        tasks[body["env_idx"]] = body["idx"]
        return {"observation": f"OBJECTIVE: task {body['idx']}\n[1] RootWebArea 'Dashboard'"}

    @app.post("/step")
    async def step(request: Request):
        body = await flask_json(request, "env_idx", "action")
        if not isinstance(body, dict):
            return body
        stop = body["action"].startswith("```stop")
        return {
            "observation": "[1] RootWebArea 'Dashboard'",
            "reward": float(stop),
            "terminated": stop,
            "truncated": False,
            "info": {},
        }

    @app.post("/close")
    async def close(request: Request):
        body = await flask_json(request, "env_idx")
        if not isinstance(body, dict):
            return body
        tasks.pop(body["env_idx"], None)
        return PlainTextResponse("closed", media_type="text/html")

    return app


# -- an omrl-style server that says whether its env is deterministic -----------------------


def served_app(deterministic: Optional[bool], **described: Any) -> FastAPI:
    """Answers like ``omrl env serve`` (instance names, ``GET /tasks``, ``won``/``score`` in step
    answers), with ``deterministic`` in its ``/create`` and ``GET /tasks`` answers unless it is None;
    ``described``: other ``GET /tasks`` fields, in place of its own."""
    extra = {} if deterministic is None else {"deterministic": deterministic}
    app, envs = id_app(-1, instance="abc123", **extra)

    @app.get("/tasks")
    def tasks(split: Optional[str] = None):
        if split is None:
            return {
                "env": "echo",
                "splits": {"test": 2},
                "action_help": "say the task id",
                "max_turns": 3,
                "demonstration": [],
                **extra,
                **described,
            }
        return {"split": split, "range": [0, 2, 1]}

    @app.post("/reset")
    def reset(body: DataIdxReset):
        if body.id not in envs:
            return JSONResponse({"error": f"unknown env id {body.id}"}, status_code=404)
        envs[body.id] = body.data_idx
        return {
            "id": body.id,
            "task_id": body.data_idx,
            "observation": "Say the task id.",
            "instruction": f"Task {body.data_idx}.",
            "info": {"level": 1},
            "available_actions": None,
        }

    @app.post("/step")
    def step(body: IdStep):
        won = body.action == str(envs[body.id])
        return {
            "observation": "Right." if won else "Wrong.",
            "reward": float(won),
            "done": True,
            "info": {"won": won, "score": float(won)},
            "score": float(won),
            "won": won,
            "available_actions": None,
        }

    @app.post("/close")
    def close(body: IdClose):
        envs.pop(body.id, None)
        return {"id": body.id, "closed": True}

    return app


# -- TextCraft-shaped servers that misbehave on purpose -------------------------------------


def flaky_app(calls: dict, create_answer=None, reset_answer=None, step_answer=None) -> FastAPI:
    """A TextCraft-shaped server whose answers the test chooses; counts the calls per route in ``calls``.

    ``create_answer``, ``reset_answer`` and ``step_answer`` are answers, or functions of the call's
    number (1, 2, ...) returning one; unset, a TextCraft answer where crafting always succeeds.
    """
    app = FastAPI()
    seen: dict[str, Any] = {}  # the observation of the last answer that held one, for GET /observation

    def answer(route: str, chosen, default):
        calls[route] = calls.get(route, 0) + 1
        if chosen is None:
            out = default
        else:
            out = chosen if isinstance(chosen, (dict, list, Response)) else chosen(calls[route])
        if isinstance(out, dict) and "observation" in out and "error" not in out:
            seen["observation"] = out["observation"]
        return out

    @app.post("/create")
    def create(body: TextCraftCreate):
        return answer(
            "create", create_answer, {"id": 7, "observation": "Goal: craft stick.", "done": False, "reward": 0}
        )

    @app.post("/reset")
    def reset(body: TextCraftReset):
        return answer(
            "reset",
            reset_answer,
            {"id": body.id, "observation": "Crafting commands: ... Goal: craft stick.", "done": False, "reward": 0},
        )

    @app.post("/step")
    def step(body: IdStep):
        return answer("step", step_answer, {"observation": "Crafted 1 minecraft:stick", "reward": 1, "done": True})

    @app.get("/observation")
    def observation(id: int):
        return seen.get("observation", not_valid(id))

    @app.post("/close")
    def close(body: IdClose):
        return answer("close", None, True)

    return app


def agentgym_like_app(log: list[tuple[str, int, Optional[int]]], close_status: Optional[int] = None) -> FastAPI:
    """A TextCraft-shaped foreign server (no omrl extensions) that answers 404 for unknown ids.

    ``log`` gets (route, id, task) per call; ``close_status`` makes every /close answer that status.
    """
    app = FastAPI()
    tasks: dict[int, Optional[int]] = {}
    steps: dict[int, int] = {}
    seen: dict[int, str] = {}  # each env's last observation (GET /observation, not logged)
    ids = itertools.count()

    def known(env_id: int) -> Optional[JSONResponse]:
        return None if env_id in tasks else JSONResponse({"error": f"env {env_id} not found"}, status_code=404)

    @app.post("/create")
    def create(body: TextCraftCreate):
        env_id = next(ids)
        tasks[env_id], seen[env_id] = None, "Goal: craft a stick."
        return {"id": env_id, "observation": seen[env_id], "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: TextCraftReset):
        log.append(("reset", body.id, body.data_idx))
        if (gone := known(body.id)) is not None:
            return gone
        tasks[body.id], steps[body.id] = body.data_idx, 0
        seen[body.id] = f"task {body.data_idx}: craft a stick."
        return {"id": body.id, "observation": seen[body.id], "done": False, "reward": 0}

    @app.post("/step")
    def step(body: IdStep):
        log.append(("step", body.id, tasks.get(body.id)))
        if (gone := known(body.id)) is not None:
            return gone
        steps[body.id] += 1
        done = steps[body.id] >= 2
        seen[body.id] = f"task {tasks[body.id]}, step {steps[body.id]}"
        return {"observation": seen[body.id], "reward": int(done), "done": done}

    @app.get("/observation")
    def observation(id: int):
        return known(id) or seen[id]

    @app.post("/close")
    def close(body: IdClose):
        log.append(("close", body.id, tasks.get(body.id)))
        if close_status is not None:
            return JSONResponse({"error": "closing failed"}, status_code=close_status)
        if (gone := known(body.id)) is not None:
            return gone
        tasks.pop(body.id)
        return True

    return app


def falsy_textcraft_app(refuse_close: bool = False) -> FastAPI:
    """A TextCraft-shaped server as an AgentGym restart leaves its clients facing: ids from 0 at
    each start (a new app is a restarted server), and a bare ``false`` under HTTP 200 for an id it
    does not hold (``refuse_close``: for every close). Crafting ``stick<task>`` wins."""
    app = FastAPI()
    tasks: dict[int, int] = {}
    seen: dict[int, str] = {}  # each env's last observation, as GET /observation answers it
    ids = itertools.count()

    @app.post("/create")
    def create(body: TextCraftCreate):
        env_id = next(ids)
        tasks[env_id], seen[env_id] = env_id, f"Goal: craft stick{env_id}."
        return {"id": env_id, "observation": seen[env_id], "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: TextCraftReset):
        if body.id not in tasks:
            return False
        tasks[body.id], seen[body.id] = body.data_idx, f"Goal: craft stick{body.data_idx}."
        return {"id": body.id, "observation": seen[body.id], "done": False, "reward": 0}

    @app.post("/step")
    def step(body: IdStep):
        if body.id not in tasks:
            return False
        won = body.action == f"craft stick{tasks[body.id]}"
        seen[body.id] = "Crafted it." if won else "Nothing happens."
        return {"observation": seen[body.id], "reward": int(won), "done": won}

    @app.get("/observation")
    def observation(id: int):
        return seen[id] if id in tasks else False

    @app.post("/close")
    def close(body: IdClose):
        if refuse_close or body.id not in tasks:
            return False
        del tasks[body.id]
        return True

    return app


class Restartable:
    """ASGI app standing for a server process restarted on its port: :meth:`restart` swaps in a
    fresh ``make()`` (its envs gone, its ids from 0 again) while clients keep their connections."""

    def __init__(self, make):
        self.make = make
        self.app = make()

    def restart(self) -> None:
        self.app = self.make()

    async def __call__(self, scope, receive, send):
        return await self.app(scope, receive, send)
