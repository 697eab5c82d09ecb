"""The XML template: "<think>reasoning</think><action>one action</action>"."""

from __future__ import annotations

import re
from typing import Any

from omrl.templates import ParsedAction, Template
from omrl_plugins.templates.common import EXAMPLE_THOUGHT, action_help, example_action, lone_action, unwrap

TAGS = ("<think>", "</think>", "<action>", "</action>")
THINK = re.compile(r"<think>(.*?)(?:</think>|<action>|\Z)", re.S | re.I)
ACTION = re.compile(r"<action>(.*?)</action>", re.S | re.I)
OPEN_ACTION = re.compile(r"<action>", re.I)
STRICT = re.compile(r"\s*<think>.*?</think>\s*<action>.*?</action>\s*", re.S)


class XmlTemplate(Template):
    """XML tags: ``<think>reasoning</think>`` then ``<action>one action</action>``.

    The think block is required for ``format_ok`` (it may be empty): the
    format reward and ``tag_count`` then pay for the reasoning step that this
    template exists to ask for. ``format_ok`` also needs each of the four tags
    exactly once, in that order, nothing outside them and a non-empty action.
    A missing think block, an unclosed ``<action>`` (a reply cut at the token
    limit) or a bare action line still yields an action, with ``format_ok`` False.
    """

    def system_prompt(self, env: Any) -> str:
        lines = [action_help(env), "Reply in this format, one action per reply:",
                 "<think>your reasoning</think>", "<action>one action</action>"]
        example = example_action(env)
        if example:
            lines += ["Example:", self.format_action(example, env, EXAMPLE_THOUGHT)]
        return "\n".join(line for line in lines if line)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        """``action`` written as a well-formatted reply."""
        return f"<think>{thought}</think>\n<action>{action}</action>"

    def parse(self, response: str, env: Any) -> ParsedAction:
        if not response.strip():
            return ParsedAction(None, False, error=self._error("The reply was empty.", env))
        think = THINK.search(response)
        thought = (think.group(1).strip() or None) if think else None
        closed = ACTION.search(response)
        if closed:
            action = closed.group(1)
        else:
            opened = OPEN_ACTION.search(response)
            # an unclosed action runs to the end of the reply or the next tag
            action = response[opened.end():].split("<", 1)[0] if opened else ""
        action, unwrapped = unwrap(action)
        if action:
            ok = (closed is not None and not unwrapped and STRICT.fullmatch(response) is not None
                  and all(response.count(tag) == 1 for tag in TAGS))
            return ParsedAction(action, ok, thought)
        bare = lone_action(re.sub(r"<think>.*?</think>", "", response, flags=re.S | re.I), env)
        if bare is not None:
            return ParsedAction(bare, False, thought)
        problem = "The <action> tag was empty." if OPEN_ACTION.search(response) else "No <action>...</action> found."
        return ParsedAction(None, False, thought, error=self._error(problem, env))

    @staticmethod
    def _error(problem: str, env: Any) -> str:
        return (f"{problem} Reply in this format:\n<think>your reasoning</think>\n"
                f"<action>one action</action>\n{action_help(env)}").rstrip()
