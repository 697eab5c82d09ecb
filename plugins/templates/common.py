"""What the action templates share: finding a bare action in a sloppy reply, and the prompt's parts."""

from __future__ import annotations

import re
from typing import Any

from omrl.env_examples import example_action
from omrl.errors import OmrlError

# A ReAct keyword at the start of a line, allowing markdown decoration ("**Act:**", "> Thought:").
KEYWORD_LINE = re.compile(r"^[ \t>*_#-]*(?:think|thought|act|action|observation|obs)[ \t*_]*:", re.I | re.M)
# "name[arg]" or "name(arg)": the shape of most text-env actions (WebShop, AgentGym).
ACTION_SHAPE = re.compile(r"^[A-Za-z_][\w\-]*\s?(?:\[[^\[\]\n]*\]|\([^()\n]*\))$")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HARMONY_CHANNEL, HARMONY_FINAL = "<|channel|>", "<|channel|>final<|message|>"  # gpt-oss's channel headers
EXAMPLE_THOUGHT = "This action brings me closer to the goal."


class TemplateError(OmrlError):
    """An action cannot be written in a template's format (parsing never raises)."""


def without_reasoning(text: str) -> str:
    """``text`` without a thinking model's reasoning before its answer: a leading ``<think>...</think>`` block
    (Qwen3 emits one before every answer), or one of :func:`without_opened_reasoning`'s shapes. A template's
    format applies to the answer after it."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        return stripped.split(THINK_CLOSE, 1)[1]
    return without_opened_reasoning(text)


def without_opened_reasoning(text: str) -> str:
    """``text`` without the reasoning of a reply that starts inside it, as the chat template shapes it:
    DeepSeek-R1's generation prompt opens ``<think>``, so its reply is the reasoning, ``</think>`` (with no
    ``<think>`` before it), then the answer; gpt-oss's reply is its channels, the answer in the last one,
    ``final``. A reply that is neither, or was cut before its answer, is ``text`` as it is."""
    if text.lstrip().startswith(HARMONY_CHANNEL) and HARMONY_FINAL in text:
        return text.rsplit(HARMONY_FINAL, 1)[1]
    closes = text.find(THINK_CLOSE)
    if closes >= 0 and THINK_OPEN not in text[:closes]:
        return text[closes + len(THINK_CLOSE) :]
    return text


def action_help(env: Any) -> str:
    """The env's description of its actions ("" when it has none)."""
    return str(getattr(env, "action_help", "") or "")


def admissible(env: Any) -> list[str] | None:
    """The env's valid actions now, or None when it does not know them or cannot say."""
    try:
        actions = env.admissible_actions()
    except Exception:  # a parse must never raise because of the env
        return None
    return [a for a in actions if isinstance(a, str)] if isinstance(actions, (list, tuple)) else None


def unwrap(text: str) -> tuple[str, bool]:
    """``text`` without wrapping backticks or quotes on a single line, and whether any were removed."""
    text = text.strip()
    if "\n" in text or len(text) < 2:
        return text, False
    inner = text.strip("`").strip()
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "\"'":
        inner = inner[1:-1].strip()
    return inner, inner != text


def lone_action(text: str, env: Any) -> str | None:
    """A line of a reply without template markers that still reads as an action.

    An exact (case-insensitive) match with one of the env's admissible actions
    wins; otherwise the last line shaped like ``name[arg]`` or ``name(arg)``.
    """
    lines = [unwrap(line)[0] for line in text.splitlines() if line.strip() and not KEYWORD_LINE.match(line)]
    known = admissible(env)
    if known:
        by_lower = {a.strip().lower(): a for a in known}
        for line in reversed(lines):
            if line.lower() in by_lower:
                return by_lower[line.lower()]
    for line in reversed(lines):
        if ACTION_SHAPE.match(line):
            return line
    return None


def reply_format_prompt(template: Any, env: Any, reply_format: tuple[str, ...]) -> str:
    """A system prompt asking for replies in ``reply_format`` (its lines), after the env's action help
    and before a worked example (the template's ``format_action``) where the env gives one."""
    lines = [action_help(env), "Reply in this format, one action per reply:", *reply_format]
    example = example_action(env)
    if example:
        lines += ["Example:", template.format_action(example, env, EXAMPLE_THOUGHT)]
    return "\n".join(line for line in lines if line)


def reply_format_error(problem: str, env: Any, reply_format: tuple[str, ...]) -> str:
    """A parse error: ``problem``, then the format the reply should have had and the env's action help."""
    return "\n".join([f"{problem} Reply in this format:", *reply_format, action_help(env)]).rstrip()


def first_block(text: str, opening: re.Pattern, closing: re.Pattern, pos: int = 0) -> tuple[re.Match, re.Match] | None:
    """The first opening tag at or after ``pos`` and the closing tag after it, or None when unclosed.

    What ``re.search("<a>(.*?)</a>")`` finds, in linear time: that regex
    rescans the rest of the reply from every unclosed tag (minutes on a reply
    of repeated tags).
    """
    opened = opening.search(text, pos)
    closed = closing.search(text, opened.end()) if opened else None
    return (opened, closed) if closed else None


def tool_signature(tool: dict[str, Any]) -> str:
    """``name(arg: type, ...)`` of a tool spec ``{"name", "description", "parameters"}``."""
    props = (tool.get("parameters") or {}).get("properties") or {}
    args = ", ".join(f"{key}: {spec.get('type', 'any')}" for key, spec in props.items())
    return f"{tool['name']}({args})"
