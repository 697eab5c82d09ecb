"""The policy behind an OpenAI-compatible endpoint: every call recorded into its episode token-exactly.

``Gateway`` serves ``GET /v1/models``, ``POST /v1/chat/completions`` (whole or streamed:
:mod:`omrl.gateway.protocol`) and ``POST /v1/responses`` (:mod:`omrl.gateway.responses`) on loopback unless told otherwise. Each episode gets its own API key
(:meth:`Gateway.open`); a call's key says which episode it belongs to, and an unknown or ended key
is refused (401), so an agent that outlives its episode cannot write into another; a call that belongs to
another episode than its key's is refused and named (:data:`SHARED_CLIENT`). A call lays out its row
(:mod:`omrl.gateway.recorder`), waits for its generate call (:mod:`omrl.gateway.batcher`) and is
answered with the reply parsed into ``tool_calls`` where tools were offered; a reply whose client hung
up before it was sent is undone (:meth:`Gateway.undo`).
"""

from __future__ import annotations

import itertools
import json
import secrets
import select
import socket
import sys
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError

from omrl.backends.base import Backend
from omrl.chat.tool_calls import FORMATS
from omrl.data.trajectory import Episode
from omrl.gateway import responses
from omrl.gateway.batcher import Batcher
from omrl.gateway.messages import RequestError, continues, of_another_episode, tool_layout
from omrl.gateway.protocol import ChatRequest, chunks, completion, error_body
from omrl.gateway.recorder import EpisodeRecorder, Reply, cut_at_stop

MAX_BODY_BYTES = 32 * 1024 * 1024
READ_TIMEOUT_S = 60  # a client that stalls mid-request gives its thread back


class EpisodeEnded(Exception):
    """A call for an episode that ended while the call waited (HTTP 401, as an unknown key)."""


SHARED_CLIENT = (
    "calls of one episode arrived with another episode's API key: the agents share one client (a process-wide "
    "default such as the OpenAI Agents SDK's set_default_openai_client, which every episode set at once), so "
    "episodes would train on each other's chats; give each episode its own client made from its base_url and "
    "api_key (docs/agents.md)"
)


class Misrouted(RequestError):
    """A call that belongs to another episode than its key's (:data:`SHARED_CLIENT`)."""


