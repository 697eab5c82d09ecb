"""What a chat template does to a multi-turn chat: the report ``omrl check-template`` prints.

omrl trains on the ids a model sampled, with each later turn appended after them
(:mod:`omrl.chat.render`). That is exact only while the template renders a longer chat as
an extension of the shorter one; thinking models' templates rewrite earlier turns, and a
history mode (:mod:`omrl.chat.history`) has to work around it. Reading a template's jinja
cannot tell which case a model is in, so this renders small probe chats and compares the
renders, then plays a sample episode through each history mode to show whether it works
and what it costs, before a run finds out halfway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from omrl.chat.conversation import conversation_rows, reply_text
from omrl.chat.history import HISTORY_MODES, kept_increment, leading_special_token
from omrl.chat.render import Message, render
from omrl.errors import OmrlError

TURNS = 4  # replies in a probe chat: enough for "earlier" replies to be rewritten differently from the last
SYSTEM = "You are an agent in a house. Answer with one action."
TASK = "Find the brass key."
TOOL_RESULT = "The drawer holds a brass key."
EMPTY_THINK = re.compile(r"<think>\s*</think>")

REASONING_DROPPED = "reasoning dropped from earlier replies"
REASONING_DROPPED_LAST = "reasoning dropped from the last reply too (only the answer is written)"
EMPTY_BLOCK = "an empty reasoning block written into the last reply"
END_TOKEN = "end token changed"
WHITESPACE = "whitespace changed"
PROMPT_REWRITTEN = "generation prompt rewritten under the reply"
REPLY_REWRITTEN = "reply rewritten"
TOOL_CALLS = "tool calls re-rendered"


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


@dataclass
class TemplateReport:
    """What :func:`check_template` found. ``findings`` name each way the template rewrites a chat
    (empty when it is append-only); ``modes`` maps each history mode to its :class:`ModeCost`."""

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
        """Each mode's problem, for the error of a template no mode can train."""
        return "; ".join(f"{mode}: {cost.problem}" for mode, cost in self.modes.items() if not cost.works)


def check_template(tokenizer, chat_kwargs: dict[str, Any] | None = None) -> TemplateReport:
    """Render the probe chats through ``tokenizer``'s template (with ``chat_kwargs``, e.g. ``enable_thinking``)
    and play the sample episode through every history mode."""
    kwargs = dict(chat_kwargs or {})
    opening = _opening(tokenizer, kwargs)
    plain, thinking = probe_chat(opening, reasoning=False), probe_chat(opening, reasoning=True)
    findings = [*_rewrites(tokenizer, plain, kwargs), *_rewrites(tokenizer, thinking, kwargs)]
    tool_calls, rerendered = _tool_calls(tokenizer, opening, kwargs)
    findings += [TOOL_CALLS] if rerendered else []
    tool_role = _has_tool_role(tokenizer, plain[:len(opening) + 1], kwargs)
    tool_step = plain[:len(opening) + 1] if tool_role else None
    episode = thinking[:-1]  # an episode ends on a reply: nothing answers a last observation
    modes = {mode: _play(tokenizer, episode, mode, kwargs, tool_step) for mode in HISTORY_MODES}
    return TemplateReport(not findings, list(dict.fromkeys(findings)), tool_role, tool_calls, modes)


def probe_chat(opening: Sequence[Message], reasoning: bool) -> list[Message]:
    """``opening`` then :data:`TURNS` exchanges of a reply and a user observation; with ``reasoning`` each reply
    opens with a ``<think>`` block, as a thinking model samples it. Every reply and reasoning text is distinct,
    so each can be found in a render."""
    chat = [dict(m) for m in opening]
    for turn in range(1, TURNS + 1):
        answer = f"open drawer {turn}"
        content = f"<think>\nThe key may be in drawer {turn}.\n</think>\n\n{answer}" if reasoning else answer
        chat += [{"role": "assistant", "content": content}, {"role": "user", "content": f"Drawer {turn} is empty."}]
    return chat


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
    raise OmrlError(f"the chat template cannot render a first user message: {_reason(error)}")


def _rewrites(tokenizer, chat: list[Message], kwargs: dict) -> list[str]:
    """What the template rewrites in ``chat``: at each reply, the render with the reply last against its
    generation prompt plus the text sampled, and the render with the next message against that one."""
    found: list[str] = []
    try:
        for i in (i for i, m in enumerate(chat) if m["role"] == "assistant"):
            opened = render(tokenizer, chat[:i], add_generation_prompt=True, **kwargs)
            sampled = reply_text(tokenizer, chat[:i], chat[i], **kwargs)
            eos = tokenizer.eos_token or ""
            sampled = sampled[:-len(eos)] if eos and sampled.endswith(eos) else sampled
            written = render(tokenizer, chat[:i + 1], **kwargs)
            followed = render(tokenizer, chat[:i + 2], add_generation_prompt=True, **kwargs)
            found += _step(tokenizer, opened + sampled, written, _answer(chat[i]), len(opened))
            found += _step(tokenizer, written, followed, _answer(chat[i]), 0)
    except Exception as exc:  # noqa: BLE001 - a template that raises on a longer chat is a finding
        found.append(f"the template raises on a longer chat ({_reason(exc)})")
    return found


