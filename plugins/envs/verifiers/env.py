"""The ``verifiers`` env: one loaded verifiers environment, played turn by turn in omrl's token-exact loop.

How it plays: each env instance holds one loaded environment and an event loop on a thread of its own. A reset
starts the environment's own ``rollout`` there, with a client that hands each model turn to omrl (:mod:`.bridge`):
omrl samples the reply, ``step`` gives it back as the assistant message, and the environment answers
(``env_response``, its tools) and keeps its state until its stop conditions (``is_completed``) end the episode;
then its ``Rubric`` scores the rollout, as verifiers scores one. The prompt is laid out as verifiers sends it
(:mod:`.messages`): its system message is the system prompt of the ``verifiers_reply`` template (and the env's
``action_help``, which other templates show), few-shot user/assistant pairs are the env's worked example
(``env.demonstration``), and the last user message is the first observation. ``verifiers_reply``
(:mod:`.template`) hands the whole reply to the environment (its parser reads it) and offers a tool environment's
tools to the chat template; the environment reads the reply's tool calls in ``tool_format`` as a serving
engine's parser would (the text before them is the message's content).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import math
import queue
import threading
import time
import uuid
import weakref
from typing import Any, Sequence

from omrl.chat.tool_calls import FORMATS, call_text
from omrl.envs import Env, EnvError, EpisodeFinishedError, Observation, StepResult, UnknownTaskError, env_variant
from omrl.errors import ConfigError, short_repr
from omrl_plugins.envs.verifiers.bridge import Rollout, bridge_client, stop_rollout
from omrl_plugins.envs.verifiers.installed import NAME, module_name
from omrl_plugins.envs.verifiers.loading import import_verifiers, load
from omrl_plugins.envs.verifiers.messages import (
    NotText,
    layout,
    reply_content,
    reply_message,
    same_messages,
    text_of,
    tool_spec,
)
from omrl_plugins.envs.verifiers.refusals import refusals
from omrl_plugins.envs.verifiers.rubric import format_reward, rubric_scores, watch_rewards

TEST_START = 1_000_000  # test task id = TEST_START + eval-dataset row
DEFAULT_MAX_TURNS = 50  # for an environment without its own max_turns (-1)
MODEL = "omrl"  # the model name the environment's state records
DEFAULT_HELP = "Reply as the task asks: the environment reads your whole reply."
REWARD_ERRORS = ("raise", "zero")


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
        self.module = module_name(module) if isinstance(module, str) else ""
        if not all(part.isidentifier() for part in self.module.split(".")):
            raise ConfigError(
                f"{NAME}: module={short_repr(module)} is not a module name; valid: an importable module with "
                "load_environment() (plugins.verifiers.module=my_envs.wordle) or an environment id (owner/vf-wordle)"
            )
        self.name = f"{NAME}:{module}"
        if tool_format not in FORMATS:
            raise ConfigError(f"{self.name}: unknown tool_format {tool_format!r}; valid: {', '.join(FORMATS)}")
        if reward_errors not in REWARD_ERRORS:
            raise ConfigError(f"{self.name}: reward_errors must be one of {', '.join(REWARD_ERRORS)}")
        seconds = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)  # true is no 1 s
        if not (seconds and math.isfinite(timeout_s) and timeout_s > 0):
            raise ConfigError(
                f"{self.name}: option timeout_s={short_repr(timeout_s)} is invalid; valid: a positive number of "
                "seconds (plugins.<env>.timeout_s=600)"
            )
        if args is not None and not isinstance(args, dict):
            raise ConfigError(f"{self.name}: args must be a mapping of load_environment's arguments")
        self.tool_format, self.timeout_s, self.reward_errors = tool_format, float(timeout_s), reward_errors
        self.vf = import_verifiers(self.name)
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
        self._format = format_reward(self.vf, self.env.parser)
        self._reward_failures: list[str] = []
        self._tool_failed = False
        self._watch_tools()
        self._episode: Rollout | None = None
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
        episode = self._episode = Rollout(answer=row.get("answer"))
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
        episode.turns += 1
        message, info = reply_message(self.vf, action, self.tools, self.tool_format, episode.turns)
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

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call the ``tool_call`` template parsed, as reply text this env reads (``tool_format`` hermes or json)."""
        if self.tool_format == "json":
            return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
        return call_text(name, arguments)

    def _answer(self, episode: Rollout, tools: list[dict[str, Any]]) -> str:
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

    def _final(self, state: Any, episode: Rollout, info: dict[str, Any]) -> StepResult:
        """The last step: the rubric's reward and metrics, and the environment's final answer if it gave one."""
        failure = self._failure(state)
        if failure:
            raise EnvError(f"{self.name} failed: {failure}")
        if self._reward_failures and self.reward_errors == "raise":
            raise EnvError(
                f"{self.name}: a reward function failed ({'; '.join(self._reward_failures)}); "
                "plugins.<env>.reward_errors=zero scores it 0 as verifiers does"
            )
        reward, metrics = rubric_scores(state)
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
        message = self.vf.AssistantMessage(content=reply_content(reply, self.tools, self.tool_format))
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
            self._on_loop(stop_rollout(task)).result(self.timeout_s)

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

    async def _start(self, row: dict[str, Any], episode: Rollout) -> asyncio.Task:
        return asyncio.ensure_future(self._play(row, episode))

    async def _play(self, row: dict[str, Any], episode: Rollout) -> None:
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

    def _next_event(self, episode: Rollout, waiting_for: str) -> tuple[str, Any]:
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
        watch_rewards(self.env.rubric, self._reward_failures)


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
