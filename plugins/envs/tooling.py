"""Tools beside an env's own actions: the shared core of the ``code`` and ``mcp`` env families.

A :class:`ToolEnv` wraps an env that holds the tasks and scores the answers (a reasoning-gym dataset,
your own file through the ``dataset`` env) and offers the model some :class:`Tool` s as well: a
Python interpreter in omrl's sandbox, an MCP server's tools. A tool call is a turn: its result is
the next observation (a ``tool`` message under the ``tool_call`` template), the episode goes on, and
only the wrapped env's answer ends it and is scored.

Action text (what text templates parse, and what native tool calls become):

- ``name[text]`` for a tool with one argument whose schema makes it a string (``"type": "string"``, or a
  string or null), ``python[print(6 * 7)]``: the text may span lines and hold brackets, everything up
  to the last ``]`` is the argument;
- ``name[{"arg": ..., ...}]`` (a JSON object) for any other tool;
- ``answer[text]``: the final answer, when the wrapped env has no tools of its own (a one-turn
  env's action is its answer). There, an action that reads as a call to a tool the env lacks
  (``lookupp[...]``: it starts with a name and ``[``) is refused, naming the tools; anything else
  goes to the wrapped env as it is (an env with tools of its own gets every action not for ours).
  A call without its closing ``]`` (a reply cut off mid-code) is neither run nor scored: the model
  is told, and the episode goes on.

Failures are split by whose they are. What the agent sent wrong (code that raises or times out, a
tool call with bad arguments, an unknown tool, a server's own error result) is its observation,
``info["tool_error"] = True``, and the episode goes on. A tool that cannot do its job (a sandbox
that cannot start, a server that died or does not answer) raises :class:`omrl.envs.EnvError`: the
episode ends as ``env_error`` with that reason, is counted, and never trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from omrl.envs import Env, EpisodeFinishedError, Observation, StepResult
from omrl.errors import ConfigError, short_repr

ANSWER_TOOL = "answer"
CALL = re.compile(r"([A-Za-z_][\w.\-/]*)\[")  # how an action that reads as a tool call starts: name[...]


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: the text shown to the model, and whether the call itself was at fault."""

    text: str
    error: bool = False


class Tool(Protocol):
    """A callable tool: its spec in the OpenAI function format, and a call on an argument dict."""

    spec: dict[str, Any]  # {"name", "description", "parameters" (a JSON schema)}

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        """Run the call; raise omrl.envs.EnvError when the tool (not the call) failed."""

    def end_episode(self) -> None:
        """The episode is over: drop what belonged to it (a live interpreter)."""

    def close(self) -> None:
        """Free what the tool holds (processes, connections)."""


def single_string_argument(spec: dict[str, Any]) -> str | None:
    """The name of a tool's only argument when its schema says it is a string (``code`` of ``python``;
    an optional string, ``anyOf`` string and null, too), else None: an argument of any type or of no
    stated type (``Any``) takes JSON."""
    props = (spec.get("parameters") or {}).get("properties") or {}
    if len(props) == 1:
        ((name, schema),) = props.items()
        if isinstance(schema, dict) and _is_string(schema):
            return name
    return None


def _is_string(schema: dict[str, Any]) -> bool:
    """Whether a JSON schema admits strings and nothing but strings (and null)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        return "string" in kind and set(kind) <= {"string", "null"}
    if kind is not None:
        return kind == "string"
    options = schema.get("anyOf") or schema.get("oneOf")
    if not isinstance(options, list) or not all(isinstance(option, dict) for option in options):
        return False
    kinds = [option.get("type") for option in options]
    return "string" in kinds and set(kinds) <= {"string", "null"}


def truncate(text: str, limit: int, what: str = "output") -> str:
    """``text`` cut to ``limit`` characters, ending with a note saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[{what} truncated: {len(text) - limit} more characters]"


def _refused(tool: str, why: str) -> StepResult:
    """A call that was not made (no calls left, no closing bracket): the agent's error, the episode goes on."""
    return StepResult(why, 0.0, False, {"won": False, "score": 0.0, "tool": tool, "tool_error": True, "invalid": True})


