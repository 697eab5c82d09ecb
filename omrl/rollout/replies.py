"""Where a chain rollout's replies come from: a backend turn by turn, a backend's stream as they come, or
the env's scripted expert (:func:`expert_replies`).

The loop (:mod:`omrl.rollout.loop`) hands a source the episodes waiting for a reply and gets back
``(episode, reply)`` pairs for those whose reply is ready:

- :class:`TurnReplies`: every waiting episode's turn in one ``generate`` call, so every one is ready
  after it (the batch runs to its longest reply);
- :class:`StreamedReplies`: each episode's turn goes into the backend's :class:`~omrl.backends.base.Stream`
  once, and the call returns as soon as some replies end; the others keep decoding while the ready
  episodes step their envs and come back with their next turns.

A turn's sampling seed comes from the rollout's ``seed``: turn by turn, one per call (the call's
rows share ``model.generate``'s stream); streamed, one per episode turn (its group, sample and turn
number), so a reply does not depend on which episodes were decoding beside it.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

from omrl.backends.base import Backend, Generation, SamplingParams, Stream
from omrl.chat.conversation import reply_text
from omrl.chat.encoding import encode_continued, encode_plain
from omrl.chat.replies import reply_shape, stop_token_ids
from omrl.data.trajectory import Episode
from omrl.envs import EnvError
from omrl.errors import OmrlError, short_repr
from omrl.rollout.live import LiveEpisode, TemplateFailure
from omrl.rollout.spec import RolloutLimits
from omrl.supervisor import stage

S = TypeVar("S", bound=LiveEpisode)


def turn_caps(live: Sequence[LiveEpisode], limits: RolloutLimits) -> list[int]:
    """Each episode's token limit for its next reply: the turn's cap, or what its row's context has left."""
    return [min(limits.max_new_tokens, limits.max_context - len(s.episode.current_row())) for s in live]


class TurnReplies:
    """Every waiting episode's next reply from one ``generate`` call."""

    def __init__(self, backend: Backend, limits: RolloutLimits, seed: int):
        self.backend, self.limits, self.seed = backend, limits, seed
        self.calls = 0

    def __call__(self, live: Sequence[S]) -> list[tuple[S, Generation | BaseException]]:
        params = SamplingParams(
            max_new_tokens=turn_caps(live, self.limits),
            temperature=self.limits.temperature,
            top_p=self.limits.top_p,
            seed=self.seed * 1_000_003 + self.calls * 10_007,
        )
        with stage("generate", episode=f"{len(live)} episodes, turn {self.calls + 1}"):
            prompts = [s.episode.current_row() for s in live]
            replies = list(self.backend.generate(prompts, params, messages=[s.messages for s in live]))
        self.calls += 1
        return list(zip(live, replies))


class StreamedReplies:
    """Replies from a backend's stream: each waiting episode's turn is submitted once, and a call returns
    the episodes whose replies ended (at least one)."""

    def __init__(self, stream: Stream, limits: RolloutLimits, seed: int):
        self.stream, self.limits, self.seed = stream, limits, seed
        self.submitted: dict[int, LiveEpisode] = {}  # ticket -> the episode whose turn it is

    def __call__(self, live: Sequence[S]) -> list[tuple[S, Generation | BaseException]]:
        waiting = {id(s) for s in self.submitted.values()}
        fresh = [s for s in live if id(s) not in waiting]
        for state, cap in zip(fresh, turn_caps(fresh, self.limits)):
            ticket = self.stream.submit(state.episode.current_row(), cap, self.turn_seed(state))
            self.submitted[ticket] = state
        with stage("generate", episode=f"{len(self.submitted)} episodes decoding"):
            done = self.stream.advance()
        return [(self.submitted.pop(ticket), reply) for ticket, reply in done]  # type: ignore[misc]

    def turn_seed(self, state: LiveEpisode) -> int:
        """This episode turn's own seed: the same for the same rollout seed, task, sample and turn."""
        ep = state.episode
        return hash((self.seed, ep.group, ep.sample, len(ep.turns))) & (2**63 - 1)

    def close(self) -> None:
        self.stream.close()


