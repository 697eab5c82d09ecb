"""The servers an OpenEnv env plays on: their URLs, checked, and whether any of them answers (asked before a
run's model loads, :meth:`omrl.envs.Env.check_reachable`)."""

from __future__ import annotations

import warnings
from typing import Any

from omrl.envs import EnvError
from omrl.errors import ConfigError

PROBE_SECONDS = 5.0  # how long a server that took the connection has to answer GET /health


def server_urls(base_url: Any) -> list[str]:
    """The servers' base URLs (http(s) or ws(s); a trailing ``/ws`` is the client's to add)."""
    import httpx

    urls = [base_url] if isinstance(base_url, str) else base_url
    if (
        not isinstance(urls, list)
        or not urls
        or not all(isinstance(u, str) and u.startswith(("http://", "https://", "ws://", "wss://")) for u in urls)
    ):
        raise ConfigError(
            f"plugins.openenv.base_url must be a server URL (http://host:port) or a list of them, got {base_url!r}"
        )
    out = []
    for url in urls:
        url = url.rstrip("/")
        url = url[:-3] if url.endswith("/ws") else url
        url = "http" + url[2:] if url.startswith("ws") else url  # ws:// -> http://, wss:// -> https://
        try:
            httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ConfigError(f"plugins.openenv.base_url {url!r} is not a valid URL: {exc}") from exc
        out.append(url)
    if len(set(out)) != len(out):
        raise ConfigError(f"plugins.openenv.base_url lists a server twice: {base_url!r}")
    return out


def check_servers(urls: list[str], connect_timeout: float) -> None:
    """EnvError when none of ``urls`` takes a connection (one ``GET /health`` each, no retries); a warning
    names those that do not, when others do, and one that took the connection but did not answer."""
    import httpx

    down, silent = {}, []
    for url in urls:
        try:
            httpx.get(f"{url}/health", timeout=httpx.Timeout(PROBE_SECONDS, connect=connect_timeout))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            down[url] = f"{type(exc).__name__}: {exc or 'no detail'}"
        except httpx.HTTPError:
            silent.append(url)  # it is there, only slow or odd: its episodes will say more
    if len(down) == len(urls):
        if len(urls) == 1:
            ((url, why),) = down.items()
            raise EnvError(f"openenv server {url}: GET /health failed: cannot connect ({why}); is the server running?")
        listed = "; ".join(f"{url}: {why}" for url, why in down.items())
        raise EnvError(
            f"none of the {len(urls)} openenv servers listed takes a connection ({listed}); are they running?"
        )
    if down:
        warnings.warn(
            f"openenv servers that take no connection: {', '.join(down)}; playing on the others", stacklevel=2
        )
    if silent:
        warnings.warn(
            f"openenv servers that took the connection but did not answer GET /health within {PROBE_SECONDS:g} s: "
            f"{', '.join(silent)}",
            stacklevel=2,
        )
