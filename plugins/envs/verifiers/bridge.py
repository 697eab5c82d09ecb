"""The bridge between a verifiers environment's own rollout, running on the env's event loop, and omrl's turns:
a :class:`Rollout` holds what the two threads hand each other, and the ``Client`` of :func:`bridge_client`
is the rollout's model, handing each model turn to omrl and waiting for the reply ``step`` gives back."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omrl_plugins.envs.verifiers.messages import tool_spec

if TYPE_CHECKING:
    from omrl_plugins.envs.verifiers.env import VerifiersEnv


@dataclass
class Rollout:
    """One rollout on the env's loop: the events it sends the env's thread, and the model turn it waits on."""

    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    task: Any = None  # the asyncio task of the rollout
    reply: Any = None  # the loop future the waiting model turn resolves with a Response
    prompt: list[Any] = field(default_factory=list)  # the prompt of the waiting model turn
    previous: list[Any] = field(default_factory=list)  # the prompt before it and the reply it answers
    answer: Any = None  # the row's answer
    turns: int = 0


async def stop_rollout(task: asyncio.Task) -> None:
    """Cancel a rollout and wait for its cleanup (verifiers runs its cleanup handlers on the way out)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


@functools.cache
def bridge_client(vf: Any) -> type:
    """The verifiers ``Client`` whose model is omrl: each request hands the prompt to the env's thread and waits
    for the reply that ``step`` gives back."""

    class OmrlClient(vf.Client):
        def __init__(self, owner: VerifiersEnv, episode: Rollout):
            super().__init__(None)
            self.owner, self.episode = owner, episode

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):  # noqa: ANN001
            episode = self.episode
            reply = asyncio.get_running_loop().create_future()
            episode.prompt, episode.reply = list(prompt), reply
            episode.events.put(("turn", [tool_spec(t) for t in tools or []]))
            return await reply

        def setup_client(self, config):  # noqa: ANN001
            return None

        async def to_native_tool(self, tool):  # noqa: ANN001
            return tool

        async def to_native_prompt(self, messages):  # noqa: ANN001
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):  # noqa: ANN001
            raise NotImplementedError("omrl samples the model itself")

        async def raise_from_native_response(self, response):  # noqa: ANN001
            return None

        async def from_native_response(self, response):  # noqa: ANN001
            return response

        async def close(self) -> None:
            return None

    return OmrlClient