#: what :func:`expert_replies` gives for an episode whose expert has no action for its state
GAVE_UP = OmrlError("the scripted expert has no action here")


def expert_replies(
    tokenizer: Any, live: Sequence[Any], caps: list[int], actions: list[Any]
) -> list[Generation | BaseException]:
    """The scripted expert's next ``actions`` (``(action, thought)`` per episode of ``live``, or what its
    env raised) as the ids of the template-formatted replies; :data:`GAVE_UP` where it has no action:
    the loop ends that episode as ``expert_gave_up``, a loss (the env did not fail, its expert did)."""
    out: list[Generation | BaseException] = []
    for state, played, cap in zip(live, actions, caps):
        action, thought = (played, "") if isinstance(played, BaseException) else played
        if isinstance(action, BaseException) or action is None:
            out.append(action if isinstance(action, BaseException) else GAVE_UP)
            continue
        if not isinstance(action, str):  # the env's failure, before any template writes it
            out.append(
                EnvError(
                    f"{type(state.env).__name__}.expert_action returned {short_repr(action)}; it must be text or None"
                )
            )
            continue
        # a template written before thoughts may take (action, env) alone: the thought only where there is one
        text = _written(state.lane.template, action, state.env, *([thought] if thought else []))
        if isinstance(text, TemplateFailure):  # the template's failure, not the expert's: env_error
            out.append(text)
            continue
        ids = _reply_ids(tokenizer, state, text)
        if thought and len(ids) > cap:  # the thought would crowd the action out of the turn's token cap
            shorter = _written(state.lane.template, action, state.env)
            if isinstance(shorter, TemplateFailure):
                out.append(shorter)
                continue
            ids = _reply_ids(tokenizer, state, shorter)
        ids = ids[:cap]
        stopped = ids[-1] == tokenizer.eos_token_id or ids[-1] in stop_token_ids(tokenizer, state.chat_kwargs)
        out.append(Generation(ids, [0.0] * len(ids), "stop" if stopped else "length"))
    return out


def _reply_ids(tokenizer: Any, state: Any, text: str) -> list[int]:
    """The ids of the expert's reply ``text`` as the chat template writes a reply after its generation prompt.
    Most templates write the text and the end-of-turn token; a thinking family writes more: DeepSeek-R1 closes
    the ``<think>`` its prompt opened, gpt-oss opens its ``final`` channel. The model learns from these."""
    shape = reply_shape(tokenizer, state.chat_kwargs)
    if not (shape.field or shape.answer_opens):
        return encode_plain(tokenizer, text) + [int(tokenizer.eos_token_id)]  # a reply's text is never special tokens
    reply = {"role": "assistant", "content": text}
    return encode_continued(tokenizer, reply_text(tokenizer, state.messages, reply, **(state.chat_kwargs or {})))


def _written(template: Any, action: str, env: Any, *thought: str) -> str | TemplateFailure:
    """``template.format_action(action, env, *thought)``, or a :class:`TemplateFailure` naming the template
    when it returned no text (what it raises goes on: a TemplateError says which action it cannot write)."""
    text = template.format_action(action, env, *thought)
    if isinstance(text, str) and text.strip():
        return text
    return TemplateFailure.of(
        template,
        "format_action",
        f"returned {short_repr(text)} for action {short_repr(action)}; it must return the reply's text",
    )


def no_expert_at_all(episodes: list[Episode]) -> None:
    """An env whose expert gave no action at the start of every one of its episodes has no expert here
    (an env without one, a server without the expert route): those episodes are the env's failures
    (env_error), as before, not the expert's losses: a rollout that played nothing does not exit 0."""
    for env in dict.fromkeys(ep.env for ep in episodes):
        mine = [ep for ep in episodes if ep.env == env and ep.end_reason != "env_error"]
        if mine and all(ep.end_reason == "expert_gave_up" and not ep.turns for ep in mine):
            for ep in mine:
                ep.end_reason = "env_error"
                ep.error = f"{env} has no scripted expert action: its expert gave none at the start of any episode"
