"""Serve any registered env over HTTP in the AgentGym ``id`` dialect (``omrl env serve``).

Any AgentGym-style client can then play it, and so can omrl's own ``agentgym`` env
(``plugins.agentgym.env_name=<the env's name>``). Routes:

- ``GET /`` a greeting; ``POST /create`` -> ``{"id", "instance"}``; ``POST /close`` ``{"id"}``.
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
retry logic) can tell whose fault it is: 404 for an unknown id, split, task or route; 409 for a
step before reset or after the episode ended; 422 for a malformed body (the message says what is
wrong without echoing the body); 500 when the env itself raised (a 5xx is worth retrying, a 4xx
is not). After an env raised in ``step`` its episode is over: further steps answer 409 until the
next reset. Every error, FastAPI's own included, has that one shape.

Guards, checked before any route runs:

- a token (``create_app(token=...)``, ``omrl env serve --token`` or ``OMRL_SERVE_TOKEN``): every
  request must carry ``Authorization: Bearer <token>``, else 401;
- bodies over ``max_body`` bytes (1 MiB) get 413 unread; a create beyond ``max_envs`` live envs
  (256) gets 503 (retryable: envs may be closed meanwhile);
- restarts: each start of the server draws a new instance name, sent in the ``X-Omrl-Instance``
  header of every answer and in the ``/create`` answer. A request that names another instance in
  that header gets 410: its id was handed out before a restart and may now be another client's
  env (a restarted server numbers its ids from 0 again). omrl's ``agentgym`` client sends it.

Each id holds its own env instance; ids are handed out under a lock and every call on one id
holds that id's lock, so one id's calls are serialized while different ids run in parallel
(FastAPI runs these handlers in its thread pool).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import itertools
import json
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from omrl.envs import Env, EpisodeFinishedError, UnknownTaskError, create_env
from omrl.errors import OmrlError

INSTANCE_HEADER = "X-Omrl-Instance"
TOKEN_ENV = "OMRL_SERVE_TOKEN"
DEFAULT_MAX_BODY = 1 << 20  # bytes; AgentGym requests are a few hundred
DEFAULT_MAX_ENVS = 256


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


class ServedEnvs:
    """The env instances of one server, by id, at most ``max_envs`` at once."""

    def __init__(self, name: str, make_env: Callable[[], Env], max_envs: int = DEFAULT_MAX_ENVS):
        self.name = name
        self.max_envs = max_envs
        self.instance = _new_instance()  # drawn again at each start (see start)
        self._make_env = make_env
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._creating = 0  # envs being built: they count against max_envs already
        self._ids = itertools.count()

    def start(self) -> None:
        """A new instance name: ids handed out before this start are refused (410) from now on."""
        self.instance = _new_instance()

    def create(self) -> int:
        with self._lock:
            if len(self._slots) + self._creating >= self.max_envs:
                raise Rejected(503, f"this server holds its limit of {self.max_envs} live envs (max_envs); "
                                    "close some with POST /close, or restart it with a higher --max-envs")
            self._creating += 1
        try:
            env = self._make_env()
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            raise Rejected(500, f"creating env {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self._creating -= 1
        with self._lock:
            env_id = next(self._ids)
            self._slots[env_id] = _Slot(env)
        return env_id

    def get(self, env_id: Any, remove: bool = False) -> _Slot:
        """The slot of ``env_id`` (taken out with ``remove``); unknown ids get a 404."""
        valid = isinstance(env_id, int) and not isinstance(env_id, bool)
        with self._lock:
            slot = (self._slots.pop if remove else self._slots.get)(env_id, None) if valid else None
            if slot is None:
                raise Rejected(404, f"the id {env_id!r} is not valid; live ids: {sorted(self._slots)[:20]}")
            return slot

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)


def _new_instance() -> str:
    return uuid.uuid4().hex[:16]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only takes connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def exposure_warning(host: str, token: str | None) -> str | None:
    """What to tell the person serving on ``host``, or None for a loopback address."""
    if is_loopback(host):
        return None
    if token:
        return (f"warning: {host} is not a loopback address: other machines can reach this server "
                "(every request needs the token; it travels in clear over plain HTTP)")
    return (f"warning: {host} is not a loopback address: anyone who can reach this machine can create, "
            f"step and close its envs; set --token or {TOKEN_ENV} to require a token")


def _field(body: dict[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        got = "nothing" if key not in body else f"a {type(value).__name__}"  # never the body itself
        raise Rejected(422, f"the body needs {key!r} ({kind.__name__}), got {got}")
    return value


def _jsonable(value: Any) -> Any:
    """Env info as JSON (anything JSON cannot hold becomes its string, NaN and infinities too)."""
    return json.loads(json.dumps(value, default=str), parse_constant=str)


def _finite(value: Any, what: str) -> float:
    """A reward or score the env returned, as a float; anything else is the env's fault (500)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"the env returned a {what} that is not finite: {number}")
    return number


def _crash(what: str, exc: BaseException) -> Rejected:
    return Rejected(500, f"the env raised in {what}: {type(exc).__name__}: {exc}")


