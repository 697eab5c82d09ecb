"""Serve any registered env over HTTP in the AgentGym ``id`` dialect (``omrl env serve``).

Any AgentGym-style client can then play it, and so can omrl's own ``agentgym`` env
(``plugins.agentgym.env_name=<the env's name>``). Routes:

- ``GET /`` a greeting; ``POST /create`` -> ``{"id"}``; ``POST /close`` ``{"id"}``.
- ``POST /reset`` ``{"id", "data_idx"}`` -> ``{"id", "observation", "instruction", "info", "task_id",
  "available_actions"}``.
- ``POST /step`` ``{"id", "action"}`` -> ``{"observation", "reward", "done", "info", "score",
  "won", "available_actions"}``.
- ``GET /observation?id=`` -> the last observation (a string); ``GET /list_envs`` -> live ids.
- omrl extensions: ``GET /tasks`` -> ``{"env", "splits": {name: size}, "action_help",
  "max_turns", "demonstration": [[observation, thought, action], ...]}``;
  ``GET /tasks?split=`` -> ``{"split", "task_ids": [...]}`` or, for a
  range of ids, ``{"split", "range": [start, stop, step]}``; ``GET /expert_action?id=``
  -> ``{"action"}``; ``GET /available_actions?id=``.

Errors are answered the AgentGym way, a body ``{"error": message}``, so existing clients that
look for it keep working, *and* with a real HTTP status, so clients that check the status (and
retry logic) can tell whose fault it is: 404 for an unknown id, split or task; 409 for a step
before reset or after the episode ended; 422 for a malformed body; 500 when the env itself
raised (a 5xx is worth retrying, a 4xx is not). After an env raised in ``step`` its episode is
over: further steps answer 409 until the next reset.

Each id holds its own env instance; ids are handed out under a lock and every call on one id
holds that id's lock, so one id's calls are serialized while different ids run in parallel
(FastAPI runs these handlers in its thread pool).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from omrl.envs import Env, EpisodeFinishedError, UnknownTaskError, create_env
from omrl.errors import OmrlError


def open_env(name: str, options: dict[str, Any] | None = None) -> Env:
    """An instance of the registered env ``name``; options it does not take raise ConfigError."""
    from omrl.registry import envs

    return create_env(envs.get(name), options, name)


def _require_server_packages():
    try:
        import fastapi
        import uvicorn
    except ImportError as exc:
        raise OmrlError(f"serving envs needs fastapi and uvicorn ({exc}): pip install 'omrl[server]'") from exc
    return fastapi, uvicorn


class Rejected(Exception):
    """A request that gets an error answer with an HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Slot:
    """One env id: its instance, its lock and where its episode stands."""

    env: Env
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    ended: str = ""  # why the episode is over ("" while it runs)
    observation: str = ""


class EnvPool:
    """The env instances of one server, by id."""

    def __init__(self, name: str, make_env: Callable[[], Env]):
        self.name = name
        self._make_env = make_env
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._ids = itertools.count()

    def create(self) -> int:
        try:
            env = self._make_env()
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            raise Rejected(500, f"creating env {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            env_id = next(self._ids)
            self._slots[env_id] = _Slot(env)
        return env_id

    def get(self, env_id: Any, remove: bool = False) -> _Slot:
        """The slot of ``env_id`` (taken out of the pool with ``remove``); unknown ids get a 404."""
        valid = isinstance(env_id, int) and not isinstance(env_id, bool)
        with self._lock:
            slot = (self._slots.pop if remove else self._slots.get)(env_id, None) if valid else None
            if slot is None:
                raise Rejected(404, f"the id {env_id!r} is not valid; live ids: {sorted(self._slots)[:20]}")
            return slot

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)


