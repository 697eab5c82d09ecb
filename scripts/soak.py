"""Fault-injection soak: real episodes through the `agentgym` client against faulty env servers.

    python scripts/soak.py --episodes 300 --seed 0

Each server is `omrl env serve gridworld` or, every other one, a gridworld server that behaves as
AgentGym's do (:func:`agentgym_like_app`: ids from 0 at each start, a bare ``false`` under HTTP 200
for an id it does not hold, no instance name), run by uvicorn in a thread of this process on
127.0.0.1 only and wrapped in a layer that injects faults at random: answers HTTP 500 or garbage or
``{"error": ...}``, loses an answer after the env acted, slows down, or puts NaN, infinities and
mistyped values into step answers. Meanwhile a chaos thread kills servers (a new one comes up on
the same port, as a restarted process would) and pauses them (every request waits, longer than
the client's timeout at times), and every server restarts once right after answering its 6th step
(``--mid-episode-after``), so episodes are sure to be cut mid-way while new ones start. Episodes
are played by omrl's own rollout loop (`collect`, as training does) with a random policy or the
served env's expert.

Invariants checked (the script exits 1 when one breaks, naming it):

- every requested episode comes back: finished (any end but ``env_error``) or failed
  (``env_error``) with a non-empty reason;
- a finished episode's rewards and score are finite numbers and ``won`` is a boolean;
- no client ever acts on an env that another client created: the fault layer records which
  client created each env id of each start of a server, and which client each call about an id comes
  from; a call the server refuses as not its env (410 from omrl's server, ``false`` from an
  AgentGym-like one) does not count, nor does a read (``GET /observation``: the very check with
  which a client finds that a restart gave its id to another client's env).

Every loop is bounded: episodes by ``--episodes``, each batch by a deadline, the chaos thread by
the run's end, every HTTP call by the client's timeout and retries.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Sequence
from urllib.parse import parse_qs

import uvicorn

from omrl.backends.base import Backend
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.serve import create_app
from omrl.templates import ParsedAction, Template
from omrl_plugins.envs.agentgym import AgentGymEnv
from omrl_plugins.envs.gridworld import GridWorld

CLIENT_HEADER = "x-soak-client"
ID_ROUTES = ("/reset", "/step", "/close", "/observation", "/expert_action", "/available_actions")
MOVES = ("up", "down", "left", "right")
#: what a fault draw can give, with its weight (the fault rate sets how often a draw happens)
FAULTS = {"http500": 3, "garbage": 2, "error": 2, "nonfinite": 3, "lost": 2, "slow": 4}
NONFINITE = (
    {"reward": float("nan")},
    {"reward": float("inf")},
    {"score": float("-inf")},
    {"done": "yes"},
    {"won": 1},
    {"reward": "0.5"},
)
#: failure reasons, grouped by the first of these words their message holds
REASON_KINDS = (
    "another client's env",
    "answered false",
    "restarted",
    "no longer knows",
    "is over",
    "cannot connect",
    "timed out",
    "Timeout",
    "not JSON",
    "finite number",
    "true or false",
    "HTTP 500",
    "injected",
    "not resent",
    "malformed",
)


@dataclass
class Chaos:
    """What the fault layers share: the random draws, what was injected, who created which env."""

    rng: random.Random
    fault_rate: float
    counts: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)  # (server, env id) -> client
    paused_until: dict[int, float] = field(default_factory=dict)  # port -> monotonic time
    lock: threading.Lock = field(default_factory=threading.Lock)
    mid_episode_after: int = 0  # each server restarts right after answering this many steps (0: never)
    steps: Counter = field(default_factory=Counter)  # server name -> steps it answered over all its starts

    def stepped(self, server: str) -> bool:
        """Count a step ``server`` answered; True for the one after which it restarts mid-episode."""
        with self.lock:
            self.steps[server] += 1
            return self.steps[server] == self.mid_episode_after

    def draw(self, path: str) -> str | None:
        """The fault for one request, or None."""
        with self.lock:
            if self.rng.random() >= self.fault_rate:
                return None
            kinds = [k for k in FAULTS if k != "nonfinite" or path == "/step"]
            fault = self.rng.choices(kinds, [FAULTS[k] for k in kinds])[0]
            self.counts[fault] += 1
            return fault

    def uniform(self, low: float, high: float) -> float:
        with self.lock:
            return self.rng.uniform(low, high)

    def nonfinite(self) -> dict[str, Any]:
        with self.lock:
            return dict(self.rng.choice(NONFINITE))

    def created(self, server: str, env_id: int, client: str) -> None:
        with self.lock:
            self.owners[(server, env_id)] = client

    def used(self, server: str, env_id: int, client: str, what: str) -> None:
        """A call by ``client`` reached env ``env_id`` of ``server`` (a port and which start of it)."""
        with self.lock:
            owner = self.owners.get((server, env_id))
            if owner is not None and owner != client:
                self.violations.append(
                    f"client {client} reached env {env_id} of server {server} ({what}), which client {owner} created"
                )


class FaultyApp:
    """ASGI layer around an env server's app: injects faults and records who uses which env."""

    def __init__(self, inner, chaos: Chaos, port: int, incarnation: str, server: str = "", restart=None):
        self.inner = inner
        self.chaos = chaos
        self.port = port
        self.incarnation = incarnation  # which start of the server: ids are numbered per start
        self.server = server  # which server, over all its starts
        self.restart = restart  # called (from a thread of its own) to restart this server mid-episode

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        body = await _read_body(receive)
        path = scope["path"]
        while time.monotonic() < self.chaos.paused_until.get(self.port, 0.0):  # a paused (SIGSTOPped) server
            await asyncio.sleep(0.02)
        fault = self.chaos.draw(path)
        if fault == "slow":
            await asyncio.sleep(self.chaos.uniform(0.02, 0.25))
        if fault in ("http500", "garbage", "error"):  # answered before the env ever sees the request
            return await _send(send, *_canned(fault))
        status, headers, payload = await _call(self.inner, scope, body, receive)
        self._record(scope, body, status, payload)
        if fault == "lost":  # the env acted, the answer is lost
            return await _send(send, *_canned("http500"))
        if fault == "nonfinite" and status == 200:
            answer = {**json.loads(payload), **self.chaos.nonfinite()}
            return await _send(send, status, b"application/json", json.dumps(answer, allow_nan=True).encode())
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _record(self, scope, body: bytes, status: int, payload: bytes) -> None:
        headers = dict(scope["headers"])
        client = headers.get(CLIENT_HEADER.encode(), b"?").decode()
        if scope["path"] == "/create" and status == 200:
            self.chaos.created(self.incarnation, json.loads(payload)["id"], client)
            return
        if scope["path"] == "/step" and status == 200 and self.restart and self.chaos.stepped(self.server):
            self.chaos.counts["mid-episode restart"] += 1
            threading.Thread(target=self.restart, name="soak-restart", daemon=True).start()
        if scope["path"] not in ID_ROUTES or status == 410 or payload.strip() == b"false":  # refused: not its env
            return
        if scope["method"] == "GET":  # a read acts on nothing (and is how a client checks its env is its own)
            return
        env_id = _id_of(scope, body)
        if env_id is not None:
            self.chaos.used(self.incarnation, env_id, client, f"{scope['method']} {scope['path']} -> {status}")


