"""The action-template protocol: how a model is told to act and how its reply is parsed.

A template plugin registers a subclass of :class:`Template`.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from omrl.envs import Env


@dataclass
class ParsedAction:
    """A parsed model response.

    ``action`` is the env action text, or None when nothing could be parsed;
    ``format_ok`` says whether the reply followed the template exactly (rewards
    use it); ``error`` explains a parse failure and is shown to the model.

    ``tool_call`` is set by templates of models that call tools natively: the call in the
    structured form chat templates render (``{"type": "function", "function": {"name": ...,
    "arguments": {...}}}``). The rollout then records the reply with ``tool_calls`` and sends
    the env's answer back as a ``tool`` message where the chat template has that role.
    """

    action: str | None
    format_ok: bool
    thought: str | None = None
    error: str | None = None
    tool_call: dict | None = None


class Template(ABC):
    """Renders the system instructions for an env and parses replies into actions."""

    #: What a well-formed reply holds exactly once, as regular expressions read with ``re.M`` (``^`` is a
    #: line start), e.g. ``("<think>", "</think>", "<action>", "</action>")``: the ``tag_count`` reward
    #: pays the share of them a reply has exactly once. ``()`` (the default): the template has no tags, and
    #: ``tag_count`` scores 0 (with a warning) unless given ``tags``. It may be set per instance (per option).
    reply_tags: tuple[str, ...] = ()

    @abstractmethod
    def system_prompt(self, env: "Env") -> str:
        """The system message that tells the model how to reply for ``env``."""

    @abstractmethod
    def parse(self, response: str, env: "Env") -> ParsedAction:
        """Parse one model response into an action; never raises (a reply it cannot read is a ParsedAction with
        an ``error``). One that raises, or returns anything but a ParsedAction whose action is text or None, is a
        broken plugin: the rollout ends that episode as env_error, naming the template."""

    @abstractmethod
    def format_action(self, action: str, env: "Env", thought: str = "") -> str:
        """``action`` written as a well-formatted reply (the prompt's example, expert demonstrations): text, never
        empty (an expert's reply the template writes no text for ends its episode as env_error)."""

    def answer(self, response: str) -> str:
        """The end of ``response`` that this template's format applies to, after a thinking model's reasoning
        it skips (``without_reasoning`` of the built-ins); the ``tag_count`` reward counts tags in it
        (:attr:`omrl.data.Turn.answer`). The default: the whole reply."""
        return response

    def chat_template_kwargs(self, env: "Env") -> dict:
        """Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. ``tools``)."""
        return {}

    def call_format(self) -> str | None:
        """The format this template tells the model to write tool calls in (a name of
        :data:`omrl.chat.tool_calls.FORMATS`), or None when its replies are not tool calls. Where the
        turn offers tools (``tools`` of :meth:`chat_template_kwargs`), the rollout classifies every call
        attempt of each reply, as the gateway does (``Turn.info["tool_calls"]``)."""
        return None


def reward_options(
    template: Template | None, weights: Iterable[str], options: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each weighted reward's options (its ``plugins.<name>`` entry of ``options``). A reward whose signature
    takes ``reply_tags`` (``tag_count``) gets ``template``'s :attr:`Template.reply_tags` there, the run's
    template, unless its options set them."""
    from omrl import registry

    out = {}
    for name in weights:
        opts = dict(options.get(name) or {})
        if template is not None and "reply_tags" not in opts and _takes(registry.rewards.get(name), "reply_tags"):
            opts["reply_tags"] = list(getattr(template, "reply_tags", ()))
        out[name] = opts
    return out


def _takes(fn: Any, name: str) -> bool:
    """Whether ``fn``'s signature has a parameter ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
