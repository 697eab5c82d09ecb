"""HTTP calls to an AgentGym-style env server: keep-alive, retries, and its error answers.

AgentGym servers answer failures with HTTP 200 and ``{"error": ...}`` (some with a bare
``false``, e.g. for an id they do not hold); only a body that fails their schema gets a 422.
:class:`HttpTransport` turns those, any 4xx and bodies that are not JSON into
:class:`~omrl.envs.EnvError` subclasses that name the server, the call and the message.

Retries: a call is sent again after a connection error that proves it never reached the server
(it could not connect, or no pooled connection came free). Any other failure, an HTTP 5xx or a
read timeout included, may come after the server acted on it: a call that is not safe to run
twice (``resend_safe=False``, a step) then fails at once, while creates, resets, closes and
reads are sent again, up to ``retries`` more times.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable

import httpx

from omrl.envs import EnvError
from omrl.errors import ConfigError
from omrl.serve import TOKEN_ENV

PROBE_SECONDS = 5.0  # how long a server that took the connection has to answer a run's first GET /


class ServerFailure(EnvError):
    """The server could not be reached, crashed (5xx) or answered garbage: its env id may be gone."""


class ServerRefused(EnvError):
    """The server answered this call with an error (``{"error": ...}`` or a 4xx).

    ``error_body`` tells a server's own ``{"error": ...}`` from a bare 4xx (e.g. a route it lacks);
    ``unknown_id``: the server answered a bare ``false``, as AgentGym's do for an id they do not hold.
    """

    def __init__(self, message: str, status: int, error_body: bool = False, unknown_id: bool = False):
        super().__init__(message)
        self.status = status
        self.error_body = error_body
        self.unknown_id = unknown_id


#: base URL -> when a call last gave up on it for want of a connection; calls to it within the time one
#: call's retries take are sent once, without retries: once a server was known down, each of a rollout's
#: episodes waited out its own retries, one after another (minutes for a few hundred)
_UNREACHABLE: dict[str, float] = {}


class HttpTransport:
    """One keep-alive connection pool to a server, with retries and AgentGym's error answers."""

    def __init__(
        self, base_url: str, timeout: float, retries: int, backoff: float, headers: dict[str, str] | None = None
    ):
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def check_reachable(self) -> None:
        """ServerFailure when the server cannot be connected to: one ``GET /``, any HTTP answer will do; a
        warning when it took the connection but did not answer within :data:`PROBE_SECONDS`."""
        try:
            self._client.request("GET", "/", timeout=httpx.Timeout(PROBE_SECONDS, connect=self._client.timeout.connect))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            problem = f"cannot connect ({type(exc).__name__}: {exc or 'no detail'}); is the server running?"
            raise ServerFailure(self.message("GET /", problem)) from exc
        except httpx.TransportError as exc:  # it is there, only slow or odd at its root: the episodes will say more
            warnings.warn(
                f"agentgym server {self.base_url} took the connection but did not answer GET / within "
                f"{PROBE_SECONDS:g} s ({type(exc).__name__}); playing on",
                stacklevel=2,
            )

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        params: dict | None = None,
        headers: dict[str, str] | None = None,
        resend_safe: bool = True,
        retry: bool = True,
        json_answer: bool = True,
        before_send: Callable[[], None] | None = None,
    ) -> Any:
        """The decoded JSON answer (``json_answer=False``: the text of an answer that is not JSON).

        ``resend_safe=False`` resends only requests that never reached the server; ``retry=False``
        sends once. ``before_send`` runs before every attempt and may raise to stop the call (a
        server that restarted during the backoff may have handed the env id to another client).
        """
        what = f"{method} {path}"
        attempts = self.retries + 1 if retry else 1
        down = _UNREACHABLE.get(self.base_url)
        if down is not None and time.monotonic() - down < self._retry_time():
            attempts = 1  # another call just waited out its retries on it: one try finds it back, or not
        problem = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            if before_send is not None:
                before_send()
            try:
                response = self._client.request(method, path, json=body, params=params, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                problem = f"cannot connect ({type(exc).__name__}: {exc or 'no detail'})"
                continue
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc or 'no detail'}"
                if resend_safe:
                    continue
                raise ServerFailure(
                    self.message(what, f"{problem}; not resent, since the server may have run it")
                ) from exc
            if response.status_code >= 500:
                problem = f"HTTP {response.status_code}: {snippet(response.text)}"
                if resend_safe:
                    continue
                raise ServerFailure(
                    self.message(what, f"{problem}; not resent, since the server may have acted on it before failing")
                )
            _UNREACHABLE.pop(self.base_url, None)
            return self._decode(response, what, json_answer)
        if problem.startswith("cannot connect"):
            _UNREACHABLE[self.base_url] = time.monotonic()
        ask = "the server answers, but fails" if problem.startswith("HTTP ") else "is the server running?"
        raise ServerFailure(
            self.message(what, f"{problem} (gave up after {attempts} attempt{'s' if attempts > 1 else ''}); {ask}")
        )

    def _retry_time(self) -> float:
        """How long one call's retries wait in all: for that long after a call found the server down, other
        calls try it once."""
        return self.backoff * (2**self.retries - 1)

    def _decode(self, response: httpx.Response, what: str, json_answer: bool = True) -> Any:
        try:
            answer = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
            answer = None
            if response.status_code < 400:
                if not json_answer:
                    return response.text
                raise ServerFailure(self.message(what, f"the answer is not JSON: {snippet(response.text)}")) from None
        if answer is False:  # no route answers a bare false on success: an id the server does not hold
            raise ServerRefused(
                self.message(what, "the server answered false (it does not hold this env id?)"),
                response.status_code,
                error_body=True,
                unknown_id=True,
            )
        if isinstance(answer, dict) and "error" in answer:
            status = f"HTTP {response.status_code}: " if response.status_code >= 400 else ""
            raise ServerRefused(
                self.message(what, status + _cut(str(answer["error"]))), response.status_code, error_body=True
            )
        if response.status_code >= 400:
            raise ServerRefused(
                self.message(what, f"HTTP {response.status_code}: {snippet(response.text)}"), response.status_code
            )
        return answer

    def message(self, what: str, detail: str) -> str:
        return f"agentgym server {self.base_url}: {what} failed: {detail}"

    def close(self) -> None:
        self._client.close()


def snippet(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters, quoted: for error messages."""
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _cut(text: str, limit: int = 1000) -> str:
    """A server's own error message, cut to ``limit`` characters (a server may echo a whole body)."""
    return text if len(text) <= limit else text[:limit] + "..."


def request_headers(token: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    """The headers of every call: ``headers`` plus the bearer token (option, else OMRL_SERVE_TOKEN)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigError(f"plugins.agentgym.token must be a non-empty string, got {type(token).__name__}")
    if headers is not None and not (
        isinstance(headers, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise ConfigError(f"plugins.agentgym.headers must map header names to strings, got {headers!r}")
    return {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
