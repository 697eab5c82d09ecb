"""The gateway's HTTP side: each request read, checked and routed to the :class:`~omrl.gateway.server.Gateway`, then answered.

A thread a connection, one call a connection (``Connection: close``). A request that is not JSON, or
that the gateway refuses, is answered 400 naming the field; an unknown or ended key 401. After a call is
generated, its reply is written only where the client still waits for it: one that hung up (it timed
out) gets nothing, and the gateway undoes the call (:meth:`Gateway.undo`); a reply written is delivered
(:meth:`Gateway.delivered`). Either way the episode learns the call's fate, which its end waits for.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError, TemplateSyntaxError

from omrl.gateway import responses
from omrl.gateway.messages import RequestError
from omrl.gateway.protocol import ChatRequest, chunks, completion, error_body
from omrl.gateway.recorder import EpisodeRecorder, Reply

if TYPE_CHECKING:
    from omrl.gateway.server import Gateway

MAX_BODY_BYTES = 32 * 1024 * 1024
READ_TIMEOUT_S = 60  # a client that stalls mid-request gives its thread back
TOO_DEEP = "the request nests too deeply to read or lay out (a tool schema, tool-call arguments)"


class EpisodeEnded(Exception):
    """A call for an episode that ended while the call waited (HTTP 401, as an unknown key)."""


class Server(ThreadingHTTPServer):
    """A thread a request, on a backlog every agent fits in."""

    request_queue_size = 4096  # every episode's agent may connect at once (the default backlog is 5)
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or stalled is its own business: no traceback on the run's output."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, OSError)):
            super().handle_error(request, client_address)


def handler(gateway: Gateway) -> type[BaseHTTPRequestHandler]:
    """The request handler of ``gateway``'s endpoint."""

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
                request.retry = self.headers.get("x-stainless-retry-count", "0").strip() not in ("", "0")
            except RequestError as exc:
                return self._send(400, error_body(str(exc)))
            except RecursionError:
                return self._send(400, error_body(TOO_DEEP))
            try:
                replies, prompt_tokens, call = gateway.complete(recorder, request)
            except EpisodeEnded as exc:
                return self._send(401, error_body(str(exc), "authentication_error", "invalid_api_key"))
            except RequestError as exc:
                return self._send(400, error_body(str(exc)))
            except RecursionError:
                return self._send(400, error_body(TOO_DEEP))
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
            gateway.delivered(recorder, call)
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
