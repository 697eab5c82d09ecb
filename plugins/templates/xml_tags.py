"""The XML template: "<think>reasoning</think><action>one action</action>"."""

from __future__ import annotations

import re
from typing import Any

from omrl.templates import ParsedAction, Template
from omrl_plugins.templates.common import (
    first_block,
    lone_action,
    reply_format_error,
    reply_format_prompt,
    unwrap,
    without_opened_reasoning,
)

TAGS = ("<think>", "</think>", "<action>", "</action>")
REPLY_FORMAT = ("<think>your reasoning</think>", "<action>one action</action>")
THINK = re.compile(r"<think>(.*?)(?:</think>|<action>|\Z)", re.S | re.I)
OPEN_THINK, CLOSE_THINK = re.compile(r"<think>", re.I), re.compile(r"</think>", re.I)
OPEN_ACTION, CLOSE_ACTION = re.compile(r"<action>", re.I), re.compile(r"</action>", re.I)
STRICT = re.compile(r"\s*<think>.*?</think>\s*<action>.*?</action>\s*", re.S)


def _without_thoughts(text: str) -> str:
    """``text`` less every closed ``<think>...</think>`` block."""
    kept, pos = [], 0
    while block := first_block(text, OPEN_THINK, CLOSE_THINK, pos):
        kept.append(text[pos : block[0].start()])
        pos = block[1].end()
    return "".join(kept) + text[pos:]


class XmlTemplate(Template):
    """XML tags: ``<think>reasoning</think>`` then ``<action>one action</action>``.

    The think block is required for ``format_ok`` (it may be empty): the
    format reward and ``tag_count`` then pay for the reasoning step that this
    template exists to ask for. ``format_ok`` also needs each of the four tags
    exactly once, in that order, nothing outside them and a non-empty action.
    A missing think block, an unclosed ``<action>`` (a reply cut at the token
    limit) or a bare action line still yields an action, with ``format_ok`` False.
    """

    reply_tags = tuple(re.escape(tag) for tag in TAGS)

    def system_prompt(self, env: Any) -> str:
        return reply_format_prompt(self, env, REPLY_FORMAT)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        """``action`` written as a well-formatted reply."""
        return f"<think>{thought}</think>\n<action>{action}</action>"

    def answer(self, response: str) -> str:
        # reasoning before the answer goes (DeepSeek-R1's, gpt-oss's channels); a leading <think> block is this
        # template's own tag, so a Qwen3 block stays
        return without_opened_reasoning(response)

    def parse(self, response: str, env: Any) -> ParsedAction:
        response = self.answer(response)
        if not response.strip():
            return ParsedAction(None, False, error=reply_format_error("The reply was empty.", env, REPLY_FORMAT))
        think = THINK.search(response)
        thought = (think.group(1).strip() or None) if think else None
        closed = first_block(response, OPEN_ACTION, CLOSE_ACTION)
        if closed:
            action = response[closed[0].end() : closed[1].start()]
        else:
            opened = OPEN_ACTION.search(response)
            # an unclosed action runs to the end of the reply or the next tag
            action = response[opened.end() :].split("<", 1)[0] if opened else ""
        action, unwrapped = unwrap(action)
        if action:
            # the tag counts first: with each tag once, STRICT's lazy groups cannot backtrack far
            ok = (
                closed is not None
                and not unwrapped
                and all(response.count(tag) == 1 for tag in TAGS)
                and STRICT.fullmatch(response) is not None
            )
            return ParsedAction(action, ok, thought)
        bare = lone_action(_without_thoughts(response), env)
        if bare is not None:
            return ParsedAction(bare, False, thought)
        problem = "The <action> tag was empty." if OPEN_ACTION.search(response) else "No <action>...</action> found."
        return ParsedAction(None, False, thought, error=reply_format_error(problem, env, REPLY_FORMAT))
