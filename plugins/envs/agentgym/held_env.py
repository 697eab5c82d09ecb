"""The env id an ``agentgym`` client holds on its server, and the checks that it is still this client's env.

Env ids and server restarts: a restarted server numbers its ids from 0 again, so an id kept from
before the restart may now be another client's env. An ``omrl env serve`` server names its
instance in the ``/create`` answer; the client sends that name with every call about the id, and
a restarted server refuses it (HTTP 410) instead of acting on another client's env, so such an id
is kept across episodes. A foreign server cannot tell, so its ids live one episode: ``reset``
creates a new env, and an episode's env is closed the moment it ends (``AgentGymEnv.end_episode``, which
the rollout's pool calls for episodes cut short by a turn cap too), where a refused close (the
server no longer knew the id: it restarted, or another client closed it) makes a finished
episode's last step an EnvError, since another client may have shared the env. A bare ``false``
(AgentGym's answer for an id it does not hold) is such a refusal. The clients of one process share
what they see of a foreign server's ids: a create answered with an id one of them holds, or (ids
counting up) one not above an id answered before, means the server restarted or handed the env
out again, and the holder's next call (a step, a retry, a close) becomes an EnvError instead of
reaching the other client's env. One process's clients share one ledger of a server however its
URL is spelled (:func:`server_key`: ``127.0.0.1``, ``localhost``, ``::1`` and this machine's host
name are one host).

A restart whose new ids go to another process's clients first is not in any answer this process
gets, so the env itself is asked: AgentGym's servers keep each env's latest observation (the one
the last create, reset or step answered) and answer it at ``GET /observation?id=N`` (textcraft,
babyai with its goal line first, sciworld, alfworld, maze and wordle under their prefix; a server
of any other name is asked too when it names no instance). Before
every step (and every resend of one), before closing an unfinished episode's env, and before
resetting a kept id, the client reads it: anything but the last observation the server answered
this client means another client's create, reset or step reached the env, and the call is not
sent: the step raises EnvError (the episode ends ``env_error``, never trained on nor counted), a
close is skipped (the env is another client's now). Right after each reset the route must answer
the reset's own observation, or the server is refused with a ConfigError (a server without the
route, or whose route answers something else), unless ``accept_shared_server_risk`` (then that
client plays unchecked). A known server without such a route (searchqa, the tool envs, webarena)
is refused at its first create unless ``accept_shared_server_risk``; WebShop and SQLGym draw random
ids, which a restart hardly hands out again, and are played unchecked. The check costs one GET
per step (about a millisecond on loopback). What it cannot see: another client's env in the very
state this client left (e.g. the same task just reset, nothing played yet), and a restart between
the check and the step a moment later.

Servers without ``/close`` (WebShop, SQLGym, ALFWorld, LMRL-Gym, the tool envs) are never sent one and
then keep one env per episode in memory; ``reuse_ids=true`` trades that for the risk above (and
compares created ids only with held ones). It is the default for WebShop and SQLGym, which hand
out live ids again once they hold 8,000 and 8 envs (one env per episode would soon make two
clients share one) and draw random ids, which a restart hardly hands to another client. A server
answering a close with a bare 404 or 405 (no such route) is not sent another.
A step answered 404 or 410 names the lost id in its EnvError. An id dropped after a failure on
an omrl server is closed at the next ``reset`` or ``close`` (the instance name makes that safe),
so timeouts do not leak envs there.
"""

from __future__ import annotations

from typing import Any

from omrl.envs import EnvError
from omrl.errors import ConfigError
from omrl.serve import INSTANCE_HEADER
from omrl_plugins.envs.agentgym.dialects import ServerSpec, observed, same_env
from omrl_plugins.envs.agentgym.ids import Claim, ledger, server_key
from omrl_plugins.envs.agentgym.transport import HttpTransport, ServerFailure, ServerRefused, snippet

GONE = (404, 410)  # statuses that say the server no longer has the env id
MAX_ORPHANS = 32  # dropped omrl ids remembered for closing (a server down for long drops more)