class ToolEnv(Env):
    """An env with tools beside its own actions; the wrapped env holds the tasks and the scoring."""

    io_bound = True
    deterministic = False

    def __init__(self, inner: Env, tools: Sequence[Tool], max_calls: int = 4):
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
            raise ConfigError(f"max_calls (tool calls an episode may make) must be 1 or more, got {max_calls!r}")
        self.inner, self.max_calls = inner, max_calls
        self.own_tools = {tool.spec["name"]: tool for tool in tools}
        inner_tools = list(getattr(inner, "tools", None) or [])
        clash = sorted(set(self.own_tools) & ({t["name"] for t in inner_tools} | {ANSWER_TOOL}))
        if clash:
            raise ConfigError(
                f"tool name(s) {', '.join(clash)} clash with the wrapped env {type(inner).__name__}'s own tools and "
                f"actions ({', '.join(sorted({t['name'] for t in inner_tools} | {ANSWER_TOOL}))}); wrap an env "
                "without them, or rename the tool"
            )
        self.answers_as_tool = not inner_tools
        if self.answers_as_tool:
            inner_tools = [
                {
                    "name": ANSWER_TOOL,
                    "description": f"Give your final answer; it ends the episode. {inner.action_help}".strip(),
                    "parameters": {
                        "type": "object",
                        "properties": {"answer": {"type": "string"}},
                        "required": ["answer"],
                    },
                }
            ]
        self.tools = [*inner_tools, *(tool.spec for tool in tools)]
        self._call_names = [*self.own_tools, *([ANSWER_TOOL] if self.answers_as_tool else [])]
        self.splits = inner.splits
        self.max_turns = inner.max_turns + max_calls
        self.demonstration = ()
        self.calls, self.finished = 0, True
        names = ", ".join(f"{name}[...]" for name in self.own_tools)
        final = "answer[your answer]" if self.answers_as_tool else "one of the task's actions"
        self.action_help = (
            f"Call a tool ({names}) to compute something, at most {max_calls} times, then finish with {final}. "
            f"{inner.action_help}"
        ).strip()
        finish = f"the {ANSWER_TOOL} tool" if self.answers_as_tool else "one of the task's tools"
        self.tool_help = (  # the same, for a template that offers the tools as calls: no python[...] there
            f"Call a tool ({', '.join(self.own_tools)}) to compute something, at most {max_calls} times, then "
            f"finish with {finish}. {getattr(inner, 'tool_help', '') or inner.action_help}"
        ).strip()

    def task_ids(self, split: str) -> Sequence[int]:
        return self.inner.task_ids(split)

    def reset(self, task_id: int) -> Observation:
        self.end_tools()
        first = self.inner.reset(task_id)
        self.calls, self.finished = 0, False
        return first

    def step(self, action: str) -> StepResult:
        if self.finished:  # the wrapped env would refuse an answer; a tool call must not run either
            raise EpisodeFinishedError(f"{type(self).__name__}: the episode is over; call reset(task_id) first")
        call = self._split_call(action)
        if call is None:
            unknown = CALL.match(action.strip()) if self.answers_as_tool else None
            if unknown:  # a misspelt or withheld tool: not the answer
                return _refused(unknown[1], self._no_such_tool(unknown[1]))
            return self._finish(self.inner.step(action))
        name, raw = call
        if raw is None:  # a call cut off (the reply's token cap) or unclosed: neither run nor scored
            return _refused(name, f"The call to {name} has no closing `]`: write {name}[...] with its argument inside.")
        if name in self.own_tools:
            return self._call(self.own_tools[name], raw)
        return self._finish(self.inner.step(raw.strip()))  # answer[...]

    def _split_call(self, action: str) -> tuple[str, str | None] | None:
        """(tool, its argument text) when ``action`` calls one of this env's tools (``answer`` too,
        where it is one), the text None when the ``]`` is missing; None for any other action.
        Tool names are matched as they are, so an MCP tool named ``files/read`` works too."""
        text = action.strip()
        for name in self._call_names:
            if text.startswith(name + "["):
                return name, (text[len(name) + 1 : -1] if text.endswith("]") else None)
        return None

    def _no_such_tool(self, name: str) -> str:
        tools = ", ".join(self._call_names)
        return f"There is no tool {name}; the tools are {tools}. Finish with {ANSWER_TOOL}[your answer]."

    def _finish(self, result: StepResult) -> StepResult:
        self.finished = result.done
        return result

    def _call(self, tool: Tool, raw: str) -> StepResult:
        name = tool.spec["name"]
        if self.calls >= self.max_calls:
            return _refused(name, f"No tool calls left (at most {self.max_calls} an episode); give your answer now.")
        self.calls += 1
        arguments, problem = self._arguments(tool.spec, raw)
        result = ToolResult(problem, error=True) if problem else tool.call(arguments)
        return StepResult(
            result.text, 0.0, False, {"won": False, "score": 0.0, "tool": name, "tool_error": result.error}
        )

    @staticmethod
    def _arguments(spec: dict[str, Any], raw: str) -> tuple[dict[str, Any], str]:
        """A call's arguments from its action text, or ({}, what is wrong with it)."""
        only = single_string_argument(spec)
        if only is not None:
            return {only: raw}, ""
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return {}, f"The arguments of {spec['name']} must be a JSON object: {exc}."
        if not isinstance(value, dict):
            return {}, f"The arguments of {spec['name']} must be a JSON object, got {short_repr(value)}."
        return value, ""

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        if name in self.own_tools:
            only = single_string_argument(self.own_tools[name].spec)
            if only is not None and set(arguments) <= {only}:
                value = arguments.get(only, "")  # a value that is not text (the model's slip) as JSON, not repr
                return f"{name}[{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}]"
            return f"{name}[{json.dumps(arguments, ensure_ascii=False)}]"
        if name == ANSWER_TOOL and self.answers_as_tool:
            return f"{ANSWER_TOOL}[{arguments.get('answer', '')}]"
        if self.answers_as_tool:  # no such tool: a call that step refuses, not an answer
            if not CALL.fullmatch(f"{name}["):
                raise ValueError(self._no_such_tool(short_repr(name)))
            return f"{name}[{json.dumps(arguments, ensure_ascii=False)}]"
        return self.inner.action_from_tool_call(name, arguments)

    def expert_action(self) -> str | None:
        action = self.inner.expert_action()
        if action is None or not self.answers_as_tool:
            return action
        return f"{ANSWER_TOOL}[{action}]"

    def expert_thought(self) -> str:
        return self.inner.expert_thought()

    def end_tools(self) -> None:
        for tool in self.own_tools.values():
            tool.end_episode()

    def end_episode(self) -> None:
        self.finished = True
        self.end_tools()
        self.inner.end_episode()

    def close(self) -> None:
        try:
            for tool in self.own_tools.values():
                tool.close()
        finally:
            self.inner.close()
