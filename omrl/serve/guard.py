"""What ``omrl env serve`` checks before any route runs: the token, the instance name, body size.

Guards, in this order (the first that fails answers ``{"error": message}`` with its status):

- a token (``create_app(token=...)``, ``omrl env serve --token`` or ``OMRL_SERVE_TOKEN``): every
  request must carry ``Authorization: Bearer <token>``, else 401;
- restarts: each start of the server draws a new instance name, sent in the ``X-Omrl-Instance``
  header of every answer and in the ``/create`` answer. A request that names another instance in
  that header gets 410: its id was handed out before a restart. omrl's ``agentgym`` client sends
  it; any other client's stale id is unknown to a restarted server (404), since a start never
  hands out an earlier start's ids (:mod:`omrl.serve.store`);
- bodies over ``max_body`` bytes (1 MiB) get 413 unread.

Also here: whether a listening address is reachable from other machines, and what to tell the
person serving on one.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Callable

INSTANCE_HEADER = "X-Omrl-Instance"
TOKEN_ENV = "OMRL_SERVE_TOKEN"
DEFAULT_MAX_BODY = 1 << 20  # bytes; AgentGym requests are a few hundred


class Guard:
    """ASGI middleware that checks every request before a route runs: token, instance, body size.

    It reads the body itself (up to ``max_body`` bytes) and hands it on, so an oversized body is
    refused without ever being held whole, and stamps every answer with the server's instance.
    ``instance`` is called per request: the name changes when the server starts again.
    """

    def __init__(self, app, instance: Callable[[], str], token: str | None, max_body: int):
        self.app = app
        self.instance = instance
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        instance = self.instance()

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
            return 410, (
                f"this server restarted: env ids of instance {claimed.decode('latin-1')[:40]!r} are gone "
                f"(this is instance {instance!r}); create a new env"
            )
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
        return (
            f"warning: {host} is not a loopback address: other machines can reach this server "
            "(every request needs the token; it travels in clear over plain HTTP)"
        )
    return (
        f"warning: {host} is not a loopback address: anyone who can reach this machine can create, "
        f"step and close its envs; set --token or {TOKEN_ENV} to require a token"
    )
