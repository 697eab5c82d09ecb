"""The ``verifiers_reply`` template: the whole reply is the action (a verifiers environment's parser reads it),
under the environment's own system prompt, with a tool environment's tools offered to the chat template."""

from __future__ import annotations

from typing import Any

from omrl.chat.tool_calls import parse_tool_calls, tools_system_text
from omrl.templates import ParsedAction, Template

TEMPLATE = "verifiers_reply"  # not the env's name: the template reads its options under its own name


class VerifiersTemplate(Template):
    """The reply as it is: the whole reply is the action (a verifiers environment's parser reads it), under the
    environment's own system prompt, with its tools offered to the chat template.

    ``format_ok``: the environment's parser finds the reply well formatted (its format reward is 1); any reply
    where it has no format reward. ``tools_in_system`` also lists the tools in the system prompt, for chat
    templates that do not render ``tools`` (SmolLM2's).
    """

    def __init__(self, tools_in_system: bool = False):
        self.tools_in_system = bool(tools_in_system)

    def system_prompt(self, env: Any) -> str:
        system = getattr(env, "system_prompt", None)
        text = system if isinstance(system, str) else str(getattr(env, "action_help", "") or "")
        tools = getattr(env, "tools", None) or []
        if self.tools_in_system and tools:
            text = f"{text}\n\n{tools_system_text(tools)}".strip()
        return text

    def parse(self, response: str, env: Any) -> ParsedAction:
        if not response.strip():
            return ParsedAction(None, False, error="The reply was empty.")
        check = getattr(env, "format_ok", None)
        ok = bool(check(response)) if callable(check) else True
        tools = getattr(env, "tools", None) or []
        if not tools:
            return ParsedAction(response, ok)
        read = parse_tool_calls(response, tools, getattr(env, "tool_format", "hermes"))
        calls = read.calls
        if len(calls) != 1:  # no call, or several: the environment's answer is a user message
            return ParsedAction(response, ok, read.content if calls else None)
        call = {"type": "function", "function": {"name": calls[0].name, "arguments": calls[0].arguments}}
        return ParsedAction(response, ok, read.content or None, tool_call=call)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        return action

    def chat_template_kwargs(self, env: Any) -> dict:
        tools = getattr(env, "tools", None) or []
        return {"tools": [{"type": "function", "function": tool} for tool in tools]} if tools else {}
