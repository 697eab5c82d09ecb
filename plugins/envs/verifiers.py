"""``verifiers:<module>``: environments written for PrimeIntellect's verifiers (PyPI ``verifiers``, the format
of prime-rl's Environments Hub), played in omrl's own token-exact loop.

Install with ``pip install 'omrl[verifiers]'`` (verifiers 0.3.1: its classic ``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, ``StatefulToolEnv`` and what is built on them). An environment is a module with
``load_environment(**args)``: an installed environment package, registered as ``verifiers:<module>`` (found from
package metadata, nothing imported), or any importable module, played by the ``verifiers`` env
(``plugins.verifiers.module=my_envs.wordle``) or registered under a name by a plugin (:func:`variant`).
Options (config block ``plugins."verifiers:<module>"``):

- ``args``: ``load_environment``'s arguments (``plugins."verifiers:wordle".args.num_train_examples=100``);
  one it does not take is refused, naming the ones it does.
- ``tool_format`` (``hermes``): how replies write tool calls (a format of :mod:`omrl.chat.tool_calls`).
- ``timeout_s`` (600): seconds the environment may take to answer a turn (its ``env_response``, its tools,
  its stop conditions) or to score the episode.
- ``reward_errors`` (``raise``): a reward function that raises ends the episode as ``env_error``, naming it;
  ``zero`` keeps verifiers' own rule (it scores 0), listing the failures in ``info["reward_errors"]``.

How it plays: each env instance holds one loaded environment and an event loop on a thread of its own. A reset
starts the environment's own ``rollout`` there, with a client that hands each model turn to omrl: omrl samples
the reply, ``step`` gives it back as the assistant message, and the environment answers (``env_response``, its
tools) and keeps its state until its stop conditions (``is_completed``) end the episode; then its ``Rubric``
scores the rollout, as verifiers scores one. The prompt is laid out as verifiers sends it: its system message is
the system prompt of the ``verifiers_reply`` template (and the env's ``action_help``, which other templates
show), few-shot user/assistant pairs are the env's worked example (``env.demonstration``), and the last user
message is the first observation. ``verifiers_reply`` hands the whole reply to the environment (its parser reads
it) and offers a tool environment's tools to the chat template; the environment reads the reply's tool calls in
``tool_format`` as a serving engine's parser would (the text before them is the message's content).

Tasks: ``train`` is the environment's ``dataset`` (task id = row index), ``test`` its ``eval_dataset`` (task id
1,000,000 + row index). Without an eval dataset there is no ``test`` split (verifiers would fall back to the
train rows); without a dataset, no ``train`` split.

Rewards: the last step's reward is the rubric's reward (its weighted sum of reward functions); ``score`` is that
reward clipped to [0, 1], and ``won`` verifiers' own pass (reward >= the environment's ``pass_threshold``), so
the ``goal`` reward works as for any env. The last turn's info holds ``verifiers_reward`` (the rubric's reward),
``verifiers_metrics`` (the value of every rubric function and metric, and ``parser_format``, the parser's format
reward where it has one), ``stop_condition`` and the row's ``answer``. The ``verifiers_rubric`` reward trains on
the rubric's reward, or on one function's value (option ``metric``). A turn is ``format_ok`` when the parser's
format reward is 1 for its reply.

Refused, naming what it needs: environments that need a service (verifiers' sandboxes, browsers, OpenEnv
servers), rubrics or environments that call a model over the network (``JudgeRubric``, an OpenAI or Anthropic
client), group reward functions and rubric advantages (omrl scores each episode on its own and estimates
advantages itself), images in messages, and an environment that rewrites the conversation instead of extending
it or changes its tools mid-episode. An error the environment raises (or a ``vf.Error`` other than a tool
error, which is the agent's) ends the episode as ``env_error``.

verifiers' ``Environment`` installs SIGINT/SIGTERM handlers and an atexit teardown for every instance: omrl
keeps its own handlers (those would replace them, and fail off the main thread) and runs the teardown at
``close`` (or at exit).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import queue
import re
import signal
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

from omrl.chat.tool_calls import FORMATS, call_text, parse_tool_calls, tools_system_text
from omrl.data.trajectory import Episode
from omrl.envs import (
    DemoTurn,
    Env,
    EnvError,
    EpisodeFinishedError,
    Observation,
    StepResult,
    UnknownTaskError,
    check_arguments,
    env_variant,
)
from omrl.errors import ConfigError, short_repr
from omrl.hookspecs import hookimpl
from omrl.rewards import RewardError, episode_reward
from omrl.templates import ParsedAction, Template
from omrl_plugins.envs.engines.common import require

NAME = "verifiers"
TEMPLATE = "verifiers_reply"  # the template's and the reward's names differ from the env's: each reads its
REWARD = "verifiers_rubric"  # options from the config's plugins block under its own name
TEST_START = 1_000_000  # test task id = TEST_START + eval-dataset row
DEFAULT_MAX_TURNS = 50  # for an environment without its own max_turns (-1)
MODEL = "omrl"  # the model name the environment's state records
DEFAULT_HELP = "Reply as the task asks: the environment reads your whole reply."
REWARD_ERRORS = ("raise", "zero")
# verifiers' environment classes that need a service omrl does not run, by class name (matched in the MRO)
NEEDS_SERVICE = {
    "SandboxEnv": "Prime Intellect's sandbox service (prime-sandboxes and an API key)",
    "SandboxMixin": "Prime Intellect's sandbox service (prime-sandboxes and an API key)",
    "BrowserEnv": "a remote browser (Browserbase)",
    "OpenEnvEnv": "an OpenEnv server (omrl plays those itself: the openenv env)",
}


# -- finding and loading environments --------------------------------------------------------------------------
def module_name(env_id: str) -> str:
    """The module of an environment id, as verifiers names it: ``owner/vf-wordle`` -> ``vf_wordle``."""
    return env_id.replace("-", "_").split("/")[-1]


@functools.cache
def installed_environments() -> tuple[str, ...]:
    """The modules of installed verifiers environment packages, read from package metadata (nothing imported):
    distributions that need ``verifiers`` (not as an extra) whose top-level module names ``load_environment``.
    Read once per process."""
    found = set()
    for dist in importlib.metadata.distributions():
        if any(_needs_verifiers(line) for line in dist.requires or []):
            found.update(module for module in _top_modules(dist) if _mentions_load_environment(dist, module))
    return tuple(sorted(found))


def _needs_verifiers(requirement: str) -> bool:
    """Whether a ``Requires-Dist`` line asks for verifiers itself (``verifiers>=0.3``), not for an extra."""
    spec, _, marker = requirement.partition(";")
    return re.split(r"[\s\[(<>=!~]", spec.strip(), maxsplit=1)[0].lower() == NAME and "extra" not in marker


def _top_modules(dist: importlib.metadata.Distribution) -> list[str]:
    """A distribution's top-level modules: its ``top_level.txt``, its files, or (an editable install) its name."""
    listed = (dist.read_text("top_level.txt") or "").split()
    files = [str(path) for path in dist.files or []]
    listed += [f[:-3] for f in files if "/" not in f and f.endswith(".py")]
    listed += [f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith("/__init__.py")]
    return sorted(set(listed)) or [module_name(dist.metadata["Name"] or "")]


