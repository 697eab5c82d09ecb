"""``code`` and ``code:<env>``: a sandboxed Python interpreter as a tool beside any env's actions.

``code:reasoning-gym:products`` is reasoning-gym's ``products`` with a ``python`` tool: the model
may run code (``python[print(1663 * 5242)]``, or a native tool call), reads its output, and
answers with ``answer[8717446]``; the dataset's own scorer scores the answer. Every reasoning-gym
dataset has its ``code:`` name; ``code`` with ``env=`` wraps any other env (``env=gem:...``,
``env=dataset`` with ``options={"path": ...}``).

Options (``plugins."code:reasoning-gym:products".<option>``): ``env`` and ``options`` (the wrapped
env and its own options; fixed in the ``code:`` names), ``persistent`` (False: each call starts a
fresh interpreter; True: one interpreter per episode keeps its variables), ``timeout_s`` (5, per
call), ``memory_mb`` (512: the sandbox's address space, shared by its up to 4 processes, so the
interpreter gets 128 MB), ``max_output_chars`` (2000: stdout's start and stderr's end, half each; a
cut result says so),
``max_calls`` (4 python calls an episode), ``warm`` (2 interpreters kept started per process),
``expert_uses_tool`` (True; False: the expert answers at once, for demonstrations without the tool).

The code runs in omrl's sandbox (`omrl.sandbox`), never outside it: a host that cannot build the
sandbox (not Linux, not root, no ``unshare``) is refused when the env is built.

The expert (``omrl rollout --expert``) of an arithmetic question runs its expression through the
tool (``python[print(1663 * 5242)]``) and then gives the wrapped env's own expert answer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

from omrl.envs import create_env, env_variant
from omrl.errors import ConfigError, short_repr
from omrl.registry import envs as env_registry
from omrl_plugins.envs.code.python_tool import PythonTool
from omrl_plugins.envs.tooling import ANSWER_TOOL, ToolEnv

# an arithmetic expression inside a question: numbers joined by + - * / and parentheses
_EXPRESSION = re.compile(r"[-(]*\s*\d[\d.\s]*(?:\)*\s*[-+*/]\s*[-(\s]*\d[\d.\s]*)+\)*")


def expression_in(question: str) -> str | None:
    """The longest arithmetic expression in ``question`` ("Calculate 5 - 3 - 6." -> "5 - 3 - 6")."""
    found = [match.group(0).strip().rstrip(".").strip() for match in _EXPRESSION.finditer(question)]
    found = [text for text in found if text.count("(") == text.count(")")]
    return max(found, key=len) if found else None


def check_wrapped(env: Any, options: Any) -> None:
    """ConfigError naming the option unless ``env`` is an env's name and ``options`` a mapping (or None)."""
    if not isinstance(env, str) or not env:
        raise ConfigError(
            f"code option env={short_repr(env)} is invalid; valid: the name of the env to wrap, e.g. "
            "reasoning-gym:products or dataset"
        )
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"code option options={short_repr(options)} is invalid; valid: a mapping of the wrapped env's options, "
            "e.g. {path: qa.jsonl} for env=dataset"
        )


class CodeEnv(ToolEnv):
    """A Python interpreter in omrl's sandbox as a tool beside any env's actions (``env=``)."""

    def __init__(
        self,
        env: str = "reasoning-gym:products",
        options: dict[str, Any] | None = None,
        persistent: bool = False,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
        max_calls: int = 4,
        warm: int = 2,
        expert_uses_tool: bool = True,
    ):
        check_wrapped(env, options)
        with contextlib.ExitStack() as undo:  # a constructor that fails leaves no env open and no sandbox started
            inner = create_env(env_registry.get(env), dict(options or {}), env)
            undo.callback(inner.close)
            tool = PythonTool(persistent, timeout_s, memory_mb, max_output_chars, warm)
            undo.callback(tool.close)
            super().__init__(inner, [tool], max_calls)
            undo.pop_all()
        self.question, self.expert_uses_tool = "", expert_uses_tool

    def reset(self, task_id: int):
        first = super().reset(task_id)
        self.question = first.text
        return first

    def expert_action(self) -> str | None:
        expression = expression_in(self.question)
        if self.expert_uses_tool and self.calls == 0 and expression is not None:
            return f"python[print({expression})]"
        return super().expert_action()

    def expert_thought(self) -> str:
        if self.expert_uses_tool and expression_in(self.question) is not None:
            return "Python computes it exactly." if self.calls == 0 else "Python printed the answer."
        return super().expert_thought()


def code_variant(inner: str, package: str = "", extra: str = "") -> type[CodeEnv]:
    """``code:<inner>``: CodeEnv with its wrapped env fixed, as its own registry name."""
    variant = env_variant(
        CodeEnv,
        "Code_" + re.sub(r"\W", "_", inner),
        f"{inner} with a sandboxed python tool ({ANSWER_TOOL}[...] ends the episode).",
        env=inner,
    )
    variant.package, variant.extra = package, extra
    return variant
