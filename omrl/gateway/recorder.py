"""One agent episode's rows, recorded token-exactly from the requests its agent sends.

Each request carries the agent's whole chat. Where it continues the episode (its messages start with
the last request's and the reply the gateway gave: :func:`omrl.gateway.messages.continues`), the row
grows by the chat template's increment for the new messages, exactly as a native rollout's row grows
after an env's answer (:func:`omrl.chat.next_prompt`, so both history modes apply, and ``as_template``
may start a new row there). Where it does not (the agent edited, cut or summarised its history), a
new row starts with the template's render of the request. Either way the backend is given the row's
ids and the reply's ids are appended as sampled (loss_mask 1): no reply is decoded and re-encoded, and
no text the agent sends becomes a special token (:mod:`omrl.chat.encoding`).

Only replies the agent received are trained: one its client hung up on is undone before the episode's
next call or its end (:meth:`omrl.gateway.server.Gateway.undo`), a retry its client declares that repeats
the last request exactly replaces the last call's turn (:meth:`EpisodeRecorder.settle`; a repeat it does
not declare is another sample, a row of its own), and of a call's ``n`` choices the one the next request
continues is recorded, the others never.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.backends.base import Generation
from omrl.chat import next_prompt, prompt_ids
from omrl.chat.encoding import mark_value
from omrl.chat.replies import parse_reply, sampled_end, stop_token_ids
from omrl.chat.tool_calls import ParsedReply, one_call_only, parse_tool_calls
from omrl.data.trajectory import Episode, Turn
from omrl.gateway.messages import ToolLayout, continues, describe_tools, for_template


@dataclass
class Reply:
    """What one choice of a call answers the agent: its text, tool calls and why it stopped."""

    content: str
    tool_calls: list[dict[str, Any]]  # normalized: {id, name, arguments}
    finish_reason: str  # stop, length or tool_calls
    token_ids: list[int]
    logprobs: list[float]
    reasoning: str | None = None  # the reasoning channel, as a reasoning parser returns it (reasoning_content)
    answer_from: int = 0  # where the answer starts in the reply's text, after its reasoning

    def message(self) -> dict[str, Any]:
        """The reply as a normalized message (what the agent is expected to send back)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class EpisodeRecorder:
    """The rows of one agent episode (see the module docstring); a lock serialises its agent's calls."""

    def __init__(
        self,
        episode: Episode,
        tokenizer: Any,
        history: str,
        max_context: int,
        layout: ToolLayout,
        options: dict | None = None,
    ):
        self.episode = episode
        self.options = dict(options or {})  # the run's chat-template options (chat.template_kwargs)
        self.tokenizer = tokenizer
        self.history = history
        self.max_context = max_context
        self.layout = layout
        self.lock = threading.Lock()
        self.settled = threading.Condition(self.lock)  # notified as a call's reply is delivered or undone
        # calls whose replies are neither delivered nor undone yet (Gateway.complete), and how long each took
        self.in_flight: list[tuple[Any, float]] = []
        self.undone: list[float] = []  # how long each call took whose reply was undone, never delivered
        self.said: list[dict[str, Any]] = []  # the chat the current row stands for, as the template was given it
        self.seen: list[dict[str, Any]] = []  # the last request's messages (normalized) and the reply given
        self.names: dict[str, str] = {}  # tool-call id -> tool name
        self.kwargs: dict[str, Any] = dict(self.options)
        self.answering = ""  # the text of the messages the next reply answers
        self.sampled_end = ""  # the special tokens that ended the last reply ('' when it was cut)
        self.cut = ""  # the end reason of a call that found no room left: max_context, or max_turns (its calls)
        self.calls = 0
        self.ended = False  # set by the gateway when the episode ends: a later call is refused
        self.agent_returned = False  # set with ``ended`` when its agent ended by itself
        self.tools_key = ""  # the tools the current row was laid out with
        self.task_prompt = ""  # the episode's task, as its agent was given it ('' where unknown)
        self.strays = 0  # calls that sent the opening request again, in a row of its own (prompt)
        self.opening: list[dict[str, Any]] = []  # the first call's messages
        self.given: list[dict[str, Any]] = []  # every reply the model gave here, as messages (recorded or not)
        # the last call's request (messages, tools key) and the state before it: a retry undoes it
        self.last: tuple[list[dict[str, Any]], str, tuple] | None = None
        # with n > 1, the state before the recorded choice and every choice: the next call may continue another
        self.choices: tuple[tuple, list[tuple[Generation, Reply, ParsedReply, int | None]], str] | None = None

    def state(self) -> tuple:
        """What a call may change, so a call that fails can leave the episode as it found it."""
        ep = self.episode
        lengths = (len(ep.token_ids), len(ep.loss_mask), len(ep.logprobs), len(ep.row_starts), len(ep.turns))
        return (
            lengths,
            ep.prompt_length,
            ep.instruction,
            list(self.said),
            list(self.seen),
            dict(self.kwargs),
            self.tools_key,
            self.answering,
            self.sampled_end,
            dict(self.names),
            (self.calls, self.cut, self.strays, self.last, self.choices),
        )

    def restore(self, state: tuple) -> None:
        ep = self.episode
        (tokens, mask, logprobs, rows, turns), ep.prompt_length, ep.instruction, said, seen, kwargs, *rest = state
        del ep.token_ids[tokens:], ep.loss_mask[mask:], ep.logprobs[logprobs:], ep.row_starts[rows:], ep.turns[turns:]
        self.said, self.seen, self.kwargs = list(said), list(seen), dict(kwargs)  # a state may be restored twice
        self.tools_key, self.answering, self.sampled_end, names, counts = rest
        self.names = dict(names)
        self.calls, self.cut, self.strays, self.last, self.choices = counts

    def settle(self, request: Any) -> list[list[int]]:
        """Before ``request`` (a :class:`~omrl.gateway.protocol.ChatRequest`) lays out its row: where its client
        says it is a retry and it repeats the last call's request exactly, though that reply was written to the
        client (the connection broke after; a reply it hung up on is undone before, and a retry of it is a first
        call), the last call is undone. A repeat that is no retry asks for another sample of the same chat (self-
        consistency): it is a new row, and both replies stay turns. Where the request continues another of the
        last call's choices than the one recorded, that one is recorded instead (the others get no loss). Returns
        the rows whose cached states the backend may forget."""
        dropped: list[list[int]] = []
        messages, tools, last = request.messages, request.tools, self.last
        if request.retry and last is not None and list(messages) == last[0] and _tools_key(tools) == last[1]:
            dropped.append(list(self.episode.current_row()))
            self.restore(last[2])
        elif self.choices is not None and not continues(messages, self.seen):
            before, options, cap_by = self.choices
            for generation, reply, parsed, stop_at in options[1:]:
                if continues(messages, [*self.seen[:-1], reply.message()]):
                    dropped.append(list(self.episode.current_row()))
                    self.restore(before)
                    self.record(generation, tools, cap_by, stop_at, (reply, parsed))
                    break
        self.choices = None
        return dropped

    # -- before a call -------------------------------------------------------------------------------
    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[int] | None:
        """Lay out the row this request generates in and return its ids; None when not one generated token
        fits in ``max_context`` (the episode is then cut, ``max_context``, and nothing is appended)."""
        ep, tokenizer = self.episode, self.tokenizer
        kwargs = dict(self.options)
        if tools and self.layout.renders_tools:
            kwargs["tools"] = mark_value(tokenizer, list(tools))
        tools_key = _tools_key(tools)  # other tools: another opening
        if ep.token_ids and tools_key == self.tools_key and continues(messages, self.seen):
            new = for_template(messages[len(self.seen) :], self.layout, self.names)
            ids, starts_row = next_prompt(
                tokenizer, self.history, ep.current_row(), self.said, new, self.sampled_end, **kwargs
            )
            said = [*self.said, *new]
            fresh = messages[len(self.seen) :]
        else:
            said = describe_tools(for_template(messages, self.layout, self.names), tools, self.layout)
            ids, starts_row = prompt_ids(tokenizer, said, **kwargs), bool(ep.token_ids)
            fresh = messages[-1:]
            # the episode's opening request sent again, not as a retry: another agent's, through a shared client
            self.strays += starts_row and list(messages) == self.opening
        if (0 if starts_row else len(ep.current_row())) + len(ids) >= self.max_context:
            self.cut = "max_context"
            return None
        if starts_row:
            ep.row_starts.append(len(ep.token_ids))
        ep.token_ids += ids
        ep.loss_mask += [0] * len(ids)
        ep.logprobs += [0.0] * len(ids)
        if not ep.prompt_length:
            ep.prompt_length, self.opening = len(ids), list(messages)
            ep.instruction = next((m["content"] for m in messages if m["role"] == "user"), "")
        self.said, self.seen, self.kwargs, self.tools_key = said, list(messages), kwargs, tools_key
        self.answering = "\n".join(m["content"] for m in fresh)
        return ep.current_row()

    def room(self) -> int:
        """Tokens the current row may still grow by."""
        return self.max_context - len(self.episode.current_row())

    # -- after a call --------------------------------------------------------------------------------
    def record(
        self,
        generation: Generation,
        tools: Sequence[dict[str, Any]],
        cap_by: str,
        stop_at: int | None = None,
        answer: tuple[Reply, ParsedReply] | None = None,
    ) -> Reply:
        """Append the sampled ids as a turn, parse them, and return the reply the agent gets (``answer``,
        where it was already parsed). ``cap_by``: what set the call's token cap, the agent's ``max_tokens``,
        the run's ``max_new_tokens`` or the context's room (``max_context``: a reply cut there puts the
        episode over its budget); ``stop_at``: where a stop string starts in the reply's text (the agent
        gets the text before it)."""
        ep, tokenizer = self.episode, self.tokenizer
        reply, parsed = answer or self.reply(generation, tools, stop_at)
        start = len(ep.token_ids)
        prompt_tokens = start - (ep.row_starts[-1] if ep.row_starts else 0)
        ep.token_ids += generation.token_ids
        ep.loss_mask += [1] * len(generation.token_ids)
        ep.logprobs += generation.logprobs
        stopped = bool(generation.token_ids) and generation.token_ids[-1] in stop_token_ids(tokenizer, self.kwargs)
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        self.sampled_end = sampled_end(tokenizer, text, self.kwargs) if stopped else ""
        truncated = generation.finish_reason == "length"
        if truncated and cap_by == "max_context":
            self.cut = "max_context"
        rollout: dict[str, Any] = {
            "truncated": truncated,
            **({"cap": cap_by} if truncated else {}),
            "token_exact": generation.token_exact,
            "new_tokens": len(generation.token_ids),
            "row": len(ep.row_starts),
        }
        if generation.prefill_reused is not None:
            rollout["prefill_tokens"] = prompt_tokens - generation.prefill_reused
            rollout["prefill_reused"] = generation.prefill_reused
        info: dict[str, Any] = {"rollout": rollout}
        if reply.answer_from:  # a thinking model's reasoning: rewards that read the answer skip it (Turn.answer)
            info["answer_from"] = reply.answer_from
        if tools:  # every call attempt, none included: a turn that offered tools and made no call counts in its rates
            info["tool_calls"] = [attempt.record() for attempt in parsed.attempts]
        if parsed.attempts:
            info["tool"] = next((a.name for a in parsed.attempts if a.name), "(unparsed)")
            problem = next((a for a in parsed.attempts if a.status != "ok"), None)
            if problem is not None:
                info["tool_error"] = f"{problem.status}: {problem.error}"
        ep.turns.append(
            Turn(
                observation=self.answering,
                response=self._decoded(generation.token_ids),
                action=None,
                format_ok=all(a.status == "ok" for a in parsed.attempts),
                reward=0.0,
                done=False,
                info=info,
                span=(start, len(ep.token_ids)),
                parse_error=info.get("tool_error"),
            )
        )
        if self.layout.native and reply.tool_calls:
            structured = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in reply.tool_calls
            ]
            self.said.append({"role": "assistant", "content": reply.content, "tool_calls": structured})
        else:  # the reply as sampled: its tool calls stay the text the model wrote
            self.said.append({"role": "assistant", "content": self._decoded(generation.token_ids)})
        self.names.update({c["id"]: c["name"] for c in reply.tool_calls})
        self.seen.append(reply.message())
        self.calls += 1
        return reply

    def reply(
        self, generation: Generation, tools: Sequence[dict[str, Any]], stop_at: int | None = None
    ) -> tuple[Reply, ParsedReply]:
        """What ``generation`` answers the agent, recorded or not (a call's further choices are not)."""
        text = self._decoded(generation.token_ids)
        text = text if stop_at is None else text[:stop_at]
        split = parse_reply(self.tokenizer, text, self.kwargs)  # the reasoning apart, as a server's parser puts it
        text = split.answer
        parsed = parse_tool_calls(text, tools, self.layout.format or "hermes") if tools else ParsedReply(text)
        parsed = parsed if self.layout.parallel else one_call_only(parsed)  # more would not render: lost
        calls = [{"id": f"call_{secrets.token_hex(6)}", "name": a.name, "arguments": a.arguments} for a in parsed.calls]
        finish = "tool_calls" if calls else generation.finish_reason
        reply = Reply(
            parsed.content, calls, finish, generation.token_ids, generation.logprobs, split.reasoning, split.answer_from
        )
        self.given.append(reply.message())
        return reply, parsed

    def _decoded(self, ids: Sequence[int]) -> str:
        """The reply's text less the tokens that ended it (:func:`omrl.chat.replies.sampled_end`)."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        stopped = bool(ids) and ids[-1] in stop_token_ids(self.tokenizer, self.kwargs)
        return text[: len(text) - len(sampled_end(self.tokenizer, text, self.kwargs))] if stopped else text

    def chat(self) -> list[dict[str, Any]]:
        """The chat of the episode's last row as the chat template was given it (an Episode's ``messages``):
        where the template has no tool role, calls are the text the model wrote and tool results are user
        messages, so SFT on the episode renders the very prompts the model played in."""
        return [{key: value for key, value in message.items()} for message in self.said]


def _tools_key(tools: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(tools), sort_keys=True, default=repr)


def cut_at_stop(tokenizer: Any, generation: Generation, stops: Sequence[str]) -> tuple[Generation, int | None]:
    """``generation`` cut after the token that completes the first of ``stops`` in its text (finish
    reason ``stop``), and where that stop string starts in the cut text; unchanged and None when no
    stop string occurs. The ids kept are sampled ids: the row never holds a token the model did not sample."""
    if not stops:
        return generation, None
    ids = generation.token_ids
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not any(stop in text for stop in stops):
        return generation, None
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        found = [text.find(stop) for stop in stops if stop in text]
        if found:
            cut = Generation(
                ids[:k],
                generation.logprobs[:k],
                "stop",
                generation.token_exact,
                generation.prefill_reused,
                generation.weights_version,
            )
            return cut, min(found)
    return generation, None