async def _read_body(receive) -> bytes:
    chunks = []
    for _ in range(100_000):  # bounded: the server caps bodies far below this many chunks
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            break
    return b"".join(chunks)


async def _call(app, scope, body: bytes, receive) -> tuple[int, list, bytes]:
    """Run ``app`` on the request; its answer as (status, headers, body)."""
    sent: list[dict] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay():
        return pending.pop() if pending else await receive()

    async def capture(message):
        sent.append(message)

    await app(scope, replay, capture)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], start.get("headers", []), b"".join(m.get("body", b"") for m in sent[1:])


async def _send(send, status: int, content_type: bytes, payload: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _canned(fault: str) -> tuple[int, bytes, bytes]:
    if fault == "http500":
        return 500, b"text/plain", b"Internal Server Error"
    if fault == "garbage":
        return 200, b"text/html", b"<html><body>502 Bad Gateway</body></html>"
    return 200, b"application/json", b'{"error": "injected: the env is busy"}'


def _id_of(scope, body: bytes) -> int | None:
    """The env id a call is about (the JSON body's ``id``, or the query's)."""
    try:
        value = json.loads(body)["id"] if body else parse_qs(scope["query_string"].decode())["id"][0]
        return int(value)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def agentgym_like_app(options: dict[str, Any]):
    """A gridworld server that behaves as AgentGym's servers do where restarts matter: ids from 0 at
    each start, a bare ``false`` under HTTP 200 for an id it does not hold, ``{"error"}`` under 200
    when the env raises, no instance name (a client cannot tell a restart by name). It also answers
    ``GET /tasks`` and ``GET /expert_action`` as omrl's server does, so the client needs no splits
    and the expert can play, and ``GET /observation`` (each env's latest observation) as AgentGym's
    servers do, so the client can check that its id still holds its env after a restart another
    process saw. ``app.state.envs.ids()`` lists the live ids, as on omrl's server."""
    from fastapi import Body, FastAPI

    app = FastAPI()
    app.state.envs = envs = _LiveEnvs()
    ids, lock, catalog = itertools.count(), threading.Lock(), GridWorld(**options)
    latest: dict[int, str] = {}  # each env's latest observation, as AgentGym's servers keep it

    def played(body: dict[str, Any], call) -> Any:
        env = envs.get(body.get("id")) if isinstance(body, dict) else None
        if env is None:
            return False
        try:
            return call(env)
        except Exception as exc:  # noqa: BLE001 - AgentGym's servers answer a raise so
            return {"error": f"{type(exc).__name__}: {exc}"}

    @app.post("/create")
    def create(body: Any = Body(None)):
        with lock:
            env_id = next(ids)
            envs[env_id] = GridWorld(**options)
            latest[env_id] = ""
        return {"id": env_id, "observation": "", "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: Any = Body(None)):
        def start(env):
            first = env.reset(int(body["data_idx"]))
            latest[body["id"]] = first.text
            return {
                "id": body["id"],
                "observation": first.text,
                "instruction": first.instruction,
                "done": False,
                "reward": 0,
            }

        return played(body, start)

    @app.post("/step")
    def step(body: Any = Body(None)):
        def move(env):
            r = env.step(str(body["action"]))
            latest[body["id"]] = r.observation
            return {"observation": r.observation, "reward": r.reward, "done": r.done, "won": r.won, "score": r.score}

        return played(body, move)

    @app.get("/observation")
    def observation(id: int):
        return played({"id": id}, lambda env: latest[id])

    @app.get("/expert_action")
    def expert_action(id: int):
        return played({"id": id}, lambda env: {"action": env.expert_action()})

    @app.post("/close")
    def close(body: Any = Body(None)):
        return envs.pop(body.get("id"), None) is not None if isinstance(body, dict) else False

    @app.get("/tasks")
    def tasks(split: str | None = None):
        if split is None:
            return {
                "env": "gridworld",
                "splits": {s: len(catalog.split_of(s)) for s in catalog.splits},
                "action_help": catalog.action_help,
                "max_turns": catalog.max_turns,
            }
        ids = catalog.split_of(split)
        if isinstance(ids, range):
            return {"split": split, "range": [ids.start, ids.stop, ids.step]}
        return {"split": split, "task_ids": [int(t) for t in ids]}

    return app


class _LiveEnvs(dict):
    def ids(self) -> list[int]:
        return sorted(self)


class Server:
    """One env server on a fixed loopback port that can be killed and started again: ``omrl env
    serve`` (kind ``omrl``) or :func:`agentgym_like_app` (kind ``agentgym``)."""

    def __init__(self, name: str, chaos: Chaos, options: dict[str, Any], kind: str = "omrl"):
        self.name = name
        self.chaos = chaos
        self.options = options
        self.kind = kind
        self.port = 0
        self.starts = 0
        self.app: FaultyApp | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the chaos thread and the driver may both restart it

    def restart(self, down: float) -> None:
        """Kill the server, leave it down for ``down`` seconds (connections refused), start a new one."""
        with self._lock:
            self.kill()
            time.sleep(down)
            self.start()
            self.chaos.counts["restart"] += 1

    def start(self) -> None:
        """A fresh server process, as it were: a new app, so new envs (an AgentGym-like one numbers
        them from 0 again; omrl's, above every earlier start's) and a new instance."""
        self.starts += 1
        label = f"{self.name} ({self.kind}) start {self.starts}"
        inner = create_app("gridworld", self.options) if self.kind == "omrl" else agentgym_like_app(self.options)
        self.app = app = FaultyApp(inner, self.chaos, self.port, label, self.name, lambda: self.restart(down=0.05))
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="soak-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the env server did not start on 127.0.0.1:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        app.port = self.port

    def live_envs(self) -> int:
        """Envs the running server holds (ids created and never closed)."""
        return len(self.app.inner.state.envs.ids()) if self.app is not None else 0

    def kill(self) -> None:
        """Stop at once: requests in flight are cut off, envs are gone."""
        if self._server is not None:
            self._server.should_exit = self._server.force_exit = True
            self._thread.join(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def chaos_monkey(servers: list[Server], chaos: Chaos, stop: threading.Event, interval: float) -> None:
    """Kill and restart or pause a random server now and then, until ``stop``.

    The first two events are a restart and a pause, so that even a short soak sees both.
    """
    for event in range(1_000_000):  # bounded; ``stop`` ends it long before
        if stop.wait(chaos.uniform(0.5, 1.5) * interval):
            return
        server = servers[int(chaos.uniform(0, len(servers)))]
        roll = (0.0, 0.6)[event] if event < 2 else chaos.uniform(0, 1)
        if roll < 0.5:
            server.restart(down=chaos.uniform(0.0, 0.4))
        elif roll < 0.8:
            chaos.paused_until[server.port] = time.monotonic() + chaos.uniform(0.2, 1.2)
            chaos.counts["pause"] += 1


@dataclass
class Report:
    """What a soak did and which invariants broke."""

    requested: int = 0
    left_open: int = 0  # envs still held by the servers at the end (say, a /create whose answer was lost)
    ends: Counter = field(default_factory=Counter)  # end_reason -> episodes
    failed_without_reason: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # reason kind -> its first message
    faults: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def finished(self) -> int:
        return sum(n for end, n in self.ends.items() if end != "env_error")

    @property
    def failed(self) -> int:
        return self.ends["env_error"]

    def lines(self) -> list[str]:
        ends = ", ".join(f"{end} {n}" for end, n in sorted(self.ends.items()) if end != "env_error")
        out = [
            f"episodes: {self.requested} requested = {self.finished} finished ({ends}) + {self.failed} failed "
            f"with a reason ({self.failed_without_reason} without one), in {self.seconds:.1f} s",
            "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())),
            "failure reasons: " + ", ".join(f"{k} {n}" for k, n in self.reasons.most_common()),
            f"envs left open on the servers after every client closed: {self.left_open}",
        ]
        out += [f"  e.g. {kind}: {message[:300]}" for kind, message in sorted(self.examples.items())]
        if self.violations:
            out += [f"INVARIANT BROKEN ({len(self.violations)}):"] + [f"  {v}" for v in self.violations[:20]]
        else:
            out.append("invariants: all hold")
        return out


def check_batch(report: Report, requested: int, episodes: Sequence[Any]) -> None:
    """Count a batch's episodes and check the episode invariants."""
    report.requested += requested
    if len(episodes) != requested:
        report.violations.append(f"{requested} episodes requested, {len(episodes)} came back")
    for ep in episodes:
        report.ends[ep.end_reason] += 1
        if ep.end_reason == "env_error":
            if not (ep.error or "").strip():
                report.failed_without_reason += 1
                report.violations.append(f"task {ep.task_id}: env_error without a reason")
            kind = next((k for k in REASON_KINDS if k in (ep.error or "")), "other")
            report.reasons[kind] += 1
            report.examples.setdefault(kind, ep.error or "")
            continue
        values = [t.reward for t in ep.turns] + [ep.score]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values) or not isinstance(ep.won, bool):
            report.violations.append(
                f"task {ep.task_id} finished ({ep.end_reason}) with rewards {values} and won {ep.won!r}"
            )


def cli_option(default: Any, help: str) -> Any:
    """A plan field that ``main`` offers as ``--name`` (its help says what it does)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class SoakPlan:
    """What one soak plays: each field with a help is a command-line option of the same name."""

    episodes: int = cli_option(300, "episodes to play (rounded up to even)")
    seed: int = cli_option(0, "seeds the faults, tasks and policy")
    servers: int = cli_option(2, "env servers, each with its own clients")
    fault_rate: float = cli_option(0.1, "share of requests that get a fault")
    timeout: float = cli_option(0.5, "the client's timeout per HTTP call (s)")
    chaos_interval: float = cli_option(1.0, "mean seconds between kills/pauses")
    kinds: tuple[str, ...] = cli_option(
        ("omrl", "agentgym"), "server kinds, taken in turn: omrl (omrl env serve), agentgym (AgentGym-like)"
    )
    mid_episode_after: int = cli_option(
        6, "each server restarts once, right after answering this many steps (0: never)"
    )
    batch: int = 16
    batch_seconds: float = 120.0
    pools_per_server: int = 2


def soak(plan: SoakPlan, tokenizer: Any = None) -> Report:
    """Play ``plan.episodes`` episodes against ``plan.servers`` faulty servers; the counts and broken invariants.

    Server ``n`` is of kind ``kinds[n % len(kinds)]``. Each server has ``pools_per_server`` sets of
    clients (rollout pools kept across batches, as trainers sharing a server keep them); each pool
    plays one batch at a time, all at once,
    and between rounds a server is sometimes restarted, as one might be between two training
    steps. Each server restarts once right after answering its ``mid_episode_after``-th step (0: no
    such restart), while other episodes are mid-way and new ones start (half a batch plays at once):
    early, while the ids held are low, so the new start soon hands them out again.
    """
    tokenizer = tokenizer or _tiny_tokenizer()
    rng = random.Random(plan.seed)
    chaos = Chaos(random.Random(plan.seed + 1), plan.fault_rate, mid_episode_after=plan.mid_episode_after)
    farm = [
        Server(f"server {n}", chaos, {"max_turns": 8}, plan.kinds[n % len(plan.kinds)]) for n in range(plan.servers)
    ]
    for server in farm:
        server.start()
    report, started, stop = Report(), time.monotonic(), threading.Event()
    monkey = threading.Thread(target=chaos_monkey, args=(farm, chaos, stop, plan.chaos_interval), daemon=True)
    monkey.start()
    pools = [
        EnvPool(
            _client_class(f"{n}.{k}."),
            {"base_url": s.url, "env_name": "gridworld", "timeout": plan.timeout, "retries": 2, "backoff": 0.02},
            name="agentgym",
            num_workers=8,
        )
        for n, s in enumerate(farm)
        for k in range(plan.pools_per_server)
    ]
    try:
        plans = _plan(plan.episodes, plan.batch)
        for first in range(0, len(plans), len(pools)):
            seeds = [rng.randrange(1 << 30) for _ in plans[first : first + len(pools)]]
            if not _play_round(
                report, pools, plans[first : first + len(pools)], first, seeds, tokenizer, plan.batch_seconds
            ):
                break  # a batch hung: its threads are daemons, the report says so
            if rng.random() < 0.3:
                farm[rng.randrange(len(farm))].restart(down=rng.uniform(0.0, 0.2))
        for pool in pools:
            pool.close()
        stop.set()
        monkey.join(timeout=60)  # no restart while the servers are counted
        report.left_open = sum(server.live_envs() for server in farm)
    finally:
        stop.set()
        monkey.join(timeout=60)
        for server in farm:
            server.kill()
        report.faults = Counter(chaos.counts)
        report.violations += chaos.violations
        report.seconds = time.monotonic() - started
    return report


def _client_class(prefix: str = "") -> type[AgentGymEnv]:
    """The agentgym client, numbering its instances in a header (after ``prefix``, one per pool) so
    the servers can tell clients apart."""
    numbers = itertools.count()

    class SoakClient(AgentGymEnv):
        def __init__(self, **options: Any):
            super().__init__(headers={CLIENT_HEADER: f"{prefix}{next(numbers)}"}, **options)

    return SoakClient


def _play_round(
    report: Report, pools: list, sizes: list[int], first: int, seeds: list[int], tokenizer: Any, batch_seconds: float
) -> bool:
    """One batch per pool, in parallel threads; False when one did not finish in ``batch_seconds``."""
    outcomes: list[Any] = [None] * len(sizes)
    threads = [
        threading.Thread(
            target=_play_batch, args=(outcomes, i, pool, size, (first + i) % 3 == 2, seed, tokenizer), daemon=True
        )
        for i, (pool, size, seed) in enumerate(zip(pools, sizes, seeds))
    ]
    for thread in threads:
        thread.start()
    for i, thread in enumerate(threads):
        thread.join(timeout=batch_seconds)
        if thread.is_alive():
            report.violations.append(f"batch {first + i} did not finish within {batch_seconds:.0f} s")
            return False
        if isinstance(outcomes[i], BaseException):
            report.requested += sizes[i]
            report.violations.append(f"batch {first + i} raised {type(outcomes[i]).__name__}: {outcomes[i]}")
        else:
            check_batch(report, sizes[i], outcomes[i])
    return True


def _play_batch(outcomes: list, index: int, pool, size: int, expert: bool, seed: int, tokenizer: Any) -> None:
    """``size`` episodes (``size // 2`` gridworld test tasks, twice each) by the rollout loop."""
    tasks = random.Random(seed).sample(list(GridWorld().split_of("test")), size // 2)
    backend = None if expert else RandomPolicy(tokenizer, random.Random(seed))
    limits = RolloutLimits(max_new_tokens=24, max_context=4096, max_turns=8)
    try:
        outcomes[index] = collect(
            pool,
            ActionTemplate(),
            tokenizer,
            tasks,
            backend=backend,
            limits=limits,
            split="test",
            group_size=2,
            seed=seed,
            expert=expert,
            max_parallel=max(1, size // 2),
        )  # episodes start while others play
    except BaseException as exc:  # noqa: BLE001 - the report names it as a broken invariant
        outcomes[index] = exc


def _plan(episodes: int, batch: int) -> list[int]:
    """Batch sizes, even (each task is played twice), adding up to ``episodes`` rounded up to even."""
    total, size = episodes + episodes % 2, max(2, batch - batch % 2)
    return [size] * (total // size) + ([total % size] if total % size else [])


def _tiny_tokenizer():
    from omrl.models import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("tiny"))


class ActionTemplate(Template):
    """Replies are ``Action: <move>`` (defined here so the soak needs no template plugin)."""

    def system_prompt(self, env) -> str:
        return f"You play a text game. {env.action_help} Reply with `Action: <move>`."

    def parse(self, response: str, env) -> ParsedAction:
        text = response.strip()
        if text.startswith("Action:") and text[len("Action:") :].strip():
            return ParsedAction(text[len("Action:") :].strip(), True)
        return ParsedAction(None, False, error="the reply must start with `Action:`")

    def format_action(self, action: str, env, thought: str = "") -> str:
        return f"Action: {action}"


class RandomPolicy(Backend):
    """A backend that answers a random move, now and then an unparsable reply."""

    name = "random"

    def __init__(self, tokenizer, rng: random.Random):
        super().__init__(tokenizer)
        self.rng = rng

    def generate(self, prompts, params, messages=None):
        out = []
        for i in range(len(prompts)):
            text = f"Action: {self.rng.choice(MOVES)}" if self.rng.random() < 0.9 else "I am not sure."
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_token_id]
            out.append(self._cut(ids, [-1.0] * len(ids), params.limit(i)))
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in fields(SoakPlan):
        if "help" in option.metadata:
            default = option.default
            kind = str if isinstance(default, tuple) else type(default)
            shown = ",".join(default) if isinstance(default, tuple) else default
            flag = "--" + option.name.replace("_", "-")
            parser.add_argument(flag, type=kind, default=shown, help=option.metadata["help"])
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if args.episodes < 1 or args.servers < 1 or not 0 <= args.fault_rate <= 1:
        parser.error("--episodes and --servers must be >= 1, --fault-rate in [0, 1]")
    if not kinds or set(kinds) - {"omrl", "agentgym"} or args.mid_episode_after < 0:
        parser.error("--kinds takes omrl and agentgym, comma-separated; --mid-episode-after must be >= 0")
    report = soak(SoakPlan(**{**vars(args), "kinds": kinds}))
    print("\n".join(report.lines()))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
