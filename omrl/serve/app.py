"""Serve any registered env over HTTP the AgentGym way (``omrl env serve``).

AgentGym's own clients (the ``agentenv`` package's TextCraft, BabyAI, SciWorld, ALFWorld,
WebShop and SQLGym clients, and LMRL-Gym's maze client with its base URL at this server's root,
not ``/maze``) can play it, and so can omrl's own ``agentgym`` env (``plugins.agentgym.env_name=<the
env's name>``). LMRL-Gym's wordle client cannot: it asks ``GET /filtered_vocab`` (a word list no
omrl env has) and asserts 200. Two dialects, as AgentGym's servers speak them:

- the ``id`` dialect at the root: an env id travels as ``"id"`` in bodies and ``?id=`` in queries;
- the ``env_idx`` dialect (WebShop, SQLGym) under ``/env_idx`` (a client's base URL
  ``http://HOST:PORT/env_idx``): the same routes, but ``POST /create`` answers the bare id.

Every route takes the id under either name. Routes (``GET /`` is a greeting):
- ``POST /create``, with no body or a JSON object -> ``{"id", "instance", "deterministic",
  "idle_timeout", "observation", "task_id", "done": false, "reward": 0.0}``. Ids never repeat
  across restarts (a start numbers from the microsecond clock, :mod:`omrl.serve.store`), so a
  client's id from before a restart is unknown here (404), never another client's env;
  ``idle_timeout`` is the seconds after which an env no call touches is closed (null: never),
  and a call about it then gets 410 saying so. ``deterministic`` is the env's own
  flag (replaying a task's actions replays its episode: tree search forks such envs by replay).
  A body that names a task (any task field below) resets the new env to it and its episode
  starts; otherwise ``observation`` shows the first task of the env's first split, as AgentGym's
  TextCraft server shows its task, and the env must be reset before a step, which every
  AgentGym client does. TextCraft's client posts ``{"minecraft_dir", "commands", "goal"}``:
  accepted, with ``commands`` and ``goal`` null (an omrl env plays its own tasks).
- ``POST /reset`` ``{"id", <task field>}`` -> ``{"id", "task_id", "observation", "instruction",
  "task_description", "info", "available_actions", "reward": 0.0, "score": 0.0, "done": false}``.
  The task field is any one of ``data_idx`` (TextCraft, BabyAI, SciWorld), ``game`` (ALFWorld,
  maze), ``seed`` (wordle), ``item_id`` (SQLGym), ``session_id`` (WebShop) or ``task_id``; its
  value is the omrl env's task id. Other fields (ALFWorld's ``world_type``) are ignored.
- ``POST /step`` ``{"id", "action"}`` -> ``{"observation", "state", "reward", "score", "done",
  "won", "info", "available_actions"}``: ``state`` repeats ``observation`` (WebShop and SQLGym
  read it), ``score`` is the episode's score in [0, 1] (BabyAI and SciWorld read it as their
  reward), ``available_actions`` is [] when the env does not know them or the episode is over.
- ``GET /observation?id=`` -> the last observation (a string); ``GET /list_envs`` -> live ids;
  ``POST /close`` ``{"id"}``; ``GET /available_actions?id=`` -> a list.
- omrl extensions: ``GET /tasks`` -> ``{"env", "splits": {name: size}, "action_help", "action_example",
  "max_turns", "deterministic", "demonstration": [[observation, thought, action], ...]}``; ``GET /tasks?split=``
  -> ``{"split", "task_ids": [...]}`` or, for a range of ids, ``{"split", "range": [start, stop,
  step]}``; ``GET /expert_action?id=`` -> ``{"action"}``.

The goal inside the observation: AgentGym's clients take the observation text as the agent's whole prompt,
so the first observation of an episode (in ``/create``, ``/reset`` and ``GET /observation``) opens with the
env's instruction, as omrl's rollout opens an episode (:func:`~omrl.serve.answers.with_goal`), and
``task_description`` is "" (SciWorld's client puts it before the observation). A request that names this server's instance (``X-Omrl-Instance``, as
omrl's ``agentgym`` client sends) reads the instruction apart, so it gets the env's own first
observation: the client hands both on as the env returned them.

Errors are answered the AgentGym way, a body ``{"error": message}``, so existing clients that
look for it keep working, *and* with a real HTTP status, so clients that check the status (and
retry logic) can tell whose fault it is: 404 for an unknown id, split, task or route; 409 for a
step before reset or after the episode ended; 422 for a malformed body (the message says what is
wrong without echoing the body); 500 when the env itself raised or broke the protocol (a 5xx is
worth retrying, a 4xx is not); 504 when the env did not return within ``--call-timeout``, and 503
while that call runs on (the id is busy: close it) or the server shuts down. After an env raised in ``step`` its episode is over: further steps answer 409 until the
next reset. Every error, FastAPI's own included, has that one shape. The guards that run before
any route (token, instance name, body size) are in :mod:`omrl.serve.guard`; the envs and their
episodes in :mod:`omrl.serve.store`; how a request's fields are read in :mod:`omrl.serve.fields`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable, Iterator

from omrl.env_examples import example_action
from omrl.envs import Env, UnknownTaskError, create_env
from omrl.errors import OmrlError
from omrl.serve.answers import Opening, opening_of, with_goal
from omrl.serve.fields import TASK_FIELDS, body_field, env_id_of, query_id, task_id_of, validation_message
from omrl.serve.guard import DEFAULT_MAX_BODY, INSTANCE_HEADER, Guard
from omrl.serve.store import DEFAULT_CALL_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_ENVS, Rejected, ServedEnvs

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_ENVS",
    "ENV_IDX_PREFIX",
    "INSTANCE_HEADER",
    "TASK_FIELDS",
    "Rejected",
    "ServedEnvs",
    "background_server",
    "create_app",
    "open_env",
    "run_server",
    "with_goal",
]

ENV_IDX_PREFIX = "/env_idx"
SHUTDOWN_GRACE = 10  # seconds requests get to end at shutdown (a call on an env that hangs answers at once)


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


class _Preview:
    """The first observation of the env's first task, for ``/create`` answers that name no task:
    taken once, on the server's catalog env, so a create does not cost a reset."""

    def __init__(self, catalog: Env, lock: threading.Lock):
        self.catalog, self.lock = catalog, lock
        self.opening: Opening | None = None
        self.taken = False

    def get(self) -> Opening | None:
        with self.lock:
            if not self.taken:
                try:
                    first = next((ids[0] for ids in map(self.catalog.split_of, self.catalog.splits) if len(ids)), None)
                    self.opening = None if first is None else opening_of(self.catalog, first)
                except Exception as exc:  # noqa: BLE001 - the env's fault: retried at the next create
                    raise Rejected(500, f"the env raised showing its first task: {type(exc).__name__}: {exc}") from exc
                self.taken = True
            return self.opening