def _mentions_load_environment(dist: importlib.metadata.Distribution, module: str) -> bool:
    for relative in (f"{module}.py", f"{module}/__init__.py"):
        path = dist.locate_file(relative)
        if path.is_file():
            return "load_environment" in path.read_text(encoding="utf-8", errors="replace")
    try:  # an editable install: the module is elsewhere on the path
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8", errors="replace") as source:
        return "load_environment" in source.read()


class _Inert:
    """A module as verifiers' environment module sees it: ``signal.signal`` and ``atexit.register`` do nothing."""

    def __init__(self, module: Any):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def signal(self, *args: Any) -> None:
        return None

    def register(self, *args: Any, **kwargs: Any) -> None:
        return None


def import_verifiers(env_name: str) -> Any:
    """``verifiers.legacy`` (the classic environments), with its per-instance process hooks turned off."""
    require("verifiers", env_name, NAME)
    try:
        vf = importlib.import_module("verifiers.legacy")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{env_name}: the installed verifiers has no classic environments (verifiers.legacy: {exc}); omrl plays "
            "verifiers 0.3.1's SingleTurnEnv, MultiTurnEnv and ToolEnv: pip install 'omrl[verifiers]'"
        ) from exc
    environment = importlib.import_module("verifiers.legacy.envs.environment")
    if not isinstance(environment.signal, _Inert):
        environment.signal, environment.atexit = _Inert(signal), _Inert(atexit)
    return vf