def _step(tokenizer, shorter: str, longer: str, answer: str, prompt_end: int) -> list[str]:
    """Why ``longer`` does not start with ``shorter`` (nothing when it does). ``answer`` is the last reply's
    text after any reasoning; ``prompt_end`` is where its generation prompt ends in ``shorter`` (0: written)."""
    if longer.startswith(shorter):
        return []
    if any(text not in longer for text in _reasonings(shorter)):
        return [REASONING_DROPPED_LAST if prompt_end else REASONING_DROPPED]
    if _squash(longer).startswith(_squash(shorter)):
        return [WHITESPACE]
    cut = next((k for k, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
    at_short, at_long = shorter.rfind(answer), longer.rfind(answer)
    if _empty_block(shorter[cut:max(cut, at_short)]) != _empty_block(longer[cut:max(cut, at_long)]):
        return [EMPTY_BLOCK]
    if 0 <= at_short and at_short + len(answer) <= cut and at_long >= 0:
        ends = (leading_special_token(tokenizer, shorter[at_short + len(answer):]),
                leading_special_token(tokenizer, longer[at_long + len(answer):]))
        if all(ends) and ends[0] != ends[1]:
            return [END_TOKEN]  # gpt-oss: <|return|> closes the last reply, <|end|> one the chat goes on after
    return [PROMPT_REWRITTEN if cut < prompt_end else REPLY_REWRITTEN]


def _reasonings(text: str) -> list[str]:
    """The non-empty reasoning texts of ``text``'s ``<think>`` blocks."""
    return [r.strip() for r in re.findall(r"<think>(.*?)</think>", text, re.S) if r.strip()]


def _empty_block(text: str) -> bool:
    return EMPTY_THINK.search(text) is not None


def _squash(text: str) -> str:
    """``text`` without whitespace: two renders that differ only there compare equal."""
    return re.sub(r"\s+", "", text)


def _answer(reply: Message) -> str:
    """A reply's text after its reasoning: what a template that drops reasoning still writes."""
    return reply["content"].split("</think>")[-1].strip()


def _tool_calls(tokenizer, opening: Sequence[Message], kwargs: dict) -> tuple[bool, bool]:
    """``(written, rewritten)``: whether the template writes a reply's structured tool calls, and whether
    it writes them differently once a tool result follows. A template that raises on them writes none."""
    call = {"type": "function", "function": {"name": "look_inside", "arguments": {"where": "drawer 1"}}}
    chat = [*opening, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": TOOL_RESULT}]
    try:
        written = render(tokenizer, chat[:-1], **kwargs)
        followed = render(tokenizer, chat, add_generation_prompt=True, **kwargs)
    except Exception:  # noqa: BLE001 - no tool calls in this template
        return False, False
    if "look_inside" not in written:
        return False, False
    return True, not followed.startswith(written)


def _has_tool_role(tokenizer, chat: Sequence[Message], kwargs: dict) -> bool:
    """Whether a ``tool`` message after ``chat`` renders, and otherwise than the same text from the user."""
    try:
        tool, user = (render(tokenizer, [*chat, {"role": role, "content": TOOL_RESULT}], add_generation_prompt=True,
                             **kwargs) for role in ("tool", "user"))
    except Exception:  # noqa: BLE001 - a template that raises on the role has none
        return False
    return tool != user


def _play(tokenizer, episode: list[Message], mode: str, kwargs: dict, tool_step: list[Message] | None) -> ModeCost:
    """``episode`` laid out as ``mode`` lays it out (:func:`conversation_rows`), and for ``keep`` a tool result
    after ``tool_step`` too (keep renders those after placeholder messages): a mode that raises does not work."""
    try:
        rows = conversation_rows(tokenizer, episode, mode, **kwargs)
        if mode == "keep" and tool_step is not None:
            kept_increment(tokenizer, tool_step, [{"role": "tool", "content": TOOL_RESULT}], True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the template's failure is the report
        return ModeCost(mode, False, _reason(exc))
    return ModeCost(mode, True, rows=len(rows), tokens=sum(len(ids) for ids, _ in rows),
                    trained=sum(sum(mask) for _, mask in rows), prefill=sum(_prefill(mask) for _, mask in rows))


def _prefill(mask: Sequence[int]) -> int:
    """The prompt tokens of each reply in a row (everything before it), summed: what a backend that keeps no
    states between turns computes for the row."""
    return sum(k for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))


def _reason(exc: BaseException) -> str:
    """An error as one line: omrl's own message, else the exception's type and text."""
    text = str(exc) if isinstance(exc, OmrlError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())