class Gateway:
    """An OpenAI-compatible endpoint for agent episodes (see the module docstring).

    ``limits``: the run's :class:`~omrl.rollout.loop.RolloutLimits` (a call's cap is the agent's
    ``max_tokens`` or ``max_new_tokens``, never past ``max_context``); with ``honor_sampling`` a
    request's ``temperature``, ``top_p`` and ``seed`` apply, else the run's (training needs its own).
    ``max_calls`` bounds an episode's calls, as ``max_context`` bounds each row: past either, a call is
    answered ``finish_reason: "length"`` and the episode is marked over budget (truncated).
    """

    def __init__(
        self,
        tokenizer: Any,
        backend: Backend,
        limits: Any,
        *,
        model_name: str = "omrl-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        window_s: float = 0.02,
        seed: int = 0,
        honor_sampling: bool = False,
        call_timeout_s: float = 300.0,
        max_calls: int = 64,
        batch_on_caller: bool = False,
    ):
        self.tokenizer = tokenizer
        self.limits = limits
        self.model_name = model_name
        self.honor_sampling = honor_sampling
        self.call_timeout_s = call_timeout_s  # longer than this, generate is stuck: the engine's failure
        self.max_calls = max_calls  # an episode's calls; past them each is answered "length"
        self.layout = tool_layout(tokenizer)
        self._episodes: dict[str, EpisodeRecorder] = {}
        self.misrouted: str | None = None  # set when a call arrived with another episode's key
        self.strayed = 0  # episodes ended with a call that opened a chat again, or a retry (EpisodeRecorder.strays)
        self._lock = threading.Lock()
        # batch_on_caller: whoever plays the episodes drives the batcher from its own thread (Batcher.drive)
        self.batcher = Batcher(
            backend, window_s, seed, waiting_for=lambda: len(self._episodes), own_thread=not batch_on_caller
        )
        self._server = _Server((host, port), _handler(self))
        # a short poll: closing the gateway waits for serve_forever's next look at its stop flag
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="omrl-gateway", daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- episodes ------------------------------------------------------------------------------------
    def open(self, episode: Episode, task_prompt: str = "") -> tuple[str, EpisodeRecorder]:
        """A new API key for ``episode`` and the recorder its calls write into; ``task_prompt``, the task its
        agent was given, tells a call that belongs to another episode (:data:`SHARED_CLIENT`)."""
        key = f"omrl-{secrets.token_urlsafe(18)}"
        recorder = EpisodeRecorder(
            episode,
            self.tokenizer,
            self.limits.history,
            self.limits.max_context,
            self.layout,
            getattr(self.limits, "template_kwargs", {}),
        )
        recorder.task_prompt = task_prompt.strip()
        with self._lock:
            self._episodes[key] = recorder
        return key, recorder

    def end(self, key: str) -> None:
        """Refuse ``key`` from now on, wait for a call of its still in progress, and let the backend forget the
        episode's cached states."""
        with self._lock:
            recorder = self._episodes.pop(key, None)
        if recorder is not None:
            with recorder.lock:  # a call in progress finishes first; one that comes later finds it ended
                recorder.ended = True
                ep = recorder.episode
                self.batcher.release([ep.token_ids[start:end] for start, end in ep.rows()])
            with self._lock:
                self.strayed += recorder.strays > 0

    def recorder(self, key: str) -> EpisodeRecorder | None:
        with self._lock:
            return self._episodes.get(key)

    # -- one call ------------------------------------------------------------------------------------
    def complete(self, recorder: EpisodeRecorder, request: ChatRequest) -> tuple[list[Reply], int, Any]:
        """Generate ``request``'s choices in its episode; the replies, the prompt's length in tokens, and
        what :meth:`undo` takes should the replies never reach the agent (None: nothing was recorded).
        A call that fails leaves the episode as it was before it."""
        with recorder.lock:
            if recorder.ended:
                raise EpisodeEnded("this episode has ended; its key is no longer valid")
            if recorder.calls >= self.max_calls:
                recorder.over_budget = True
                return [Reply("", [], "length", [], [])] * request.n, 0, None
            before = recorder.state()
            try:
                return self._generate(recorder, request)
            except BaseException:
                recorder.restore(before)
                raise

    def undo(self, recorder: EpisodeRecorder, call: Any) -> None:
        """Undo ``call`` (a token :meth:`complete` returned) when its reply never reached the agent (the
        client hung up, as one that timed out does), unless a later call or the episode's end came first."""
        with recorder.lock:
            if call is not None and recorder.last is call and not recorder.ended:
                row = list(recorder.episode.current_row())
                recorder.restore(call[2])
                self.batcher.release([row])

    def _check_route(self, recorder: EpisodeRecorder, messages: list[dict[str, Any]]) -> None:
        """Refuse a call that does not continue its episode's chat but another's, or that holds another
        episode's task and not its own: the agents share one client (:data:`SHARED_CLIENT`)."""
        if recorder.seen and continues(messages, recorder.seen):
            return
        with self._lock:
            others = [(o.task_prompt, o.seen, list(o.given)) for o in self._episodes.values() if o is not recorder]
        if of_another_episode(messages, recorder.task_prompt, others, recorder.given):
            self.misrouted = self.misrouted or SHARED_CLIENT
            raise Misrouted(SHARED_CLIENT)

    def _generate(self, recorder: EpisodeRecorder, request: ChatRequest) -> tuple[list[Reply], int, Any]:
        limits = self.limits
        if request.tools and self.layout.format is None:
            raise RequestError(
                "the model's chat template writes tool calls in a format the gateway cannot parse yet (served: "
                f"{', '.join(FORMATS)}: docs/templates.md); call without tools, or use a model whose template "
                "writes one of those"
            )
        self.batcher.release(recorder.settle(request.messages, request.tools))  # a retry, or another choice taken
        self._check_route(recorder, request.messages)
        start = recorder.state()
        row = recorder.prompt(request.messages, request.tools)
        if row is None:  # not one token fits: the episode is over its budget
            return [Reply("", [], "length", [], [])] * request.n, 0, None
        recorder.last = (list(request.messages), recorder.tools_key, start)  # what a retry would repeat
        asked = request.max_tokens or limits.max_new_tokens
        cap = min(asked, recorder.room())
        cap_by = "max_context" if cap < asked else "max_tokens" if request.max_tokens else "max_new_tokens"
        temperature, top_p, seed = limits.temperature, limits.top_p, None
        if self.honor_sampling:
            temperature = limits.temperature if request.temperature is None else request.temperature
            top_p = limits.top_p if request.top_p is None else request.top_p
            seed = request.seed
        call = object()  # a seeded request's choices share a generate call of their own
        futures = [self.batcher.generate(row, cap, temperature, top_p, seed, call) for _ in range(request.n)]
        try:
            generations = [future.result(timeout=self.call_timeout_s) for future in futures]
        except FutureTimeout as exc:  # the engine is stuck: the run's failure, not the agent's
            stuck = TimeoutError(f"a generate call took longer than {self.call_timeout_s:g} s")
            self.batcher.failure = self.batcher.failure or stuck
            raise stuck from exc
        options, unused = [], []
        for index, sampled in enumerate(generations):
            generation, stop_at = cut_at_stop(self.tokenizer, sampled, request.stop)
            options.append((generation, *recorder.reply(generation, request.tools, stop_at), stop_at))
            if index or stop_at is not None:  # no row will extend what the engine cached for it
                unused.append([*row, *sampled.token_ids])
        recorded = recorder.state()  # the first choice is recorded; a next call that continues another swaps it
        generation, reply, parsed, stop_at = options[0]
        recorder.record(generation, request.tools, cap_by, stop_at, (reply, parsed))
        recorder.choices = (recorded, options, cap_by) if len(options) > 1 else None
        self.batcher.release(unused)
        return [option[1] for option in options], len(row), recorder.last

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.batcher.close()


