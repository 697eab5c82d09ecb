"""An episode as it grows, turn by turn: a chain's (:mod:`omrl.rollout.loop`) or a search branch's (:mod:`omrl.search`).

Both grow the same way, so both call the same three steps, and a search with one
candidate per node gives the chain rollout's episodes id for id:

- :func:`record_reply` appends the sampled ids as they are (loss_mask 1, with their
  log-probs) as a new turn, and parses them into the action the env steps on;
- :func:`record_step` fills that turn with the env's answer;
- :func:`continue_chat` appends the chat-template increment that leads to the next
  turn (loss_mask 0; under ``chat.history=as_template`` perhaps a new row), or ends
  the episode at a limit.

Nothing is decoded and re-encoded: the reply's text is decoded for the chat and the
parser only, never to lay out ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from omrl.backends.base import Generation
from omrl.chat import next_prompt
from omrl.chat.history import native_call_format
from omrl.chat.replies import parse_reply, sampled_end, stop_token_ids
from omrl.chat.tool_calls import parse_tool_calls, template_format
from omrl.data.trajectory import Episode, Turn
from omrl.env_results import EMPTY_OBSERVATION
from omrl.envs import Env, StepResult, clean_text, step_problem
from omrl.errors import OmrlError, short_repr
from omrl.plugins import plugin_site
from omrl.supervisor import StageStalled
from omrl.templates import ParsedAction, Template


class TemplateFailure(OmrlError):
    """An action template raised, or answered outside its protocol (a parse that is no ParsedAction, a
    ``format_action`` without text): a broken plugin, so its episode ends as env_error, not the model's
    failure (never trained on; its env instance is not at fault). Its message begins ``template NAME's``
    (:data:`TEMPLATE_REASON`) and names the plugin's file and line where it raised."""

    @classmethod
    def of(cls, template: Template, method: str, what: str, cause: BaseException | None = None) -> "TemplateFailure":
        return cls(f"template {type(template).__name__}'s {method} {what}{plugin_site(cause)}")


#: how an episode's error names the action template that failed it (a bug in that plugin, not the world)
TEMPLATE_REASON = re.compile(r"template (\w+)'s (?:parse|answer|format_action|system_prompt) ")
#: how it names an env that answered outside the env protocol (:func:`omrl.env_results.step_problem`): its
#: plugin's bug, which a replay meets again
PROTOCOL_REASON = re.compile(r"(?:step|reset) failed: env '([^']+)' (?:returned |ended the )")


def raised(exc: BaseException) -> str:
    """``Type: message`` of an env's exception and, for one no env means to raise (not an ``OmrlError``
    such as ``EnvError``: its server is down), where a third-party plugin raised it (:func:`plugin_site`)."""
    return f"{type(exc).__name__}: {exc}{'' if isinstance(exc, OmrlError) else plugin_site(exc)}"


# what the rollout records in Turn.info; the env's step adds the rest
ROLLOUT_KEYS = ("rollout", "weights_version", "tool_calls", "answer_from")


@dataclass
class LiveEpisode:
    """An episode being played: its chat so far, what its next turn answers, and how its current turn went."""

    episode: Episode
    messages: list[dict[str, str]]
    answering: str  # the env text (or format feedback) the next turn answers
    next_user: str = ""  # the env text (or format feedback) that answers the current turn
    eos_generated: bool = False
    sampled_end: str = ""  # the special tokens that ended the current reply, as sampled ('' when it was cut)
    end: str | None = None
    action: str | None = None  # the current reply's parsed action, when the env should step on it
    tool_call: dict | None = None  # the current reply as a structured tool call ({content, tool_calls}), if it is one
    # its env raised, or its reply could not be made: a chain's pool discards the instance
    # (a search's forker has dropped such an instance already)
    broken: bool = False
    stalled: bool = (
        False  # its env outlived its deadline (omrl.supervisor): ``deadlines.on_stall=retry`` plays it again
    )

    def record_end(self) -> None:
        """Write why the episode ended (``end``, once set) and its chat into the episode."""
        self.episode.end_reason = self.end or ""
        self.episode.messages = [dict(m) for m in self.messages]


