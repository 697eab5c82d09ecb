"""A small HTTP server for the page and its JSON endpoints (standard library only).

    GET /                    the page
    GET /api/run             overview: config, metrics, panels, eval reports, problems, facets
    GET /api/episodes?...    a page of summaries (filters, env=NAME among them, and sort: see EpisodeStore.query)
    GET /api/episode/ID      one episode in full
    GET /api/group/KEY       the samples of one group side by side
    GET /api/tree/KEY        the search tree of one group

Comparing two evals (:class:`omrl.view.compare.Comparison`), ``/api/run`` is the comparison and each
side answers the calls above under its own prefix: ``/api/a/run``, ``/api/b/episode/ID``, ...

It binds to loopback unless told otherwise, and on loopback it answers only requests whose
Host header names loopback, so a web page elsewhere cannot read a run through DNS rebinding.
"""

from __future__ import annotations

import errno
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from omrl.errors import OmrlError
from omrl.view.compare import Comparison
from omrl.view.page import dumps, render
from omrl.view.store import EpisodeStore

DEFAULT_PORT = 8765
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
_TRIES = 20  # ports tried after the default one when it is taken
_MAX_ID_DIGITS = 18  # more than any run's episodes


class ViewServer(ThreadingHTTPServer):
    """The HTTP server holding one run's store (or a comparison of two) and its rendered page."""

    daemon_threads = True

    def __init__(self, store: EpisodeStore | Comparison, host: str, port: int):
        self.store = store
        self.page = render().encode("utf-8")
        self.loopback_only = host in LOOPBACK
        if ":" in host:  # an IPv6 address: the class default is IPv4
            self.address_family = socket.AF_INET6
        super().__init__((host.strip("[]"), port), ViewHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


class ViewHandler(BaseHTTPRequestHandler):
    server: ViewServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.server.loopback_only and _host_name(self.headers.get("Host", "")) not in LOOPBACK:
            self._send(403, b"forbidden: this server answers loopback names only\n", "text/plain; charset=utf-8")
            return
        parts = urlsplit(self.path)
        route = [unquote(p) for p in parts.path.strip("/").split("/")]
        params = dict(parse_qsl(parts.query))
        store = self.server.store
        try:
            if route == [""] or route == ["index.html"]:
                self._send(200, self.server.page, "text/html; charset=utf-8")
                return
            if route[0] != "api" or len(route) < 2:
                raise KeyError(f"no page {parts.path}")
            route = route[1:]
            if isinstance(store, Comparison):
                if route == ["run"]:
                    self._json(200, store.overview())
                    return
                if route[0] not in store.sides or len(route) < 2:
                    raise KeyError(f"no endpoint {parts.path} (the sides are {', '.join(store.sides)})")
                store, route = store.sides[route[0]], route[1:]
            body = answer(store, route[0], "/".join(route[1:]), params, parts.path)
        except KeyError as exc:
            self._json(404, {"error": str(exc.args[0] if exc.args else exc)})
            return
        except Exception as exc:  # noqa: BLE001 - one bad file must not take the server down
            self._json(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._json(200, body)

    def _json(self, status: int, body: Any) -> None:
        self._send(status, dumps(body).encode("ascii"), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # a request line per token hover would bury the URL the user needs


def answer(store: EpisodeStore, name: str, arg: str, params: dict[str, str], path: str) -> Any:
    """What endpoint ``name`` (with its ``arg`` and query ``params``) answers for one store."""
    if name == "run":
        return store.overview()
    if name == "episodes":
        return store.query(params)
    if name == "episode":
        return store.episode(_episode_id(arg))
    if name == "group":
        return store.group(arg)
    if name == "tree":
        return store.tree(arg)
    raise KeyError(f"no endpoint {path}")


def make_server(store: EpisodeStore | Comparison, host: str = "127.0.0.1", port: int | None = None) -> ViewServer:
    """A server bound to ``host``:``port``. With ``port`` None, the default port or, when that is
    taken, one of the next few; a port named by the user must be free."""
    candidates = [port] if port is not None else [DEFAULT_PORT + i for i in range(_TRIES)] + [0]
    for candidate in candidates:
        try:
            return ViewServer(store, host, candidate)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or candidate == candidates[-1]:
                if exc.errno == errno.EADDRINUSE:
                    raise OmrlError(f"{host}:{candidate} is in use; pass another --port (0 picks a free one)") from exc
                raise OmrlError(
                    f"--host {host}: cannot be bound on port {candidate} ({exc.strerror or exc}); pass an address "
                    "of this machine, e.g. 127.0.0.1 (the default) or 0.0.0.0 for every interface"
                ) from exc
    raise AssertionError("unreachable")


def _host_name(header: str) -> str:
    """The host part of a Host header (``[::1]:8765`` -> ``[::1]``, ``localhost:80`` -> ``localhost``)."""
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _episode_id(arg: str) -> int:
    """The episode id a URL names: a few ASCII digits ("²" is a digit to str.isdigit but not to int, and
    int refuses thousands of digits), else a KeyError, so the answer is 404, not 500."""
    if not (arg.isascii() and arg.isdigit() and len(arg) <= _MAX_ID_DIGITS):
        raise KeyError(f"no episode {arg[:_MAX_ID_DIGITS]!r}")
    return int(arg)


def serve_forever(server: ViewServer, out: Any = sys.stdout) -> None:
    """Serve until Ctrl-C."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=out)
    finally:
        server.server_close()
