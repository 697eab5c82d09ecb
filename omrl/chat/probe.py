"""What a chat template does to a multi-turn chat: the report ``omrl check-template`` prints.

omrl trains on the ids a model sampled, with each later turn appended after them
(:mod:`omrl.chat.increments`). That is exact only while the template renders a longer chat as
an extension of the shorter one; thinking models' templates rewrite earlier turns, and a
history mode (:mod:`omrl.chat.history`) has to work around it. Reading a template's jinja
cannot tell which case a model is in, so this renders small probe chats and compares the
renders, then plays a sample episode through each history mode to show whether it works
and what it costs, before a run finds out halfway. One of the two modules at the top of
:mod:`omrl.chat` (with :mod:`omrl.chat.conformance`): it may import any module below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.conversation import conversation_rows, reply_text
from omrl.chat.history import HISTORY_MODES, kept_increment
from omrl.chat.render import Message, render
from omrl.chat.replies import sampled_end
from omrl.errors import OmrlError

REPLY_STYLES = ("plain", "think", "fields")
TURNS = 4  # replies in a probe chat: enough for "earlier" replies to be rewritten differently from the last
SYSTEM = "You are an agent in a house. Answer with one action."
TASK = "Find the brass key."
TOOL_RESULT = "The drawer holds a brass key."
TOOL_CALL_REPLY = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "look_inside", "arguments": {"where": "drawer 1"}}}],
}
EMPTY_THINK = re.compile(r"<think>\s*</think>")
_HINT = re.compile(r";? \(?(run )?`omrl check-template MODEL`[^)]*\)?")  # omrl's errors point here

REASONING_DROPPED = "reasoning dropped from earlier replies"
REPLY_DROPPED = "earlier replies dropped or replaced (a reply's answer is not written once a message follows it)"
REASONING_DROPPED_LAST = "reasoning dropped even from the last reply (only its answer is written)"
EMPTY_BLOCK = "an empty reasoning block written into the last reply"
END_TOKEN = "end token changed"
WHITESPACE = "whitespace changed"
PROMPT_REWRITTEN = "generation prompt rewritten under the reply"
REPLY_REWRITTEN = "reply rewritten"
TOOL_CALLS = "tool calls re-rendered"
IDS_CHANGED = "ids changed at a turn boundary (the text only appends, but a longer chat encodes to other ids)"


@dataclass
class ModeCost:
    """One history mode on the sample episode: whether it works (else ``problem`` says why) and its rows'
    size: ``prefill`` is the prompt tokens a backend computes for the episode when it reuses nothing."""

    mode: str
    works: bool
    problem: str = ""
    rows: int = 0
    tokens: int = 0
    trained: int = 0
    prefill: int = 0
    tool_problem: str = ""  # why tool results cannot follow a reply in this mode, where only they fail


@dataclass
class TemplateReport:
    """What :func:`check_template` found. ``findings`` name each way the template rewrites a chat
    (empty when it is append-only); ``tool_role``: a ``tool`` message renders, unlike a user's;
    ``tool_calls``: structured tool calls are written; ``modes`` maps each history mode to its :class:`ModeCost`."""

    append_only: bool
    findings: list[str]
    tool_role: bool
    tool_calls: bool
    modes: dict[str, ModeCost]

    @property
    def trainable(self) -> bool:
        """Whether some history mode trains the template token-exactly."""
        return any(cost.works for cost in self.modes.values())

    def why_not(self) -> str:
        """Each failing mode's problem (one for all where they share it): the error of a template no mode trains."""
        problems: dict[str, list[str]] = {}
        for cost in self.modes.values():
            if not cost.works:
                problems.setdefault(cost.problem, []).append(cost.mode)
        return "; ".join(f"{' and '.join(modes)}: {problem}" for problem, modes in problems.items())


def check_template(tokenizer, chat_kwargs: dict[str, Any] | None = None) -> TemplateReport:
    """Render the probe chats through ``tokenizer``'s template (with ``chat_kwargs``, e.g. ``enable_thinking``)
    and play the sample episode through every history mode."""
    kwargs = dict(chat_kwargs or {})
    opening = _opening(tokenizer, kwargs)
    plain, thinking = probe_chat(opening, "plain"), probe_chat(opening, "think")
    findings = [
        found
        for style in REPLY_STYLES
        for found in _rewrites(tokenizer, probe_chat(opening, style), kwargs, written=style != "fields")
    ]
    tool_calls, rewritten = _tool_calls(tokenizer, opening, kwargs)
    findings += rewritten
    tool_step = _tool_step(tokenizer, [plain[: len(opening) + 1], [*opening, TOOL_CALL_REPLY]], kwargs)
    episode = thinking[:-1]  # an episode ends on a reply: nothing answers a last observation
    modes = {mode: _play(tokenizer, episode, mode, kwargs, tool_step) for mode in HISTORY_MODES}
    if not findings and modes["as_template"].works and modes["as_template"].rows > 1:
        findings.append(IDS_CHANGED)  # as_template starts a row exactly where a render's ids stop extending it
    return TemplateReport(not findings, list(dict.fromkeys(findings)), tool_step is not None, tool_calls, modes)


