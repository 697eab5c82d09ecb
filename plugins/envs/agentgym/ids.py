"""The env ids this process's clients hold on each foreign AgentGym server (the restart ledger), and
one spelling of a server's address, so that clients spelling it differently share one ledger."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import socket
import threading

import httpx


@dataclasses.dataclass(eq=False)
class Claim:
    """One client's hold on a foreign server's env id; ``lost`` says why another may now share it."""

    env_id: int
    lost: str = ""


class IdLedger:
    """The env ids this process's clients hold on one foreign server, so what one client sees warns
    the others (a foreign server names no instance, so a restart is only seen in its ids).

    A create answering an id that a client here still holds means the server handed that env to
    someone else: the holder's episode is lost. On a server whose ids count up (every foreign
    server but those that hand out ids again, ``reuse_ids``), a create answering an id at or below
    the highest it had answered before the call was sent means it restarted: every id held here
    may now be another client's env, so every such episode is lost.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders: dict[int, Claim] = {}
        self.highest = -1  # the highest id the server answered a create here with
        self.restarts = 0  # restarts seen: a create sent before one is not compared with ``highest``

    def before_create(self) -> tuple[int, int]:
        """What a create about to be sent is compared with once answered: (highest id, restarts)."""
        with self.lock:
            return self.highest, self.restarts

    def claim(self, env_id: int, seen: tuple[int, int], counts_up: bool) -> Claim:
        """Hold ``env_id``, just answered by a create sent when the ledger stood at ``seen``."""
        highest, restarts = seen
        with self.lock:
            if counts_up and env_id <= highest and restarts == self.restarts:
                self.restarts += 1
                why = (
                    f"the server answered a create with env id {env_id}, not above the {highest} it had "
                    "handed out before: it restarted, numbering its ids from 0 again"
                )
                for held in self.holders.values():
                    held.lost = held.lost or why
                self.holders.clear()
                self.highest = env_id
            elif env_id in self.holders:
                held = self.holders.pop(env_id)
                held.lost = held.lost or f"the server handed env id {env_id} to another episode of this process"
            self.highest = max(self.highest, env_id)
            self.holders[env_id] = claim = Claim(env_id)
            return claim

    def release(self, claim: Claim) -> None:
        with self.lock:
            if self.holders.get(claim.env_id) is claim:
                del self.holders[claim.env_id]


_LEDGERS: dict[str, IdLedger] = {}
_LEDGERS_LOCK = threading.Lock()


def ledger(server: str) -> IdLedger:
    """The ledger of the server (:func:`server_key` and route prefix) ``server``, shared by this process's clients."""
    with _LEDGERS_LOCK:
        return _LEDGERS.setdefault(server, IdLedger())


def server_key(base_url: str) -> str:
    """The server ``base_url`` names, spelled one way, so that the clients of one process that spell
    it differently share one ledger: the scheme, the host, the port (80 or 443 when unsaid) and the
    path without a trailing slash. A host name is resolved: every name or address of this machine
    (``localhost``, ``127.0.0.1``, ``::1``, ``0.0.0.0``, its own host name) is one host, and any
    other host is the set of addresses it resolves to (its name, when it does not resolve)."""
    url = httpx.URL(base_url)
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    return f"{url.scheme}://{_host_key(url.host, port)}:{port}{url.path.rstrip('/')}"


@functools.lru_cache(maxsize=256)
def _host_key(host: str, port: int | None) -> str:
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        addresses = _resolved(host, port)
        if not addresses:
            return host.lower()
    if any(_on_this_machine(address) for address in addresses):
        return "this-machine"
    return ",".join(sorted(str(address) for address in addresses))


def _resolved(host: str, port: int | None) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` resolves to (none when it does not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    out = set()
    for info in infos:
        try:
            out.add(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))  # no IPv6 zone
        except ValueError:
            pass
    return out


def _on_this_machine(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    address = mapped or address
    return address.is_loopback or address.is_unspecified or address in _own_addresses()


@functools.lru_cache(maxsize=1)
def _own_addresses() -> frozenset:
    """The addresses this machine's host name resolves to."""
    return frozenset(_resolved(socket.gethostname(), None))