def record_reply(
    live: LiveEpisode,
    reply: Generation | BaseException,
    template: Template,
    tokenizer: Any,
    env: Env,
    chat_kwargs: dict | None = None,
) -> str | None:
    """Append ``reply`` to the episode as a new turn and parse it; the action to step on (also
    ``live.action``), or None: the turn's parse error set and the next user message saying why, or
    ``live.end`` set when the reply was empty, or to env_error with ``episode.error`` set when it is an
    exception or the template failed on it (:class:`TemplateFailure`: raised, or answered outside its
    protocol)

    The chat holds the reply as the template reads it back (:func:`omrl.chat.replies.parse_reply`: its
    reasoning in the template's field, its answer as content); the action template reads the whole text."""
    live.action = live.tool_call = None
    ep = live.episode
    if isinstance(reply, TemplateFailure):  # the expert's reply could not be written: the env is fine
        live.end, ep.error = "env_error", str(reply)
        return None
    if isinstance(reply, BaseException):
        live.end, live.broken = "env_error", True
        ep.error = f"{type(reply).__name__}: {reply}"
        return None
    start = len(ep.token_ids)
    prompt_tokens = start - (ep.row_starts[-1] if ep.row_starts else 0)  # the current row's length, uncopied
    ep.token_ids += reply.token_ids
    ep.loss_mask += [1] * len(reply.token_ids)
    ep.logprobs += reply.logprobs
    live.eos_generated = bool(reply.token_ids) and reply.token_ids[-1] in stop_token_ids(tokenizer, chat_kwargs)
    text = tokenizer.decode(reply.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    live.sampled_end = sampled_end(tokenizer, text, chat_kwargs) if live.eos_generated else ""
    response = text[: len(text) - len(live.sampled_end)]
    rollout_info = {
        "truncated": not live.eos_generated,
        "token_exact": reply.token_exact,
        "new_tokens": len(reply.token_ids),
    }
    if reply.prefill_reused is not None:  # what the engine prefilled for this turn, for per-env figures
        rollout_info["prefill_tokens"] = prompt_tokens - reply.prefill_reused
        rollout_info["prefill_reused"] = reply.prefill_reused
    turn = Turn(
        observation=live.answering,
        response=response,
        action=None,
        format_ok=False,
        reward=0.0,
        done=False,
        info={"rollout": rollout_info},
        span=(start, len(ep.token_ids)),
    )
    if reply.weights_version is not None:  # the sampler changed versions between turns
        turn.info["weights_version"] = reply.weights_version
    ep.turns.append(turn)
    read = parse_reply(tokenizer, response, chat_kwargs)
    live.messages.append(read.message)
    if not response.strip():
        turn.parse_error = "the reply was empty"
        live.end = "empty_response"
        return None
    parsed = _parse(template, response, env)
    if isinstance(parsed, TemplateFailure):  # the world failed, not the model: never trained, never told
        live.end, ep.error = "env_error", str(parsed)
        return None
    parsed, answer_from = parsed
    if read.reasoning is not None and not read.answer.strip():
        # the chat format reads it as reasoning alone (DeepSeek-R1's block, opened by its prompt, never closed):
        # no answer, whatever the action template finds inside, or the next prompt would show an empty reply
        parsed = ParsedAction(None, False, error=UNANSWERED)
    if answer_from:  # reasoning the template skips: rewards that read the answer skip it too (Turn.answer)
        turn.info["answer_from"] = answer_from
    turn.format_ok, turn.parse_error, turn.action = parsed.format_ok, parsed.error, parsed.action
    offered, fmt = (chat_kwargs or {}).get("tools"), template.call_format()
    if offered and fmt:  # every call attempt, classified as the gateway does
        turn.info["tool_calls"] = [a.record() for a in parse_tool_calls(response, offered, fmt).attempts]
    if parsed.tool_call is not None and parsed.action is not None:  # the reply as a structured tool call
        live.tool_call = {"content": parsed.thought or "", "tool_calls": [parsed.tool_call]}
    if parsed.action is None:
        reason = parsed.error or "no action found in the reply."
        if env.action_help not in reason:  # react and xml errors name the env's actions already
            reason = f"{reason}\n{env.action_help}"
        live.next_user = f"Your reply could not be parsed: {reason}"
    live.action = parsed.action
    return parsed.action


UNANSWERED = "the reply is all reasoning (its reasoning never closed), so it gave no answer; close it, then answer."


def _parse(template: Template, response: str, env: Env) -> tuple[ParsedAction, int] | TemplateFailure:
    """``template.parse(response)`` and where the answer it read starts (:meth:`Template.answer`), or a
    :class:`TemplateFailure` naming the template when it raised or answered outside the protocol.

    A template never raises (its protocol): a reply it cannot read is a ParsedAction with an error. One
    that raises anyway, or answers outside the protocol, is a broken plugin: the episode ends as
    env_error (never trained on, never the model's format error), and the run goes on.
    """
    try:
        parsed = template.parse(response, env)
    except Exception as exc:  # noqa: BLE001 - a template bug, whatever it raises
        return TemplateFailure.of(template, "parse", f"raised {type(exc).__name__}: {str(exc)[:200]}", exc)
    try:
        answer = template.answer(response) if isinstance(template, Template) else response
    except Exception as exc:  # noqa: BLE001
        return TemplateFailure.of(template, "answer", f"raised {type(exc).__name__}: {str(exc)[:200]}", exc)
    if not isinstance(parsed, ParsedAction):
        return TemplateFailure.of(
            template, "parse", f"returned a {type(parsed).__name__}; it must return a ParsedAction"
        )
    if not isinstance(parsed.action, (str, type(None))):
        return TemplateFailure.of(
            template, "parse", f"returned action {short_repr(parsed.action)}; it must be text or None"
        )
    if not isinstance(answer, str) or not response.endswith(answer):
        return TemplateFailure.of(
            template, "answer", f"returned {short_repr(answer)}; it must be the end of the reply it was given"
        )
    return parsed, len(response) - len(answer)


def record_step(live: LiveEpisode, result: StepResult | BaseException) -> None:
    """Fill the last turn with the env's answer. An env that raised ends the episode as env_error
    (``live.broken``); so does one that answered outside the protocol (the instance still works:
    its next reset starts afresh)."""
    ep, turn = live.episode, live.episode.turns[-1]
    if isinstance(result, BaseException):
        ep.error = f"step failed: {raised(result)}"
        live.end, live.broken = "env_error", True
        live.stalled = isinstance(result, StageStalled)
        return
    problem = step_problem(result)
    if problem:
        ep.error = f"step failed: env {ep.env!r} {problem}"
        live.end = "env_error"
        return
    turn.reward, turn.done = float(result.reward), bool(result.done)
    turn.info = {**result.info, **{key: turn.info[key] for key in ROLLOUT_KEYS if key in turn.info}}
    ep.won, ep.score = result.won, result.score
    live.next_user = clean_text(result.observation) or EMPTY_OBSERVATION
    if result.done:
        live.end = "done"


def _as_template_writes(tokenizer: Any, live: LiveEpisode, chat_kwargs: dict) -> bool:
    """Whether the reply's tool call was sampled in the format the chat template writes calls in: only then is
    it recorded as a structured call answered by a ``tool`` message (a model told to write ``<tool_call>``
    JSON whose template writes gpt-oss's channels keeps its call as text, and the answer as a user message)."""
    fmt = native_call_format(tokenizer, chat_kwargs)
    name = live.tool_call["tool_calls"][0]["function"]["name"]
    return bool(fmt) and template_format(live.episode.turns[-1].response, name) == fmt


def continue_chat(
    live: LiveEpisode, tokenizer: Any, chat_kwargs: dict, turn_cap: int, max_context: int, history: str
) -> None:
    """Append the ids that lead from the last reply to the next turn: an increment of the current row,
    or under ``as_template`` perhaps a new row. An episode that ended stays as it is; one at ``turn_cap``
    turns ends as max_turns, one whose row would not leave room for one generated token as max_context.

    ``live.next_user`` answers the reply as a user message; after a native tool call, where the chat
    template renders them in the format the call was sampled in, the reply is recorded with its structured
    ``tool_calls`` (its content the text before the call) and the answer is a ``tool`` message.
    """
    ep = live.episode
    if live.end is not None:
        return
    if len(ep.turns) >= turn_cap:
        live.end = "max_turns"
        return
    if live.tool_call is not None and _as_template_writes(tokenizer, live, chat_kwargs):
        call = dict(live.tool_call)
        if len(live.messages[-1]) > 2:  # the reply's reasoning has a field: the call's text is its answer
            call["content"] = parse_reply(tokenizer, call["content"], chat_kwargs).answer
        live.messages[-1] = {**live.messages[-1], **call}
        name = live.tool_call["tool_calls"][0]["function"]["name"]
        new = [{"role": "tool", "content": live.next_user, "name": name}]
    else:
        new = [{"role": "user", "content": live.next_user}]
    ids, starts_row = next_prompt(
        tokenizer, history, ep.current_row(), live.messages, new, live.sampled_end, **chat_kwargs
    )
    if (0 if starts_row else len(ep.current_row())) + len(ids) >= max_context:
        live.end = "max_context"
        return
    if starts_row:
        ep.row_starts.append(len(ep.token_ids))
    ep.token_ids += ids
    ep.loss_mask += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)
    live.messages += new
    live.answering = live.next_user