def probe_chat(opening: Sequence[Message], style: str) -> list[Message]:
    """``opening`` then :data:`TURNS` exchanges of a reply and a user observation. A ``plain`` reply is an answer;
    a ``think`` one opens with a ``<think>`` block, as a thinking model samples it; a ``fields`` one carries its
    reasoning in the fields templates read it from (Qwen3 and GLM ``reasoning_content``, gpt-oss ``thinking``).
    Every answer and reasoning text is distinct, so each can be found in a render."""
    chat = [dict(m) for m in opening]
    for turn in range(1, TURNS + 1):
        answer, reasoning = f"open drawer {turn}", _reasoning(turn)
        reply = {
            "role": "assistant",
            "content": f"<think>\n{reasoning}\n</think>\n\n{answer}" if style == "think" else answer,
        }
        if style == "fields":
            reply.update(reasoning_content=reasoning, thinking=reasoning)
        chat += [reply, {"role": "user", "content": f"Drawer {turn} is empty."}]
    return chat


def _reasoning(turn: int) -> str:
    """The reasoning of the probe's reply ``turn``: distinct per turn, so a render is seen to keep or drop each."""
    return f"The key may be in drawer {turn}."


def _opening(tokenizer, kwargs: dict) -> list[Message]:
    """A system message and the task, or the task alone where the template refuses system messages (Gemma)."""
    task = {"role": "user", "content": TASK}
    for opening in ([{"role": "system", "content": SYSTEM}, task], [task]):
        try:
            render(tokenizer, opening, add_generation_prompt=True, **kwargs)
            return opening
        except OmrlError:
            raise  # no chat template at all
        except Exception as exc:  # noqa: BLE001 - the template's own refusal
            error = exc
    raise OmrlError(
        f"the chat template cannot render a first user message: {_reason(error)}; where it asks for an option, "
        "give it with --kwargs (a JSON object, e.g. '{\"enable_thinking\": false}')"
    )


def _rewrites(tokenizer, chat: list[Message], kwargs: dict, written: bool = True) -> list[str]:
    """What the template rewrites in ``chat``: at each reply, the render with the reply last against its
    generation prompt plus the text sampled (unless not ``written``: a template that ignores reasoning fields
    rewrites nothing a model sampled), and the render with the next message against that one."""
    found: list[str] = []
    eos = tokenizer.eos_token or ""
    reasonings = [_reasoning(turn) for turn in range(1, TURNS + 1)]
    stage = "a reply"
    try:
        for i in (i for i, m in enumerate(chat) if m["role"] == "assistant"):
            stage = "a reply"
            opened = render(tokenizer, chat[:i], add_generation_prompt=True, **kwargs)
            sampled = reply_text(tokenizer, chat[:i], chat[i], **kwargs)
            sampled = sampled[: -len(eos)] if eos and sampled.endswith(eos) else sampled
            last = render(tokenizer, chat[: i + 1], **kwargs)
            stage = "a message after a reply"
            followed = render(tokenizer, chat[: i + 2], add_generation_prompt=True, **kwargs)
            found += _step(opened + sampled, last, _answer(chat[i]), len(opened), reasonings) if written else []
            found += _step(last, followed, _answer(chat[i]), 0, reasonings)
    except Exception as exc:  # noqa: BLE001 - a template that raises on a longer chat is a finding
        found.append(f"the template raises on {stage} ({_reason(exc)})")
    return found