def _field(body: dict[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise Rejected(422, f"the body needs {key!r} ({kind.__name__}), got {body!r}")
    return value


def _jsonable(value: Any) -> Any:
    """Env info as JSON (anything JSON cannot hold becomes its string)."""
    return json.loads(json.dumps(value, default=str))


def _crash(what: str, exc: BaseException) -> Rejected:
    return Rejected(500, f"the env raised in {what}: {type(exc).__name__}: {exc}")


def create_app(name: str, options: dict[str, Any] | None = None):
    """A FastAPI app serving env ``name`` built with ``options``; bad options fail here, at once."""
    fastapi, _ = _require_server_packages()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    options = dict(options or {})
    catalog = open_env(name, options)  # answers /tasks; also checks the options before serving
    catalog_lock = threading.Lock()
    pool = EnvPool(name, lambda: type(catalog)(**options))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        for env_id in pool.ids():  # free what the envs hold (processes, connections) on shutdown
            pool.get(env_id, remove=True).env.close()
        catalog.close()

    app = fastapi.FastAPI(title=f"omrl env server: {name}", lifespan=lifespan)
    Body, Query = fastapi.Body, fastapi.Query

    @app.exception_handler(Rejected)
    def rejected(request, exc: Rejected):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    def malformed(request, exc: RequestValidationError):
        return JSONResponse({"error": f"malformed request: {exc.errors()}"}, status_code=422)

    @app.get("/")
    def greeting() -> str:
        return f"This is the omrl env server for {name!r} (AgentGym id dialect)."

    @app.post("/create")
    def create() -> dict:
        return {"id": pool.create()}

    @app.post("/reset")
    def reset(body: dict[str, Any] = Body(...)) -> dict:
        env_id, task_id = _field(body, "id", int), _field(body, "data_idx", int)
        slot = pool.get(env_id)
        with slot.lock:
            slot.started, slot.ended = False, "not reset"
            try:
                first = slot.env.reset(task_id)
                actions = slot.env.admissible_actions()
            except UnknownTaskError as exc:
                raise Rejected(404, str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - an env crash is the server's 500
                raise _crash("reset", exc) from exc
            slot.started, slot.ended, slot.observation = True, "", first.text
            return {"id": env_id, "task_id": task_id, "observation": first.text,
                    "instruction": first.instruction, "info": _jsonable(first.info),
                    "available_actions": actions}

    @app.post("/step")
    def step(body: dict[str, Any] = Body(...)) -> dict:
        env_id, action = _field(body, "id", int), _field(body, "action", str)
        slot = pool.get(env_id)
        with slot.lock:
            if not slot.started:
                raise Rejected(409, f"env id {env_id} has no episode ({slot.ended or 'not reset'}): reset it first")
            if slot.ended:
                raise Rejected(409, f"the episode of env id {env_id} is over ({slot.ended}): reset it")
            try:
                result = slot.env.step(action)
                actions = None if result.done else slot.env.admissible_actions()
            except EpisodeFinishedError as exc:
                slot.ended = "finished"
                raise Rejected(409, str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - the episode cannot go on after a crash
                slot.ended = f"the env crashed: {type(exc).__name__}: {exc}"
                raise _crash("step", exc) from exc
            slot.observation = result.observation
            if result.done:
                slot.ended = "finished"
            return {"observation": result.observation, "reward": float(result.reward), "done": result.done,
                    "info": _jsonable(result.info), "score": result.score, "won": result.won,
                    "available_actions": actions}

    @app.get("/observation")
    def observation(id: int = Query(...)) -> str:
        slot = pool.get(id)
        with slot.lock:
            return slot.observation

    @app.get("/available_actions")
    def available_actions(id: int = Query(...)) -> list[str] | None:
        slot = pool.get(id)
        with slot.lock:
            return slot.env.admissible_actions() if slot.started and not slot.ended else None

    @app.get("/expert_action")
    def expert_action(id: int = Query(...)) -> dict:
        slot = pool.get(id)
        with slot.lock:
            if not slot.started or slot.ended:
                return {"action": None}
            try:
                return {"action": slot.env.expert_action()}
            except Exception as exc:  # noqa: BLE001
                raise _crash("expert_action", exc) from exc

    @app.post("/close")
    def close(body: dict[str, Any] = Body(...)) -> dict:
        env_id = _field(body, "id", int)
        slot = pool.get(env_id, remove=True)
        with slot.lock:
            slot.env.close()
        return {"id": env_id, "closed": True}

    @app.get("/list_envs")
    def list_envs() -> list[int]:
        return pool.ids()

    @app.get("/tasks")
    def tasks(split: str | None = None) -> dict:
        with catalog_lock:
            if split is None:
                return {"env": name, "splits": {s: len(catalog.split_of(s)) for s in catalog.splits},
                        "action_help": catalog.action_help, "max_turns": catalog.max_turns,
                        "demonstration": [[t.observation, t.thought, t.action] for t in catalog.demonstration]}
            try:
                ids = catalog.split_of(split)
            except UnknownTaskError as exc:
                raise Rejected(404, str(exc)) from exc
            if isinstance(ids, range):  # 100,000 ids need not travel one by one
                return {"split": split, "range": [ids.start, ids.stop, ids.step]}
            return {"split": split, "task_ids": [int(t) for t in ids]}

    return app


def run_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve ``app`` until interrupted (one process: the envs live in its memory)."""
    _, uvicorn = _require_server_packages()
    uvicorn.run(app, host=host, port=port, log_level=log_level)


@contextlib.contextmanager
def background_server(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` from a thread of this process; yields its base URL (port 0: a free port).

    For tests and notebooks. Stops (closing every env) when the block ends.
    """
    _, uvicorn = _require_server_packages()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"omrl-server-{port}", daemon=True)
    thread.start()
    while not server.started:  # uvicorn has no start event to wait on
        if not thread.is_alive():
            raise OmrlError(f"the env server could not start on {host}:{port} (is the port in use?)")
        time.sleep(0.005)
    try:
        yield f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
