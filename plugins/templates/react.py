"""The ReAct template: "Think: <reasoning>" then "Act: <action>", as in the OpenManus-RL dataset."""

from __future__ import annotations

import re
from typing import Any

from omrl.templates import ParsedAction, Template
from omrl_plugins.templates.common import (
    KEYWORD_LINE,
    lone_action,
    reply_format_error,
    reply_format_prompt,
    unwrap,
    without_reasoning,
)

THINK_LINE = re.compile(r"^[ \t>*_#-]*(?:think|thought)[ \t*_]*:[ \t*_]*", re.I | re.M)
ACT_LINE = re.compile(r"^[ \t>*_#-]*(?:act|action)[ \t*_]*:[ \t*_]*", re.I | re.M)
ACT_INLINE = re.compile(r"\b(?:Act|Action):[ \t]*")  # "Think: ... Act: x" on one line; capitalised only
REPLY_FORMAT = ("Think: <your reasoning>", "Act: <one action>")


def _take_action(after: str) -> tuple[str, bool, str]:
    """Split the text after "Act:" into (action, on the Act line?, what follows the action).

    The action is one line; a fenced code block right below it belongs to it
    (OS/DB tasks write "Act: bash" and then the code).
    """
    lines = after.split("\n")
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines) or KEYWORD_LINE.match(lines[i]):
        return "", False, "\n".join(lines[i:]).strip()
    end = i + 1
    if end < len(lines) and lines[end].lstrip().startswith("```"):
        close = next((k for k in range(end + 1, len(lines)) if lines[k].strip().startswith("```")), len(lines) - 1)
        end = close + 1
    action = "\n".join([lines[i].strip(), *lines[i + 1 : end]]).strip()
    return action, i == 0, "\n".join(lines[end:]).strip()


def _thought(before_act: str) -> str | None:
    """The reasoning before the action: after the last "Think:" if there is one, else all of it."""
    markers = list(THINK_LINE.finditer(before_act))
    text = before_act[markers[-1].end() :] if markers else before_act
    return text.strip() or None


class ReactTemplate(Template):
    """ReAct: a "Think:" line of reasoning, then an "Act:" line with one action.

    ``format_ok`` needs a "Think:" marker at the start (its text may be empty) and
    then one "Act:" line with a non-empty action, nothing after it; a reply with no
    thought may be the "Act:" line alone (as :meth:`format_action` writes it).
    Sloppy replies still yield an action with ``format_ok`` False: "Action:" or
    markdown markers, an action on the line below "Act:", quoted actions, or no
    "Act:" at all but a line that reads as an action.
    """

    reply_tags = (r"^Think:", r"^Act:")  # the markers start a line

    def system_prompt(self, env: Any) -> str:
        return reply_format_prompt(self, env, REPLY_FORMAT)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        """``action`` written as a well-formatted reply; with no thought, the "Act:" line alone (an
        empty "Think:" line in SFT data would teach a model to write one)."""
        return f"Think: {thought.strip()}\nAct: {action}" if thought.strip() else f"Act: {action}"

    def answer(self, response: str) -> str:
        return without_reasoning(response)

    def parse(self, response: str, env: Any) -> ParsedAction:
        text = self.answer(response).strip()
        if not text:
            return ParsedAction(None, False, error=reply_format_error("The reply was empty.", env, REPLY_FORMAT))
        marker = ACT_LINE.search(text) or ACT_INLINE.search(text)
        if marker is None:
            thought = _thought(text)
            problem = "No 'Act:' line found."
        else:
            thought = _thought(text[: marker.start()])
            action, on_act_line, rest = _take_action(text[marker.end() :])
            if action:
                action, unwrapped = unwrap(action)
                markers = list(KEYWORD_LINE.finditer(text))
                opens = (
                    bool(markers)
                    and markers[0].start() == 0
                    and (
                        (len(markers) == 2 and markers[0].group(0) == "Think:") or len(markers) == 1  # no thought
                    )
                )
                ok = (
                    opens
                    and markers[-1].start() == marker.start()
                    and marker.group(0).strip() == "Act:"
                    and on_act_line
                    and not rest
                    and not unwrapped
                )
                return ParsedAction(action, ok, thought)
            problem = "'Act:' was not followed by an action."
        action = lone_action(text, env)
        if action is not None:
            where = text.lower().rfind(action.lower())
            return ParsedAction(action, False, _thought(text[:where]) if where >= 0 else thought)
        return ParsedAction(None, False, thought, error=reply_format_error(problem, env, REPLY_FORMAT))
