"""The policy behind an OpenAI-compatible endpoint: every call recorded into its episode token-exactly.

``Gateway`` serves ``GET /v1/models``, ``POST /v1/chat/completions`` (whole or streamed:
:mod:`omrl.gateway.protocol`) and ``POST /v1/responses`` (:mod:`omrl.gateway.responses`) on loopback unless told otherwise. Each episode gets its own API key
(:meth:`Gateway.open`); a call's key says which episode it belongs to, and an unknown or ended key
is refused (401), so an agent that outlives its episode cannot write into another; a call that belongs to
another episode than its key's is refused and named (:data:`SHARED_CLIENT`). A call lays out its row
(:mod:`omrl.gateway.recorder`), waits for its generate call (:mod:`omrl.gateway.batcher`) and is
answered with the reply parsed into ``tool_calls`` where tools were offered (:mod:`omrl.gateway.endpoint`).
A reply whose client hung up before it was sent is undone (:meth:`Gateway.undo`); the episode's next
call and its end wait until each reply was delivered or undone, so a client's retry of a reply it never
got is no stray, and an agent that returns at once cannot leave such a reply trained.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from omrl.backends.base import Backend
from omrl.chat.tool_calls import FORMATS
from omrl.data.trajectory import Episode
from omrl.gateway.batcher import Batcher
from omrl.gateway.endpoint import EpisodeEnded, Server, handler
from omrl.gateway.messages import RequestError, continues, of_another_episode, tool_layout
from omrl.gateway.protocol import ChatRequest
from omrl.gateway.recorder import EpisodeRecorder, Reply, cut_at_stop

DELIVERY_WAIT_S = 10.0  # writing a reply takes milliseconds; a handler stuck longer is not waited for


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
    answered ``finish_reason: "length"`` and the episode ends ``max_turns`` or ``max_context`` (truncated).
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
        self.delivery_wait_s = DELIVERY_WAIT_S  # how long an episode's end or next call waits for a reply's fate
        self.layout = tool_layout(tokenizer)
        self._episodes: dict[str, EpisodeRecorder] = {}
        self.misrouted: str | None = None  # set when a call arrived with another episode's key
        self.strayed: set[int] = set()  # tasks of episodes with a call that opened their chat again (strays)
        self._returned: set[str] = set()  # keys of episodes whose agents returned: no call of theirs can follow
        self._lock = threading.Lock()
        # batch_on_caller: whoever plays the episodes drives the batcher from its own thread (Batcher.drive)
        self.batcher = Batcher(
            backend, window_s, seed, waiting_for=lambda: len(self._episodes), own_thread=not batch_on_caller
        )
        self._server = Server((host, port), handler(self))
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

    def end(self, key: str, agent_returned: bool = False) -> None:
        """Refuse ``key`` from now on, wait for a call of its still in progress and for its replies to be
        delivered or undone (:meth:`_settle`), and let the backend forget the episode's cached states.
        ``agent_returned``: the episode's agent ended by itself, so a later call with its key came from
        another agent's client (:meth:`recorder`)."""
        with self._lock:
            recorder = self._episodes.pop(key, None)
            if agent_returned:
                self._returned.add(key)
        if recorder is not None:
            with recorder.lock:  # a call in progress finishes first; one that comes later finds it ended
                recorder.ended, recorder.agent_returned = True, agent_returned
                self._settle(recorder)  # an agent may return before its handler finds that it hung up
                ep = recorder.episode
                self.batcher.release([ep.token_ids[start:end] for start, end in ep.rows()])
            with self._lock:
                if recorder.strays:
                    self.strayed.add(recorder.episode.task_id)

    def recorder(self, key: str) -> EpisodeRecorder | None:
        """The recorder of ``key``'s episode; None for an unknown or ended key."""
        with self._lock:
            if key in self._returned:  # its agent returned: the agents share a client
                self.misrouted = self.misrouted or SHARED_CLIENT
            return self._episodes.get(key)

    def begin_play(self) -> None:
        """Forget what the last play's episodes showed of shared clients (:func:`omrl.gateway.play.play_agents`)."""
        with self._lock:
            self.misrouted, self.strayed = None, set()
            self._returned.clear()

    # -- one call ------------------------------------------------------------------------------------
    def complete(self, recorder: EpisodeRecorder, request: ChatRequest) -> tuple[list[Reply], int, Any]:
        """Generate ``request``'s choices in its episode; the replies, the prompt's length in tokens, and
        what :meth:`delivered` or :meth:`undo` takes once the replies reached the agent or never will (None:
        nothing was recorded). A call that fails leaves the episode as it was before it."""
        began = time.monotonic()
        with recorder.lock:
            self._settle(recorder)  # the last reply delivered or undone: a call that repeats it is told apart
            if recorder.ended:  # found before it ended: another episode's call is still told apart
                self._check_route(recorder, request.messages)
                self._check_repeat(recorder, request.messages)
                raise EpisodeEnded("this episode has ended; its key is no longer valid")
            if recorder.calls >= self.max_calls:
                recorder.cut = "max_turns"  # agent.max_calls is a gateway episode's turn cap
                return [Reply("", [], "length", [], [])] * request.n, 0, None
            before = recorder.state()
            try:
                replies, prompt_tokens, call = self._generate(recorder, request)
            except BaseException:
                recorder.restore(before)
                raise
            if call is not None:
                recorder.in_flight.append((call, time.monotonic() - began))
            return replies, prompt_tokens, call

    def delivered(self, recorder: EpisodeRecorder, call: Any) -> None:
        """``call``'s reply (a token :meth:`complete` returned) was written to its agent: it stays a turn."""
        with recorder.lock:
            self._settled(recorder, call)

    def undo(self, recorder: EpisodeRecorder, call: Any) -> None:
        """Undo ``call`` (a token :meth:`complete` returned) when its reply never reached the agent (the
        client hung up, as one that timed out does), unless a later call came first, or the episode's end
        or next call gave up waiting for it and undid it already."""
        with recorder.lock:
            took = self._settled(recorder, call)
            if took is not None:
                self._undo(recorder, call, took)

    def _settle(self, recorder: EpisodeRecorder) -> None:
        """Wait, the recorder's lock held (and let go meanwhile), until the reply of each of the episode's
        calls in flight was delivered or undone; one still in flight after ``delivery_wait_s`` (its handler
        is stuck) is undone: a reply its agent may never get is no turn."""
        if not recorder.settled.wait_for(lambda: not recorder.in_flight, self.delivery_wait_s):
            for call, took in reversed(recorder.in_flight):
                self._undo(recorder, call, took)
            recorder.in_flight.clear()

    @staticmethod
    def _settled(recorder: EpisodeRecorder, call: Any) -> float | None:
        """Take ``call`` off its episode's calls in flight: how long it took, None where it was not in flight."""
        for index, (pending, took) in enumerate(recorder.in_flight):
            if pending is call:
                del recorder.in_flight[index]
                recorder.settled.notify_all()
                return took
        return None

    def _undo(self, recorder: EpisodeRecorder, call: Any, took: float) -> None:
        if recorder.last is call:
            row = list(recorder.episode.current_row())
            recorder.restore(call[2])
            recorder.last = None  # a retry of the undone call is a first call: it must not replace the one before
            recorder.undone.append(took)
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

    def _check_repeat(self, recorder: EpisodeRecorder, messages: list[dict[str, Any]]) -> None:
        """Refuse, as a shared client's, a call that came to an ended episode whose agent returned and that
        repeats the request of a reply that agent got: its agent has returned, so neither it nor its client
        (whose retry of an undone reply is no longer the last call) sends more; the call is a sibling's of the
        same task."""
        if recorder.agent_returned and recorder.last is not None and list(messages) == recorder.last[0]:
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
        self.batcher.release(recorder.settle(request))  # a retry, or another choice taken
        self._check_route(recorder, request.messages)
        start = recorder.state()
        row = recorder.prompt(request.messages, request.tools)
        if row is None:  # not one token fits: the episode is over its budget
            return [Reply("", [], "length", [], [])] * request.n, 0, None
        prompt_tokens = len(row)  # now: an episode's first row is its token list, which the reply extends
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
        return [option[1] for option in options], prompt_tokens, recorder.last

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.batcher.close()
