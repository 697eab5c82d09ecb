"""The fakes every test shares: envs (the `keys` chest; the forkable `chest` and its variants that
replay, cannot fork or lie), a one-line action template, scripted backends, and the plugins that
register them (the ``fake_plugins`` and ``chest_plugins`` fixtures)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.envs import Env, EnvError, EpisodeFinishedError, Observation, StepResult, check_task
from omrl.hookspecs import hookimpl
from omrl.templates import ParsedAction, Template


class OneTaskEnv(Env):
    """Task 0 only: the first step ends the episode, neither won nor scored."""

    def task_ids(self, split: str) -> Sequence[int]:
        return [0]

    def reset(self, task_id: int) -> Observation:
        return Observation("page", "do the task")

    def step(self, action: str) -> StepResult:
        return StepResult("ok", 0.0, True, {"won": False, "score": 0.0})


def tool(name: str, description: str, required: list[str], **properties: dict) -> dict:
    """A tool as an env lists it in ``tools``: the function ``name`` of an object of ``properties`` (each
    argument's JSON schema), of which ``required`` must be given."""
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


class KeyEnv(Env):
    """Find the key: ``open`` reveals it, ``take key`` wins; anything else is invalid."""

    action_help = "Reply with `Action: <open|take key>`."
    max_turns = 4
    instances = 0  # how many were ever built (reset by the fixture)

    def __init__(self, fail_task: int = -1, empty_task: int = -1):
        KeyEnv.instances += 1
        self.fail_task, self.empty_task = fail_task, empty_task
        self.task = -1
        self.steps = 0  # steps played by this instance, over all its episodes

    def task_ids(self, split: str) -> Sequence[int]:
        return range(6)

    def reset(self, task_id: int) -> Observation:
        check_task(self, task_id, range(6))
        self.task, self.opened = task_id, False
        text = "" if task_id == self.empty_task else f"A locked chest number {task_id} stands here."
        return Observation(text, f"Find the key of chest {task_id}.")

    def step(self, action: str) -> StepResult:
        self.steps += 1
        if self.task == self.fail_task:
            raise EnvError(f"chest {self.task} exploded")
        if action == "open":
            self.opened = True
            return StepResult(
                f"Chest {self.task} is open; a key glints inside.", 0.0, False, {"won": False, "score": 0.5}
            )
        if action == "take key" and self.opened:
            return StepResult("You hold the key. Well done.", 1.0, True, {"won": True, "score": 1.0})
        return StepResult(
            f"Nothing happens to chest {self.task}.", 0.0, False, {"won": False, "score": 0.0, "invalid": True}
        )

    def expert_action(self) -> str | None:
        return "take key" if self.opened else "open"


class IOKeyEnv(KeyEnv):
    """KeyEnv marked I/O-bound: the pool steps it from threads."""

    io_bound = True


class ActionTemplate(Template):
    """Replies are `Action: <action>`."""

    def system_prompt(self, env: Env) -> str:
        return f"You play a text game. {env.action_help}"

    def parse(self, response: str, env: Env) -> ParsedAction:
        text = response.strip()
        if text.startswith("Action:") and text[len("Action:") :].strip():
            return ParsedAction(text[len("Action:") :].strip(), True)
        return ParsedAction(None, False, error="the reply must start with `Action:`")

    def format_action(self, action: str, env: Env, thought: str = "") -> str:
        return f"Action: {action}"


class ScriptedBackend(Backend):
    """Replies chosen by a function ``reply(call, prompt_index, prompt_ids) -> text or ids``.

    Text is encoded and closed with the end-of-turn token; ids are returned as
    given (so a test can pick exact ids, or leave the end-of-turn token out).
    Every token gets log-prob ``logprob``; every call's prompt count is kept in ``calls``.
    """

    name = "scripted"

    def __init__(self, tokenizer, reply: Callable[[int, int, list[int]], str | list[int]], logprob: float = -0.5):
        super().__init__(tokenizer, batch_size=4)
        self.reply, self.logprob = reply, logprob
        self.calls: list[int] = []

    def generate(self, prompts, params: SamplingParams, messages=None) -> list[Generation]:
        call = len(self.calls)
        self.calls.append(len(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            got = self.reply(call, i, list(prompt))
            ids = (
                got
                if isinstance(got, list)
                else self.tokenizer.encode(got, add_special_tokens=False) + [self.eos_token_id]
            )
            out.append(self._cut(ids, [self.logprob] * len(ids), params.limit(i)))
        return out


class CountingBackend(Backend):
    """Wraps a backend and records the number of prompts of every generate call."""

    name = "counting"

    def __init__(self, inner: Backend):
        super().__init__(inner.tokenizer, inner.batch_size)
        self.inner = inner
        self.calls: list[int] = []

    def generate(self, prompts, params, messages=None):
        self.calls.append(len(prompts))
        return self.inner.generate(prompts, params, messages)


class Registers:
    """A plugin that registers ``envs`` and ``templates`` (each a dict of names to classes), for one test
    with the ``register_plugin`` fixture: ``register_plugin(Registers({"switch": SwitchEnv}), name=...)``."""

    def __init__(self, envs: dict[str, type], templates: dict[str, type] | None = None):
        self.envs, self.templates = envs, templates or {}

    @hookimpl
    def register_envs(self, register):
        for name, env_class in self.envs.items():
            register(name, env_class)

    @hookimpl
    def register_templates(self, register):
        for name, template_class in self.templates.items():
            register(name, template_class)


class FakePlugin(Registers):
    """Registers the `keys` env and the `action` template."""

    def __init__(self):
        super().__init__({"keys": KeyEnv}, {"action": ActionTemplate})


@dataclass(frozen=True)
class ChestState:
    task: int
    opened: bool
    turn: int
    done: bool


class ChestEnv(Env):
    """Open the chest, then take the key (won); smashing it ends the episode lost; `boom` makes the env raise."""

    action_help = "Reply with `Action: <open|take key|smash>`."
    max_turns = 4
    deterministic = True

    def __init__(self):
        self.task, self.opened, self.turn, self.done = -1, False, 0, True

    def task_ids(self, split: str) -> Sequence[int]:
        return range(4)

    def reset(self, task_id: int) -> Observation:
        check_task(self, task_id, range(4))
        self.task, self.opened, self.turn, self.done = task_id, False, 0, False
        return Observation(f"Chest {task_id} is locked.", f"Get the key of chest {task_id}.")

    def step(self, action: str) -> StepResult:
        if self.done:
            raise EpisodeFinishedError("the chest episode is over")
        self.turn += 1
        if action == "boom":
            raise EnvError(f"chest {self.task} exploded")
        if action == "open":
            self.opened = True
            return StepResult(f"Chest {self.task} is open.", 0.0, False, {"won": False, "score": 0.5})
        if action == "take key" and self.opened:
            self.done = True
            return StepResult("You hold the key.", 1.0, True, {"won": True, "score": 1.0})
        if action == "smash":
            self.done = True
            return StepResult("The key broke.", 0.0, True, {"won": False, "score": 0.0})
        return StepResult(
            f"Nothing happens to chest {self.task}.",
            0.0,
            False,
            {"won": False, "score": 0.5 if self.opened else 0.0, "invalid": True},
        )

    def snapshot(self) -> ChestState:
        return ChestState(self.task, self.opened, self.turn, self.done)

    def restore(self, state: ChestState) -> None:
        self.task, self.opened, self.turn, self.done = state.task, state.opened, state.turn, state.done


class ReplayChestEnv(ChestEnv):
    """The chest without snapshot/restore: deterministic, so it forks by replaying its actions."""

    snapshot = Env.snapshot
    restore = Env.restore
    resets = 0

    def reset(self, task_id: int) -> Observation:
        ReplayChestEnv.resets += 1
        return super().reset(task_id)


class PlainChestEnv(ReplayChestEnv):
    """A chest that can neither snapshot nor replay."""

    deterministic = False


class LyingChestEnv(ReplayChestEnv):
    """Declares itself deterministic, yet its observations count how often any instance was reset."""

    counter = itertools.count()

    def reset(self, task_id: int) -> Observation:
        first = super().reset(task_id)
        return Observation(f"{first.text} (visit {next(LyingChestEnv.counter)})", first.instruction)


def by_call(*rounds: Sequence[str]) -> Callable[[int, int, list[int]], str]:
    """A reply function: ``rounds[call][index]`` (the last entry of a round repeats)."""

    def reply(call: int, index: int, prompt: list[int]) -> str:
        options = rounds[min(call, len(rounds) - 1)]
        return options[min(index, len(options) - 1)]

    return reply


class ChestPlugin(Registers):
    """Registers the chest envs and the `chest-action` template."""

    def __init__(self):
        envs = {"chest": ChestEnv, "chest-replay": ReplayChestEnv, "chest-plain": PlainChestEnv}
        super().__init__(envs, {"chest-action": ActionTemplate})