def _step(shorter: str, longer: str, answer: str, prompt_end: int, reasonings: Sequence[str] = ()) -> list[str]:
    """Why ``longer`` does not start with ``shorter`` (nothing when it does). ``answer`` is the last reply's
    text after any reasoning; ``prompt_end`` is where its generation prompt ends in ``shorter`` (0: ``shorter`` is
    a render of its own, the reply last). The first test that explains the difference names it."""
    if longer.startswith(shorter):
        return []
    if not prompt_end and answer in shorter and answer not in longer:  # the whole reply, not only its reasoning
        return [REPLY_DROPPED]
    if any(text in shorter and text not in longer for text in reasonings):
        return [REASONING_DROPPED_LAST if prompt_end else REASONING_DROPPED]
    if _squash(longer).startswith(_squash(shorter)):
        return [WHITESPACE]
    cut = next((k for k, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
    at_short, at_long = shorter.rfind(answer), longer.rfind(answer)
    back = max(0, cut - len("<think>"))  # the renders may part inside the tag: '<' + 'think>' vs '<' + 'tool_call>'
    if _empty_block(shorter[back : max(cut, at_short)]) != _empty_block(longer[back : max(cut, at_long)]):
        return [EMPTY_BLOCK]
    if 0 <= at_short and at_short + len(answer) <= cut:
        return [END_TOKEN]  # the reply is intact, what closes it is not (gpt-oss: <|return|> last, <|end|> after)
    return [PROMPT_REWRITTEN if cut < prompt_end else REPLY_REWRITTEN]


def _empty_block(text: str) -> bool:
    """Whether ``text`` holds a ``<think>`` block with nothing in it (Qwen3's mark of a reply without reasoning)."""
    return EMPTY_THINK.search(text) is not None


def _squash(text: str) -> str:
    """``text`` without whitespace: two renders that differ only there compare equal."""
    return re.sub(r"\s+", "", text)


def _answer(reply: Message) -> str:
    """A reply's text after its reasoning: what a template that drops reasoning still writes."""
    return reply["content"].split("</think>")[-1].strip()


def _tool_calls(tokenizer, opening: Sequence[Message], kwargs: dict) -> tuple[bool, list[str]]:
    """Whether the template writes a reply's structured tool calls, and what it rewrites in such a reply once
    a tool result follows it. A template that raises on them writes none."""
    chat = [*opening, TOOL_CALL_REPLY, {"role": "tool", "content": TOOL_RESULT}]
    try:
        written = render(tokenizer, chat[:-1], **kwargs)
        followed = render(tokenizer, chat, add_generation_prompt=True, **kwargs)
    except Exception:  # noqa: BLE001 - no tool calls in this template
        return False, []
    if "look_inside" not in written:
        return False, []
    changes = _step(written, followed, "look_inside", 0)
    return True, [found if found in (EMPTY_BLOCK, WHITESPACE) else TOOL_CALLS for found in changes]


def _tool_step(tokenizer, chats: Sequence[list[Message]], kwargs: dict) -> list[Message] | None:
    """The first of ``chats`` (each ending on a reply) after which a ``tool`` message renders, its text written and
    otherwise than the same text from the user: the template has a tool role. None where it has none (Phi-3
    writes nothing for a tool message). gpt-oss renders a tool result only after a reply that called a tool."""
    for chat in chats:
        try:
            tool, user = (
                render(tokenizer, [*chat, {"role": role, "content": TOOL_RESULT}], add_generation_prompt=True, **kwargs)
                for role in ("tool", "user")
            )
        except Exception:  # noqa: BLE001 - a template that raises on the role here
            continue
        if tool != user and TOOL_RESULT in tool:
            return list(chat)
    return None


def _play(tokenizer, episode: list[Message], mode: str, kwargs: dict, tool_step: list[Message] | None) -> ModeCost:
    """``episode`` laid out as ``mode`` lays it out (:func:`conversation_rows`): a mode that raises does not work.
    ``keep`` also puts a tool result after ``tool_step`` (it renders those after placeholder messages, which
    can fail where user turns do not: its ``tool_problem``)."""
    try:
        rows = conversation_rows(tokenizer, episode, mode, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the template's failure is the report
        return ModeCost(mode, False, _reason(exc))
    cost = ModeCost(
        mode,
        True,
        rows=len(rows),
        tokens=sum(len(ids) for ids, _ in rows),
        trained=sum(sum(mask) for _, mask in rows),
        prefill=sum(_prefill(mask) for _, mask in rows),
    )
    if mode == "keep" and tool_step is not None:
        try:
            end = _sampled_end(tokenizer, tool_step, kwargs)
            kept_increment(tokenizer, tool_step, [{"role": "tool", "content": TOOL_RESULT}], end, **kwargs)
        except Exception as exc:  # noqa: BLE001
            cost.tool_problem = _reason(exc)
    return cost


def _sampled_end(tokenizer, chat: list[Message], kwargs: dict) -> str:
    """The end token(s) a model samples for ``chat``'s last reply, as the template ends it (gpt-oss ends a tool
    call with ``<|call|>``, an answer with ``<|return|>``); the eos token where the template's text for it is unknown."""
    try:
        return sampled_end(tokenizer, reply_text(tokenizer, chat[:-1], chat[-1], **kwargs), kwargs)
    except Exception:  # noqa: BLE001 - the keep probe below says what fails
        return tokenizer.eos_token or ""


def _prefill(mask: Sequence[int]) -> int:
    """The prompt tokens of each reply in a row (everything before it), summed: what a backend that keeps no
    states between turns computes for the row."""
    return sum(k for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))


def _reason(exc: BaseException) -> str:
    """An error as one line: omrl's own message (less its pointer to this very report), else the exception's
    type and text."""
    text = _HINT.sub("", str(exc)) if isinstance(exc, OmrlError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())
