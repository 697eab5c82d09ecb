"""The control routes of a running vLLM server (``VLLM_SERVER_DEV_MODE=1``): pause, resume, reload and
the weight-transfer protocol, each call's answer checked, a missing route named with how to start the
server that has it. :mod:`.weight_sync` and :mod:`.lora_sync` move weights through it."""

from __future__ import annotations

import json
from typing import Any

import httpx

from omrl.errors import EndpointError, OmrlError

SERVER_HINT = (
    "start the server with VLLM_SERVER_DEV_MODE=1 (vLLM's RL routes), e.g. "
    "VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --enable-prompt-tokens-details"
)


class ServerControl:
    """vLLM's RL routes at the server's root (``base_url`` without its ``/v1``)."""

    def __init__(self, base_url: str, timeout: float = 600.0, transport: httpx.BaseTransport | None = None):
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.root = root
        self.client = httpx.Client(base_url=root, timeout=httpx.Timeout(timeout, connect=10.0), transport=transport)

    def call(self, method: str, route: str, **kwargs: Any) -> Any:
        """The JSON answer of ``route`` (None for an empty one); an error naming the route otherwise."""
        url = f"{self.root}/{route}"
        try:
            reply = self.client.request(method, route, **kwargs)
        except httpx.TransportError as exc:
            raise EndpointError(f"cannot reach the generation server at {url}: {exc}") from exc
        if reply.status_code in (404, 405):
            raise OmrlError(f"the generation server has no {method} /{route} (HTTP {reply.status_code}); {SERVER_HINT}")
        if reply.status_code >= 300:
            raise EndpointError(f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}")
        if not reply.content:
            return None
        try:
            return reply.json()
        except ValueError as exc:
            raise EndpointError(f"{url} answered something that is not JSON: {reply.text[:300]!r}") from exc

    def post(self, route: str, body: Any = None, **params: Any) -> Any:
        return self.call("POST", route, json=body, params=params or None)

    def close(self) -> None:
        self.client.close()


def check_rpc(answer: Any, method: str) -> None:
    """A collective_rpc answers one result per worker; an error string from any is an error."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if answer is not None and not isinstance(results, list):
        raise EndpointError(f"the generation server's {method} answered {json.dumps(answer)[:300]}")
    for result in results or []:
        if result is not None:
            raise EndpointError(f"the generation server's {method} answered {str(result)[:300]}")