class HeldEnv:
    """The env id one client holds on the server and the episode in play on it: every call about the id
    goes through :meth:`call`, which checks first that the env is still this client's. Of ``spec`` it
    reads only what an omrl server's answers leave as they are (routes, the observation check)."""

    def __init__(self, server: HttpTransport, spec: ServerSpec, env_name: str, accept_risk: bool):
        self.server, self.spec, self.env_name = server, spec, env_name
        self.accept_risk = accept_risk
        self.id_key = spec.dialect  # the body/query key naming the env id: "id" or "env_idx"
        # checking that an env id still holds this client's env (a foreign server's observation route)
        self.checks = spec.observation_route is not None
        self.has_close = spec.has_close  # False once the server turns out to lack /close
        self.ledger = ledger(server_key(server.base_url) + spec.route_prefix)
        self.id: int | None = None
        self.instance: str | None = None  # the omrl server instance that handed out the id
        self.claim: Claim | None = None  # this client's hold on a foreign server's id
        self.seen: str | None = None  # the last observation the server answered about this env
        self.first_seen = ""  # the episode's first observation
        self.orphans: list[tuple[int, str]] = []  # dropped omrl ids to close: (id, instance)
        self.started = False
        self.done = False

    def route(self, path: str) -> str:
        return self.spec.route_prefix + path

    def call(self, method: str, path: str, body: dict | None = None, checked: bool = False, **kw: Any) -> Any:
        """A call about this instance's env id (in the body for POST, the query for GET), naming the
        omrl server instance that handed it out, so a restarted server refuses it. Before each
        attempt the ledger is asked whether the id may be another client's now; ``checked``: the env
        itself too (:meth:`check_ours`), for calls that act on it."""
        headers = {INSTANCE_HEADER: self.instance} if self.instance else None
        what = f"{method} {self.route(path)}"
        if checked:
            check = lambda: self.check_ours(what)  # noqa: E731
        else:
            check = None if self.claim is None else lambda: self.check_claim(what)
        if method == "GET":
            return self.server.call(
                method, self.route(path), params={self.id_key: self.id}, headers=headers, before_send=check, **kw
            )
        return self.server.call(
            method,
            self.route(path),
            body={self.id_key: self.id, **(body or {})},
            headers=headers,
            before_send=check,
            **kw,
        )

    def check_claim(self, what: str) -> None:
        """EnvError when another client may now share this episode's env (the ledger saw the server
        hand its id out again); the id is forgotten unclosed, since closing it would end that client's env."""
        if self.claim is None or not self.claim.lost:
            return
        env_id, why = self.id, self.claim.lost
        self.drop(gone=True)
        raise EnvError(
            self.server.message(
                what, f"env id {env_id} may now be another client's env ({why}); this episode is not trusted"
            )
        )

    def check_ours(self, what: str) -> None:
        """Before a call that acts on the env id (a step, a close, the reset of a kept id): EnvError
        when another client may now share the env. The ledger says what this process saw; on a
        foreign server with an observation route the env itself says the rest: its latest
        observation there must be the last one the server answered this client, else a create,
        reset or step of another client reached it since (a restart that only another process saw
        hands this id to that process's next env). The id is then forgotten unclosed."""
        self.check_claim(what)
        if not self.checks or self.instance is not None or self.seen is None or self.id is None:
            return
        env_id, route = self.id, self.route(self.spec.observation_route or "")
        try:
            answer = self.server.call("GET", route, params={self.id_key: env_id}, json_answer=False)
        except ServerRefused as exc:
            self.drop(gone=True)  # never closed: the number may be another client's env by then
            raise ServerRefused(
                self.server.message(
                    what, f"not sent: checking env id {env_id} first was refused ({self._detail(exc)})"
                ),
                exc.status,
                error_body=exc.error_body,
                unknown_id=exc.unknown_id,
            ) from exc
        now = observed(answer)
        if not same_env(self.spec, now, self.seen, self.first_seen):
            seen = self.seen
            self.drop(gone=True)
            raise EnvError(
                self.server.message(
                    what,
                    f"not sent: env id {env_id} may now be another client's env: its observation on the server "
                    f"is {snippet(now)}, not {snippet(seen)}, the last one the server answered this client (a "
                    "restart that only another process saw hands the id to that process's next env); this "
                    "episode is not trusted",
                )
            )

    def check_route(self) -> None:
        """After a reset on a foreign server whose env ids are checked: its observation route must
        answer the observation the reset just answered, or the check could not tell another client's
        env from this one. A server without the route, or whose route answers something else, is
        refused unless ``accept_shared_server_risk`` (then this client plays unchecked)."""
        if not self.checks or self.instance is not None or self.id is None or self.seen is None:
            return
        route = self.route(self.spec.observation_route or "")
        try:
            answer = self.server.call("GET", route, params={self.id_key: self.id}, json_answer=False)
        except ServerRefused as exc:
            if exc.error_body:  # the server's own error about the env: gone already, or another's
                self.drop(gone=True)
                raise
            problem = str(exc)  # no such route (a 404, 405 or 422 without an error body)
        else:
            if same_env(self.spec, observed(answer), self.seen, self.first_seen):
                return
            problem = self.server.message(
                f"GET {route}",
                f"answered {snippet(observed(answer))}, not the observation the reset had just answered "
                f"({snippet(self.seen)})",
            )
        if self.accept_risk:
            self.checks = False  # played unchecked, as accepted
            return
        self.close(check=False)
        raise self.shared_risk(f"{problem}: this server's env ids cannot be checked")

    def _detail(self, exc: EnvError) -> str:
        """``exc``'s message without the server's name (for a message that names it already)."""
        return str(exc).removeprefix(f"agentgym server {self.server.base_url}: ")

    def shared_risk(self, why: str) -> ConfigError:
        """The refusal of a foreign server whose env ids cannot be checked, saying why and what to do."""
        return ConfigError(
            f"agentgym env {self.env_name!r}: {why}. A restarted AgentGym server numbers its env ids from "
            "0 again: when only another process sharing it (another trainer, rank or eval) sees the "
            "restart, that process's next env gets this client's id, and this client would play, score "
            "and train on it. Give each process its own server, or set "
            "plugins.agentgym.accept_shared_server_risk: true to play it anyway"
        )

    def forget(self) -> None:
        """No env id any more (and no hold on it in the ledger)."""
        if self.claim is not None:
            self.ledger.release(self.claim)
        self.id, self.instance, self.claim = None, None, None
        self.seen, self.first_seen = None, ""

    def drop(self, gone: bool = False) -> None:
        """Forget the env id after a failure; an omrl server's id that may live on is kept for
        closing later (its instance name makes that safe even after a restart)."""
        if self.id is not None and not gone and self.instance is not None and self.has_close:
            self.orphans = [*self.orphans, (self.id, self.instance)][-MAX_ORPHANS:]
        self.forget()
        self.started = False

    def close(self, check: bool = True) -> None:
        """Close the env id, best effort: the server may be gone, and it frees ids on restart. An id
        that may be another client's env now (the ledger saw it handed out again, or, for an unfinished
        episode, the env's observation on the server is not this client's last) is not closed."""
        if check and self.id is not None and self.has_close and not self.done:
            try:
                self.check_ours(f"POST {self.route('/close')}")
            except EnvError:
                self.forget()  # (forgotten already, unless the server could not be reached)
                return
        env_id, instance, lost = self.id, self.instance, self.claim is not None and self.claim.lost
        self.forget()
        if env_id is not None and self.has_close and not lost:
            try:
                self.close_on_server(env_id, instance)
            except EnvError:
                pass

    def close_orphans(self) -> None:
        orphans, self.orphans = self.orphans, []
        for env_id, instance in orphans:
            try:
                self.close_on_server(env_id, instance)
            except EnvError:
                pass  # gone already, or the server is down: a restart frees it

    def close_on_server(self, env_id: int, instance: str | None) -> None:
        """``POST /close`` for ``env_id``, tried once; refusals and failures raise EnvError.

        Any answer but an error is a success: servers answer a bool, an object or (WebArena) text.
        """
        headers = {INSTANCE_HEADER: instance} if instance else None
        self.server.call(
            "POST", self.route("/close"), body={self.id_key: env_id}, headers=headers, retry=False, json_answer=False
        )

    def close_finished(self, env_id: int) -> None:
        """Close a finished episode's env on a server whose ids live one episode.

        A refused close means the server no longer knew the env (it restarted, or another client
        closed it), so another client may have played it too: the episode is not trusted.
        """
        self.forget()
        if not self.has_close:
            return
        try:
            self.close_on_server(env_id, None)
        except ServerRefused as exc:
            if exc.status in (404, 405) and not exc.error_body:  # no such route, not an unknown id
                self.has_close = False
                return
            raise EnvError(
                f"agentgym env {self.env_name!r}: the episode ended, but closing env id {env_id} "
                f"was refused ({exc}): the server no longer knew it, so another client may have "
                "shared this env (a server restart?); its result is not trusted"
            ) from exc
        except ServerFailure:
            pass  # the server went away after its answer: the answer itself stands