def _validation_message(errors: Sequence[Any]) -> str:
    """What failed validation, without the input: a large bad body must not come back in the answer."""
    parts = []
    for error in errors[:3]:
        where = ".".join(str(p) for p in error.get("loc", ()))[:80]
        parts.append(f"{where}: {str(error.get('msg', 'invalid'))[:120]}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "malformed request: " + "; ".join(parts) + more


class _Guard:
    """ASGI middleware that checks every request before a route runs: token, instance, body size.

    It reads the body itself (up to ``max_body`` bytes) and hands it on, so an oversized body is
    refused without ever being held whole, and stamps every answer with the server's instance.
    """

    def __init__(self, app, served: ServedEnvs, token: str | None, max_body: int):
        self.app = app
        self.served = served
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        instance = self.served.instance

        async def stamped(message):
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (INSTANCE_HEADER.lower().encode(), instance.encode())]
                message = {**message, "headers": headers}
            await send(message)

        refusal = self._refusal(dict(scope["headers"]), instance)
        body = b""
        if refusal is None:
            body, refusal = await self._read_body(receive)
        if refusal is not None:
            from starlette.responses import JSONResponse

            status, message = refusal
            extra = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return await JSONResponse({"error": message}, status, headers=extra)(scope, receive, stamped)
        await self.app(scope, _replay(body, receive), stamped)

    def _refusal(self, headers: dict[bytes, bytes], instance: str) -> tuple[int, str] | None:
        if self.expected is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            return 401, f"this server needs the header `Authorization: Bearer <token>` ({TOKEN_ENV})"
        claimed = headers.get(INSTANCE_HEADER.lower().encode())
        if claimed is not None and claimed.decode("latin-1") != instance:
            return 410, (f"this server restarted: env ids of instance {claimed.decode('latin-1')[:40]!r} are gone "
                         f"(this is instance {instance!r}), and the same number may now be another client's "
                         "env; create a new env")
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_body:
            return 413, self._too_large()
        return None

    async def _read_body(self, receive) -> tuple[bytes, tuple[int, str] | None]:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b"", (400, "the client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:  # a body sent in chunks, with no length declared
                return b"", (413, self._too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _too_large(self) -> str:
        return f"the request body is over this server's limit of {self.max_body} bytes"


def _replay(body: bytes, receive):
    """A ``receive`` that hands out the body already read, then the client's later messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


def create_app(name: str, options: dict[str, Any] | None = None, *, token: str | None = None,
               max_envs: int = DEFAULT_MAX_ENVS, max_body: int = DEFAULT_MAX_BODY):
    """A FastAPI app serving env ``name`` built with ``options``; bad options fail here, at once.

    ``token``: every request must carry ``Authorization: Bearer <token>``; ``max_envs`` caps the
    live envs, ``max_body`` the bytes of a request body. ``app.state.envs`` holds the envs.
    """
    fastapi, _ = _require_server_packages()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise OmrlError("the server token must be a non-empty string")
    if max_envs < 1 or max_body < 1:
        raise OmrlError(f"max_envs and max_body must be >= 1, got {max_envs} and {max_body}")
    options = dict(options or {})
    catalog = open_env(name, options)  # answers /tasks; also checks the options before serving
    catalog_lock = threading.Lock()
    served = ServedEnvs(name, lambda: type(catalog)(**options), max_envs)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        served.start()
        yield
        for env_id in served.ids():  # free what the envs hold (processes, connections) on shutdown
            served.get(env_id, remove=True).env.close()
        catalog.close()

    app = fastapi.FastAPI(title=f"omrl env server: {name}", lifespan=lifespan)
    app.state.envs = served
    app.add_middleware(_Guard, served=served, token=token, max_body=max_body)
    Body, Query = fastapi.Body, fastapi.Query

    @app.exception_handler(Rejected)
    def rejected(request, exc: Rejected):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    def malformed(request, exc: RequestValidationError):
        return JSONResponse({"error": _validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    def http_error(request, exc: HTTPException):  # unknown routes, wrong methods: FastAPI's {"detail"}
        path = request.url.path[:100]
        message = {404: f"no route {path!r}", 405: f"{request.method} is not allowed on {path!r}"}.get(
            exc.status_code, str(exc.detail)[:200])
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    def internal_error(request, exc: Exception):  # a bug here: still the protocol's shape
        return JSONResponse({"error": f"internal server error ({type(exc).__name__})"}, status_code=500)

    @app.get("/")
    def greeting() -> str:
        return f"This is the omrl env server for {name!r} (AgentGym id dialect)."

    @app.post("/create")
    def create() -> dict:
        return {"id": served.create(), "instance": served.instance}

    @app.post("/reset")
    def reset(body: dict[str, Any] = Body(...)) -> dict:
        env_id, task_id = _field(body, "id", int), _field(body, "data_idx", int)
        slot = served.get(env_id)
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
        slot = served.get(env_id)
        with slot.lock:
            if not slot.started:
                raise Rejected(409, f"env id {env_id} has no episode ({slot.ended or 'not reset'}): reset it first")
            if slot.ended:
                raise Rejected(409, f"the episode of env id {env_id} is over ({slot.ended}): reset it")
            try:
                result = slot.env.step(action)
                reward, score = _finite(result.reward, "reward"), _finite(result.score, "score")
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
            return {"observation": result.observation, "reward": reward, "done": bool(result.done),
                    "info": _jsonable(result.info), "score": score, "won": result.won,
                    "available_actions": actions}

    @app.get("/observation")
    def observation(id: int = Query(...)) -> str:
        slot = served.get(id)
        with slot.lock:
            return slot.observation

    @app.get("/available_actions")
    def available_actions(id: int = Query(...)) -> list[str] | None:
        slot = served.get(id)
        with slot.lock:
            return slot.env.admissible_actions() if slot.started and not slot.ended else None

    @app.get("/expert_action")
    def expert_action(id: int = Query(...)) -> dict:
        slot = served.get(id)
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
        slot = served.get(env_id, remove=True)
        with slot.lock:
            slot.env.close()
        return {"id": env_id, "closed": True}

    @app.get("/list_envs")
    def list_envs() -> list[int]:
        return served.ids()

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