class _Server(ThreadingHTTPServer):
    request_queue_size = 4096  # every episode's agent may connect at once (the default backlog is 5)
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or stalled is its own business: no traceback on the run's output."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, OSError)):
            super().handle_error(request, client_address)


def _handler(gateway: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S
        disable_nagle_algorithm = True  # a reply is two writes (headers, body): no 40 ms wait for an ACK between them

        def log_message(self, *args: Any) -> None:  # the run's own output says what happened
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") not in ("/v1/models", "/models"):
                return self._send(
                    404,
                    error_body(
                        f"no route GET {self.path}; served: GET /v1/models, POST /v1/chat/completions",
                        "not_found_error",
                    ),
                )
            if self._episode() is None:
                return None
            model = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "omrl"}
            return self._send(200, {"object": "list", "data": [model]})

        def do_POST(self) -> None:  # noqa: N802
            route = self.path.rstrip("/").removeprefix("/v1")
            if route not in ("/chat/completions", "/responses"):
                self._drain()
                served = "POST /v1/chat/completions, POST /v1/responses"
                return self._send(404, error_body(f"no route POST {self.path}; served: {served}", "not_found_error"))
            recorder = self._episode()
            if recorder is None:
                return self._drain()
            try:
                body = self._body()
                request = ChatRequest.from_json(body) if route == "/chat/completions" else responses.chat_request(body)
            except RequestError as exc:
                return self._send(400, error_body(str(exc)))
            try:
                replies, prompt_tokens, call = gateway.complete(recorder, request)
            except EpisodeEnded as exc:
                return self._send(401, error_body(str(exc), "authentication_error", "invalid_api_key"))
            except RequestError as exc:
                return self._send(400, error_body(str(exc)))
            except RecursionError:
                return self._send(400, error_body("the request nests too deeply to lay out (a tool schema, arguments)"))
            except TemplateError as exc:  # the model's chat template refuses these messages (raise_exception)
                if isinstance(exc, TemplateSyntaxError):  # a broken template: the server's fault
                    return self._send(500, error_body(f"the model's chat template is broken: {exc}", "server_error"))
                return self._send(400, error_body(f"the model's chat template refuses these messages: {exc}"))
            except Exception as exc:  # noqa: BLE001 - the agent gets a server error with the reason
                return self._send(500, error_body(f"{type(exc).__name__}: {exc}", "server_error"))
            try:  # a reply that never reaches the agent (it hung up: timed out) is no turn of its episode
                if self._gone():
                    raise ConnectionResetError("the client hung up before its reply")
                self._answer(route, request, replies, prompt_tokens)
            except BaseException:
                gateway.undo(recorder, call)
                raise
            return None

        def _answer(self, route: str, request: ChatRequest, replies: list[Reply], prompt_tokens: int) -> None:
            model = request.model or gateway.model_name
            if route == "/responses":
                whole = responses.response(request, replies[0], prompt_tokens, model)
                if not request.stream:
                    return self._send(200, whole)
                return self._stream(
                    f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
                    for kind, event in responses.events(whole)
                )
            if not request.stream:
                return self._send(200, completion(request, replies, prompt_tokens, model, gateway.tokenizer))
            lines = (
                f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                for chunk in chunks(request, replies, prompt_tokens, model, gateway.tokenizer)
            )
            return self._stream(itertools.chain(lines, ["data: [DONE]\n\n"]))

        def _gone(self) -> bool:
            """Whether the client closed its end of the connection (it sends nothing more before its reply)."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                return True

        def _stream(self, events: Any) -> None:
            """Server-sent events, then the connection closes."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(event.encode())
            self.wfile.flush()
            self.close_connection = True

        def _episode(self) -> EpisodeRecorder | None:
            auth = self.headers.get("Authorization", "")
            key = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else self.headers.get("api-key", "")
            recorder = gateway.recorder(key) if key else None
            if recorder is None:
                self._send(
                    401,
                    error_body(
                        "unknown or ended API key: each episode has its own key, valid while it plays",
                        "authentication_error",
                        "invalid_api_key",
                    ),
                )
            return recorder

        def _length(self) -> int:
            text = self.headers.get("Content-Length") or "0"
            if not text.isdigit():
                self.close_connection = True
                raise RequestError(f"Content-Length is {text!r}; it must be the body's size in bytes")
            return int(text)

        def _body(self) -> Any:
            length = self._length()
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                raise RequestError(f"the body is {length} bytes; at most {MAX_BODY_BYTES} are read")
            raw = self.rfile.read(length)
            try:
                return json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise RequestError(f"the body is not JSON ({str(exc)[:80]})") from exc

        def _drain(self) -> None:
            text = self.headers.get("Content-Length") or "0"
            length = int(text) if text.isdigit() else -1
            if 0 < length <= MAX_BODY_BYTES:
                self.rfile.read(length)
            else:
                self.close_connection = True

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            # one connection a call: a client that pools connections (langchain-openai keeps one per base URL
            # for the whole process) must never reuse one to a gateway that closed, whose port a later one took
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

    return Handler