def load(module: str, args: dict[str, Any], env_name: str) -> Any:
    """``module.load_environment(**args)``; ConfigError naming what is wrong."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ConfigError(
                f"{env_name}: no module {module!r} (install the environment's package, or put its module on the "
                f"path); installed verifiers environments: {', '.join(installed_environments()) or '(none)'}"
            ) from exc
        raise ConfigError(f"{env_name}: module {module!r} needs a package that is not installed: {exc}") from exc
    load_environment = getattr(loaded, "load_environment", None)
    if not callable(load_environment):
        raise ConfigError(f"{env_name}: module {module!r} has no load_environment(); a verifiers environment has one")
    check_arguments(load_environment, args, f"{env_name}: load_environment", "args")
    try:
        env = load_environment(**args)
    except Exception as exc:
        raise ConfigError(
            f"{env_name}: load_environment({_arguments(args)}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    env.env_id = getattr(env, "env_id", "") or module
    env.env_args = getattr(env, "env_args", None) or dict(args)
    return env


def _arguments(args: dict[str, Any]) -> str:
    return ", ".join(f"{key}={short_repr(value)}" for key, value in args.items())


def refusals(env: Any) -> list[str]:
    """What omrl cannot honour in ``env`` (and the environments of an EnvGroup), one line each."""
    problems = []
    for klass in type(env).__mro__:
        if klass.__name__ in NEEDS_SERVICE and klass.__module__.startswith("verifiers."):
            problems.append(f"{type(env).__name__} needs {NEEDS_SERVICE[klass.__name__]}")
            break
    clients = _client_types()
    for name, value in vars(env).items():
        if isinstance(value, clients):
            problems.append(f"the environment holds {type(value).__name__} {name!r}: it calls a model over the network")
    for rubric in rubrics_of(env.rubric):
        if any(klass.__name__ == "JudgeRubric" for klass in type(rubric).__mro__):
            model = getattr(rubric, "judge_model", "?")
            problems.append(f"its rubric {type(rubric).__name__} asks a judge model ({model}) over the network")
        else:
            held = [name for name, value in rubric.class_objects.items() if isinstance(value, clients)]
            if held:
                problems.append(f"its rubric {type(rubric).__name__} holds a model client ({', '.join(held)})")
        group = [getattr(f, "__name__", repr(f)) for f in rubric.funcs if rubric._is_group_func(f)]
        if group:
            problems.append(
                f"its reward functions {', '.join(group)} score a group of rollouts together; omrl scores "
                "each episode on its own"
            )
    if env.provides_advantages:
        problems.append("its rubric computes advantages; omrl's algorithm estimates them")
    for child in getattr(env, "envs", None) or []:  # an EnvGroup
        problems += [f"{type(child).__name__}: {line}" for line in refusals(child)]
    return problems


def _client_types() -> tuple[type, ...]:
    types: list[type] = []
    for module, names in (("openai", ("OpenAI", "AsyncOpenAI")), ("anthropic", ("Anthropic", "AsyncAnthropic"))):
        with contextlib.suppress(ImportError):
            loaded = importlib.import_module(module)
            types += [getattr(loaded, name) for name in names if hasattr(loaded, name)]
    return tuple(types)


def rubrics_of(rubric: Any) -> list[Any]:
    """A rubric and every rubric inside it (a RubricGroup's, an EnvGroup's environments')."""
    out = [rubric]
    for child in getattr(rubric, "rubrics", None) or []:
        out += rubrics_of(child)
    for env in (getattr(rubric, "env_map", None) or {}).values():
        out += rubrics_of(env.rubric)
    return out


def _watched(func: Any, failures: list[str]) -> Any:
    """``func`` (a reward function), noting in ``failures`` what it raised before raising it again."""

    @functools.wraps(func)
    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        except Exception as exc:
            failures.append(f"{getattr(func, '__name__', repr(func))}: {type(exc).__name__}: {exc}")
            raise

    watched.omrl_watched = True  # type: ignore[attr-defined]
    return watched


# -- messages ------------------------------------------------------------------------------------------------
class NotText(Exception):
    """A message holds a part omrl cannot lay out as text (an image, audio)."""


def text_of(message: Any) -> str:
    """A message's content as text; NotText for a part that is not text."""
    content = message.get("content") if hasattr(message, "get") else None
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type") if hasattr(part, "get") else getattr(part, "type", None)
        if kind != "text":
            raise NotText(f"a part of type {kind or type(part).__name__!r}")
        texts.append(part.get("text") or "")
    return "\n".join(texts)


def role_of(message: Any) -> str:
    return str(message.get("role") if hasattr(message, "get") else "")


def layout(prompt: Sequence[Any]) -> tuple[str, tuple[DemoTurn, ...], str]:
    """A verifiers prompt as omrl lays out a chat: (its system text, its few-shot user/assistant pairs as a
    worked example, its remaining messages as the first observation)."""
    messages = list(prompt)
    system = []
    while messages and role_of(messages[0]) == "system":
        system.append(text_of(messages.pop(0)))
    demo = []
    while len(messages) >= 3 and [role_of(m) for m in messages[:2]] == ["user", "assistant"]:
        if messages[1].get("tool_calls"):
            break
        demo.append(DemoTurn(text_of(messages[0]), "", text_of(messages[1])))
        messages = messages[2:]
    return "\n\n".join(system), tuple(demo), "\n\n".join(text_of(m) for m in messages)


def same_messages(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two message lists hold the same roles and texts."""
    try:
        return [(role_of(m), text_of(m)) for m in a] == [(role_of(m), text_of(m)) for m in b]
    except NotText:
        return len(a) == len(b)


def tool_spec(tool: Any) -> dict[str, Any]:
    """A verifiers ``Tool`` as omrl's tool spec ``{name, description, parameters}``."""
    return {"name": tool.name, "description": tool.description or "", "parameters": dict(tool.parameters)}


# -- the env -----------------------------------------------------------------------------------------------------
@dataclass
class _Episode:
    """One rollout on the env's loop: the events it sends the env's thread, and the model turn it waits on."""

    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    task: Any = None  # the asyncio task of the rollout
    reply: Any = None  # the loop future the waiting model turn resolves with a Response
    prompt: list[Any] = field(default_factory=list)  # the prompt of the waiting model turn
    previous: list[Any] = field(default_factory=list)  # the prompt before it and the reply it answers
    answer: Any = None  # the row's answer
    turns: int = 0


_live: weakref.WeakSet[VerifiersEnv] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    """At exit: the environments' teardown, for instances nobody closed."""
    for env in list(_live):
        with contextlib.suppress(Exception):
            env.close()


class VerifiersEnv(Env):
    """An environment written for verifiers (the Environments Hub's format), turn by turn (omrl[verifiers])."""

    package = "verifiers"
    extra = "verifiers"
    io_bound = True  # each turn waits on the environment's own event loop
    action_help = DEFAULT_HELP
    max_turns = DEFAULT_MAX_TURNS

    def __init__(
        self,
        module: str,
        args: dict[str, Any] | None = None,
        tool_format: str = "hermes",
        timeout_s: float = 600.0,
        reward_errors: str = "raise",
    ):
        self.name = f"{NAME}:{module}"
        if tool_format not in FORMATS:
            raise ConfigError(f"{self.name}: unknown tool_format {tool_format!r}; valid: {', '.join(FORMATS)}")
        if reward_errors not in REWARD_ERRORS:
            raise ConfigError(f"{self.name}: reward_errors must be one of {', '.join(REWARD_ERRORS)}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"{self.name}: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if args is not None and not isinstance(args, dict):
            raise ConfigError(f"{self.name}: args must be a mapping of load_environment's arguments")
        self.tool_format, self.timeout_s, self.reward_errors = tool_format, float(timeout_s), reward_errors
        self.vf = import_verifiers(self.name)
        self.module = module_name(module)
        self.env = load(self.module, dict(args or {}), self.name)
        if not isinstance(self.env, self.vf.Environment):
            raise ConfigError(f"{self.name}: load_environment returned a {type(self.env).__name__}, not an Environment")
        problems = refusals(self.env)
        if problems:
            raise ConfigError(f"{self.name} cannot be played by omrl: {'; '.join(problems)}")
        self.datasets = {"train": self.env.build_dataset(), "test": self.env.build_eval_dataset()}
        if len(self.datasets["train"] or ()) > TEST_START:
            raise ConfigError(f"{self.name}: its dataset has more than {TEST_START:,} rows, where test task ids start")
        self.splits = tuple(split for split, rows in self.datasets.items() if rows is not None)
        own = int(getattr(self.env, "max_turns", -1) or -1)
        self.max_turns = own if own > 0 else DEFAULT_MAX_TURNS
        self.system_prompt, self.demonstration = "", ()
        self.tools: list[dict[str, Any]] = [tool_spec(t) for t in self.env.tool_defs or []]
        parser_class = self.vf.Parser
        parser = self.env.parser
        overrides = type(parser).get_format_reward_func is not parser_class.get_format_reward_func
        self._format = parser.get_format_reward_func() if overrides else None
        self._reward_failures: list[str] = []
        self._tool_failed = False
        self._watch_tools()
        self._episode: _Episode | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"omrl-{self.name}", daemon=True)
        self._thread.start()
        _live.add(self)

    # -- tasks
    def task_ids(self, split: str) -> Sequence[int]:
        if split not in self.splits:
            missing = {"train": "dataset", "test": "eval_dataset"}.get(split)
            why = f" (its environment has no {missing})" if missing else ""
            raise UnknownTaskError(f"{self.name} has no split {split!r}{why}; valid: {', '.join(self.splits)}")
        start = TEST_START if split == "test" else 0
        return range(start, start + len(self.datasets[split]))

    def split_of(self, split: str) -> Sequence[int]:
        return self.task_ids(split)  # names the dataset the environment lacks

    def _row(self, task_id: int) -> dict[str, Any]:
        for split in self.splits:
            ids = self.task_ids(split)
            if task_id in ids:
                return dict(self.datasets[split][task_id - ids.start])
        valid = ", ".join(f"{s} {self.task_ids(s).start}..{self.task_ids(s).stop - 1}" for s in self.splits)
        raise UnknownTaskError(f"{self.name}: unknown task id {task_id!r}; valid: {valid}")

    # -- an episode
    def reset(self, task_id: int) -> Observation:
        row = self._row(task_id)
        self.end_episode()
        self._watch_rewards()
        self._reward_failures.clear()
        episode = self._episode = _Episode(answer=row.get("answer"))
        episode.task = self._on_loop(self._start(row, episode))
        kind, value = self._next_event(episode, "its first turn")
        if kind == "done":
            self._episode = None
            why = self._failure(value) or f"stop condition {value.get('stop_condition')!r}"
            raise EnvError(f"{self.name} ended task {task_id} before the model's first turn ({why})")
        try:
            system, demo, observation = layout(episode.prompt)
        except NotText as exc:
            self.end_episode()
            raise EnvError(f"{self.name}: task {task_id}'s prompt holds {exc}; omrl plays text only") from exc
        self.system_prompt, self.demonstration = system, demo
        self.action_help = system or DEFAULT_HELP
        self.tools = value
        info = {"won": False, "score": 0.0, "example_id": row.get("example_id", task_id)}
        return Observation(observation, observation, info)

    def step(self, action: str) -> StepResult:
        episode = self._episode
        if episode is None or episode.reply is None:
            raise EpisodeFinishedError(f"{self.name}: no episode in progress; call reset(task_id) to start one")
        message, info = self._reply_message(action, episode)
        asked, episode.reply = episode.reply, None
        episode.previous = [*episode.prompt, message]
        response = self.vf.Response(
            id=f"omrl-{uuid.uuid4().hex[:12]}", created=int(time.time()), model=MODEL, usage=None, message=message
        )
        self._tool_failed = False
        self._loop.call_soon_threadsafe(lambda: asked.done() or asked.set_result(response))
        kind, value = self._next_event(episode, "the model's reply")
        if self._tool_failed:
            info["tool_error"] = True
        if kind == "turn":
            return StepResult(self._answer(episode, value), 0.0, False, {"won": False, "score": 0.0, **info})
        self._episode = None
        return self._final(value, episode, info)

    def _reply_message(self, action: str, episode: _Episode) -> tuple[Any, dict[str, Any]]:
        """The reply as verifiers' assistant message: its tool calls read as ``tool_format`` writes them."""
        episode.turns += 1
        if not self.tools:
            return self.vf.ResponseMessage(content=action, finish_reason="stop", is_truncated=False), {}
        read = parse_tool_calls(action, self.tools, self.tool_format)
        info: dict[str, Any] = {"tool_calls": [attempt.record() for attempt in read.attempts]}
        calls = [
            self.vf.ToolCall(id=f"call_{episode.turns}_{i}", name=call.name, arguments=json.dumps(call.arguments))
            for i, call in enumerate(read.calls)
        ]
        if calls:
            info["tool"] = read.calls[0].name
            info["tool_error"] = any(call.status != "ok" for call in read.calls)
        message = self.vf.ResponseMessage(
            content=read.content if calls else action,
            tool_calls=calls or None,
            finish_reason="tool_calls" if calls else "stop",
            is_truncated=False,
        )
        return message, info

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call the ``tool_call`` template parsed, as reply text this env reads (``tool_format`` hermes or json)."""
        if self.tool_format == "json":
            return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
        return call_text(name, arguments)

    def _answer(self, episode: _Episode, tools: list[dict[str, Any]]) -> str:
        """The environment's answer to the reply: the messages the new prompt adds after it."""
        if tools != self.tools:
            self.end_episode()
            raise EnvError(f"{self.name} changed its tools mid-episode; omrl renders an episode's tools once")
        prompt, previous = episode.prompt, episode.previous
        if len(prompt) <= len(previous) or not same_messages(prompt[: len(previous)], previous):
            self.end_episode()
            raise EnvError(
                f"{self.name} rewrote the conversation (its get_prompt_messages does not extend the previous "
                "prompt and reply); omrl's token-exact loop only extends a chat"
            )
        try:
            return "\n\n".join(text_of(m) for m in prompt[len(previous) :])
        except NotText as exc:
            self.end_episode()
            raise EnvError(f"{self.name} answered with {exc}; omrl plays text only") from exc

    def _final(self, state: Any, episode: _Episode, info: dict[str, Any]) -> StepResult:
        """The last step: the rubric's reward and metrics, and the environment's final answer if it gave one."""
        failure = self._failure(state)
        if failure:
            raise EnvError(f"{self.name} failed: {failure}")
        if self._reward_failures and self.reward_errors == "raise":
            raise EnvError(
                f"{self.name}: a reward function raised ({'; '.join(self._reward_failures)}); "
                "plugins.<env>.reward_errors=zero scores it 0 as verifiers does"
            )
        reward = float(state.get("reward") or 0.0)
        metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
        if "omrl_parser_format" in state:
            metrics["parser_format"] = float(state["omrl_parser_format"])
        error = state.get("error")
        final = state.get("final_env_response")
        try:
            observation = "\n\n".join(text_of(m) for m in final or [])
        except NotText as exc:
            raise EnvError(f"{self.name}'s final answer holds {exc}; omrl plays text only") from exc
        stop = state.get("stop_condition")
        info = {
            **info,
            "won": math.isfinite(reward) and reward >= float(getattr(self.env, "pass_threshold", 0.5)),
            "score": min(1.0, max(0.0, reward)) if math.isfinite(reward) else reward,
            "verifiers_reward": reward,
            "verifiers_metrics": metrics,
            "stop_condition": stop,
        }
        if isinstance(episode.answer, str):
            info["answer"] = episode.answer
        if error is not None:  # a tool error the environment stops on: the agent's
            info["invalid"], info["error"] = True, f"{type(error).__name__}: {error}"
        if self._reward_failures:
            info["reward_errors"] = list(self._reward_failures)
        return StepResult(observation or f"The episode is over ({stop}).", reward, True, info)

    def _failure(self, state: Any) -> str | None:
        """Why the rollout failed in the environment (its ``vf.Error``, a tool error excepted), or None."""
        error = state.get("error")
        if error is None or isinstance(error, self.vf.ToolError):
            return None
        cause = error.__cause__
        return f"{type(error).__name__}: {error}" + (f" (from {type(cause).__name__}: {cause})" if cause else "")

    def format_ok(self, reply: str) -> bool:
        """Whether ``reply`` follows the parser's format (its format reward is 1); True where it has none."""
        if self._format is None:
            return True
        content = reply
        if self.tools:
            read = parse_tool_calls(reply, self.tools, self.tool_format)
            content = read.content if read.calls else reply
        message = self.vf.AssistantMessage(content=content)
        from verifiers.legacy.utils.async_utils import maybe_call_with_named_args

        try:
            value = self._on_loop(
                maybe_call_with_named_args(self._format, completion=[message], parser=self.env.parser)
            )
            return float(value.result(self.timeout_s)) >= 1.0 - 1e-9
        except Exception:  # noqa: BLE001 - a template's parse never raises
            return False

    def end_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is None or episode.task is None:
            return
        task = episode.task.result(self.timeout_s)
        with contextlib.suppress(Exception):
            self._on_loop(_stop(task)).result(self.timeout_s)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        _live.discard(self)
        try:
            self.end_episode()
            self._on_loop(self.env._teardown()).result(self.timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout_s)
            if not self._loop.is_running():
                self._loop.close()

    # -- the environment's loop
    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _start(self, row: dict[str, Any], episode: _Episode) -> asyncio.Task:
        return asyncio.ensure_future(self._play(row, episode))

    async def _play(self, row: dict[str, Any], episode: _Episode) -> None:
        """The environment's own rollout, scored by its rubric as verifiers scores one (in ``_run_rollout_state``)."""
        env = self.env
        try:
            client = bridge_client(self.vf)(self, episode)
            state = await env.rollout(row, client, MODEL, {})
            if env.score_rollouts:
                await env.rubric.score_rollout(state)
            else:
                await env.rubric.dummy_score_rollout(state)
            if self._format is not None and isinstance(state.get("completion"), list):
                from verifiers.legacy.utils.async_utils import maybe_call_with_named_args

                value = await maybe_call_with_named_args(
                    self._format, completion=state["completion"], parser=env.parser
                )
                state["omrl_parser_format"] = value
            await env.rubric.cleanup(state)
        except asyncio.CancelledError:  # end_episode: nobody waits for it
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the env's thread, which raises it as EnvError
            episode.events.put(("failed", exc))
            return
        episode.events.put(("done", state))

    def _next_event(self, episode: _Episode, waiting_for: str) -> tuple[str, Any]:
        """The rollout's next event: ("turn", tools) when it asks the model again, ("done", state) at its end."""
        try:
            kind, value = episode.events.get(timeout=self.timeout_s)
        except queue.Empty:
            self.end_episode()
            raise EnvError(
                f"{self.name} did not answer {waiting_for} within {self.timeout_s:g} s (plugins.<env>.timeout_s)"
            ) from None
        if kind == "failed":
            self._episode = None
            raise EnvError(f"{self.name} failed: {type(value).__name__}: {value}") from value
        return kind, value

    def _watch_tools(self) -> None:
        """Note a tool call that raised (the environment answers it with the error's text: the agent's)."""
        call_tool = getattr(self.env, "call_tool", None)
        if call_tool is None:
            return

        @functools.wraps(call_tool)
        async def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return await call_tool(*args, **kwargs)
            except Exception:
                self._tool_failed = True
                raise

        self.env.call_tool = watched

    def _watch_rewards(self) -> None:
        for rubric in rubrics_of(self.env.rubric):
            rubric.funcs = [
                f if getattr(f, "omrl_watched", False) else _watched(f, self._reward_failures) for f in rubric.funcs
            ]


async def _stop(task: asyncio.Task) -> None:
    """Cancel a rollout and wait for its cleanup (verifiers runs its cleanup handlers on the way out)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


@functools.cache
def bridge_client(vf: Any) -> type:
    """The verifiers ``Client`` whose model is omrl: each request hands the prompt to the env's thread and waits
    for the reply that ``step`` gives back."""

    class OmrlClient(vf.Client):
        def __init__(self, owner: VerifiersEnv, episode: _Episode):
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


def variant(module: str) -> type[Env]:
    """The env class that plays ``module``'s environment (``verifiers:<module>``): register it under a name of
    your own from a plugin, ``register("verifiers:mine", variant("my_envs.mine"))``."""
    return _variant(module_name(module))


@functools.cache
def _variant(module: str) -> type[Env]:
    return env_variant(
        VerifiersEnv,
        "Verifiers_" + "".join(c if c.isalnum() else "_" for c in module),
        f"The verifiers environment {module} (pip install 'omrl[verifiers]').",
        module=module,
    )


# -- the template ------------------------------------------------------------------------------------------------
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


# -- the reward --------------------------------------------------------------------------------------------------
@episode_reward
def verifiers_reward(episode: Episode, metric: str = "") -> float:
    """The verifiers rubric's reward of the episode (its weighted sum of reward functions), on the last turn;
    with ``metric``, that function's or metric's value (``plugins.verifiers_rubric.metric=correct_answer``).

    An episode that omrl cut short (``max_turns``, ``max_context``, an empty reply) was never scored by the
    rubric: it gets 0. An episode of another env is an error.
    """
    info = episode.turns[-1].info
    if "verifiers_reward" not in info:
        if episode.end_reason != "done":
            return 0.0
        raise RewardError(
            f"reward {REWARD!r}: episode of env {episode.env!r} (task {episode.task_id}) has no verifiers score; "
            "it scores the episodes of verifiers environments"
        )
    if not metric:
        return float(info["verifiers_reward"])
    metrics = info.get("verifiers_metrics") or {}
    if metric not in metrics:
        raise RewardError(
            f"reward {REWARD!r}: env {episode.env!r} has no metric {metric!r}; its metrics: "
            f"{', '.join(sorted(metrics)) or '(none)'}"
        )
    return float(metrics[metric])


# -- hooks -------------------------------------------------------------------------------------------------------
@hookimpl
def register_envs(register):
    register(NAME, VerifiersEnv)
    for module in installed_environments():
        register(f"{NAME}:{module}", _variant(module))


@hookimpl
def register_templates(register):
    register(TEMPLATE, VerifiersTemplate)


@hookimpl
def register_rewards(register):
    register(REWARD, verifiers_reward)