def create_app(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    max_envs: int = DEFAULT_MAX_ENVS,
    max_body: int = DEFAULT_MAX_BODY,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
):
    """A FastAPI app serving env ``name`` built with ``options``; bad options fail here, at once.

    ``token``: every request must carry ``Authorization: Bearer <token>``; ``max_envs`` caps the
    live envs, ``max_body`` the bytes of a request body; envs no call touched for ``idle_timeout``
    seconds are closed, and a request gives up on an env call after ``call_timeout`` seconds (None
    or 0: never). ``app.state.envs`` holds the envs.
    """
    fastapi, _ = _require_server_packages()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise OmrlError("the server token must be a non-empty string")
    if max_envs < 1 or max_body < 1:
        raise OmrlError(f"max_envs and max_body must be >= 1, got {max_envs} and {max_body}")
    for what, seconds in (("idle_timeout", idle_timeout), ("call_timeout", call_timeout)):
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds >= 0):
            raise OmrlError(f"{what} must be a number of seconds >= 0 (0: never), got {seconds!r}")
    options = dict(options or {})
    catalog = open_env(name, options)  # answers /tasks; also checks the options before serving
    with contextlib.ExitStack() as undo:  # the prompt's worked example, as made in-process: else it is not served
        undo.callback(catalog.close)
        example = example_action(catalog)
        undo.pop_all()
    catalog_lock = threading.Lock()
    preview = _Preview(catalog, catalog_lock)
    deterministic = getattr(catalog, "deterministic", False) is True
    served = ServedEnvs(name, lambda: type(catalog)(**options), max_envs, idle_timeout, call_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        served.start()
        try:
            yield
        finally:  # free what the envs hold (processes, connections), whatever one of them raises
            for problem in served.close_all():
                print(f"warning: shutting down: {problem}", file=sys.stderr)
            try:
                catalog.close()
            except Exception as exc:  # noqa: BLE001 - the env's fault, one line
                print(
                    f"warning: shutting down: the catalog env's close() raised {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                )

    app = fastapi.FastAPI(title=f"omrl env server: {name}", lifespan=lifespan)
    app.state.envs = served
    app.add_middleware(Guard, instance=lambda: served.instance, token=token, max_body=max_body)
    Body, Header, Query = fastapi.Body, fastapi.Header, fastapi.Query

    @app.exception_handler(Rejected)
    def rejected(request, exc: Rejected):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    def malformed(request, exc: RequestValidationError):
        return JSONResponse({"error": validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    def http_error(request, exc: HTTPException):  # unknown routes, wrong methods: FastAPI's {"detail"}
        path = request.url.path[:100]
        message = {404: f"no route {path!r}", 405: f"{request.method} is not allowed on {path!r}"}.get(
            exc.status_code, str(exc.detail)[:200]
        )
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    def internal_error(request, exc: Exception):  # a bug here: still the protocol's shape
        return JSONResponse({"error": f"internal server error ({type(exc).__name__})"}, status_code=500)

    def create(body: dict[str, Any] | None) -> dict:
        body = body or {}
        for key in ("commands", "goal"):  # TextCraft's own server builds a task from these
            if body.get(key) is not None:
                raise Rejected(
                    422,
                    f"this server plays env {name!r}'s own tasks and takes no {key!r}; "
                    f"name a task with one of {', '.join(TASK_FIELDS)} instead",
                )
        task_id = task_id_of(body)
        opening = preview.get() if task_id is None else None  # before the env: a failure leaves none
        env_id = served.create()
        if task_id is not None:
            try:
                opening = served.reset(env_id, task_id)
            except Rejected:
                with contextlib.suppress(Rejected):  # a create that failed leaves no env behind
                    served.close(env_id)
                raise
        return {
            "id": env_id,
            "instance": served.instance,
            "deterministic": deterministic,
            "idle_timeout": served.idle_timeout,
            "observation": opening.shown if opening else "",
            "task_id": opening.task_id if opening else None,
            "done": False,
            "reward": 0.0,
        }

    @app.post("/create")
    def create_id(body: dict[str, Any] | None = Body(None)) -> dict:
        return create(body)

    @app.post(ENV_IDX_PREFIX + "/create")
    def create_env_idx(body: dict[str, Any] | None = Body(None)) -> int:
        return create(body)["id"]

    router = fastapi.APIRouter()  # every other route, in both dialects

    @router.get("/")
    def greeting() -> str:
        return (
            f"This is the omrl env server for {name!r} (AgentGym id dialect; "
            f"the env_idx dialect under {ENV_IDX_PREFIX})."
        )

    @router.post("/reset")
    def reset(body: dict[str, Any] = Body(...), instance: str | None = Header(None, alias=INSTANCE_HEADER)) -> dict:
        env_id, task_id = env_id_of(body), task_id_of(body)
        if task_id is None:
            raise Rejected(422, f"the body needs the task as one of {', '.join(TASK_FIELDS)} (int), got none")
        opening = served.reset(env_id, task_id)
        return {
            "id": env_id,
            "task_id": task_id,
            "observation": opening.text if instance else opening.shown,
            "instruction": opening.instruction,
            "task_description": "",
            "info": opening.info,
            "available_actions": opening.actions,
            "reward": 0.0,
            "score": 0.0,
            "done": False,
        }

    @router.post("/step")
    def step(body: dict[str, Any] = Body(...)) -> dict:
        env_id, action = env_id_of(body), body_field(body, "action", str)
        result = served.step(env_id, action)
        return {
            "observation": result.observation,
            "state": result.observation,
            "reward": result.reward,
            "score": result.score,
            "done": result.done,
            "won": result.won,
            "info": result.info,
            "available_actions": result.actions,
        }

    @router.get("/observation")
    def observation(
        id: int | None = Query(None),
        env_idx: int | None = Query(None),
        instance: str | None = Header(None, alias=INSTANCE_HEADER),
    ) -> str:
        return served.observation(query_id(id, env_idx), with_goal=not instance)

    @router.get("/available_actions")
    def available_actions(id: int | None = Query(None), env_idx: int | None = Query(None)) -> list[str]:
        return served.actions(query_id(id, env_idx))

    @router.get("/expert_action")
    def expert_action(id: int | None = Query(None), env_idx: int | None = Query(None)) -> dict:
        return {"action": served.expert_action(query_id(id, env_idx))}

    @router.post("/close")
    def close(body: dict[str, Any] = Body(...)) -> dict:
        env_id = env_id_of(body)
        served.close(env_id)
        return {"id": env_id, "closed": True}

    @router.get("/list_envs")
    def list_envs() -> list[int]:
        return served.ids()

    @router.get("/tasks")
    def tasks(split: str | None = None) -> dict:
        with catalog_lock:
            if split is None:
                return {
                    "env": name,
                    "splits": {s: len(catalog.split_of(s)) for s in catalog.splits},
                    "action_help": catalog.action_help,
                    "action_example": example,  # the prompt's worked example, as played here
                    "max_turns": catalog.max_turns,
                    "deterministic": getattr(catalog, "deterministic", False) is True,
                    "demonstration": [[t.observation, t.thought, t.action] for t in catalog.demonstration],
                }
            try:
                ids = catalog.split_of(split)
            except UnknownTaskError as exc:
                raise Rejected(404, str(exc)) from exc
            if isinstance(ids, range):  # 100,000 ids need not travel one by one
                return {"split": split, "range": [ids.start, ids.stop, ids.step]}
            return {"split": split, "task_ids": [int(t) for t in ids]}

    app.include_router(router)
    app.include_router(router, prefix=ENV_IDX_PREFIX)
    return app


def run_server(
    app,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    announce: Callable[[int], None] | None = None,
) -> None:
    """Serve ``app`` until interrupted (one process: the envs live in its memory). The port is bound
    first and ``announce`` told the one bound (port 0: a free one the system picks) before any request."""
    server = _server(app, host=host, port=port, log_level=log_level)
    sock = server.config.bind_socket()  # a port in use: uvicorn says so and exits 3
    with sock:
        if announce is not None:
            announce(sock.getsockname()[1])
        server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(3)


def _server(app, **config):
    """A uvicorn server whose shutdown is bounded: it first answers the calls waiting on envs (an env
    that hangs would hold it for good), then gives requests ``SHUTDOWN_GRACE`` seconds to end."""
    _, uvicorn = _require_server_packages()

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            envs = getattr(getattr(app, "state", None), "envs", None)
            if isinstance(envs, ServedEnvs):
                envs.stop()
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, timeout_graceful_shutdown=SHUTDOWN_GRACE, **config))


@contextlib.contextmanager
def background_server(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` from a thread of this process; yields its base URL (port 0: a free port).

    For tests and notebooks. Stops (closing every env) when the block ends.
    """
    server = _server(app, host=host, port=port, log_level="warning")
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
