"""The env protocol every multi-turn text environment follows.

An env plugin registers a subclass of :class:`Env`. One instance plays one
episode at a time; the rollout runs many instances side by side. Envs that do
I/O (HTTP, a subprocess) set ``io_bound = True`` and are stepped concurrently
from a thread pool.

Life of an instance::

    env = EnvClass(**options)            # options from the config's per-plugin block
    env.task_ids("train")                # the tasks of a split
    first = env.reset(task_id)           # -> Observation(text, instruction, info)
    result = env.step("click[buy now]")  # -> StepResult(observation, reward, done, info)
    env.admissible_actions()             # valid actions now, or None if unknown
    env.expert_action()                  # a scripted expert's next action, or None
    env.expert_thought()                 # optional: why, in a sentence, for that action's reply ("" if none)
    env.demonstration                    # a worked example for the prompt (DemoTurns), or ()
    state = env.snapshot()               # optional: the live episode as a value ...
    other.restore(state)                 # ... another instance continues from (tree search forks with it)
    env.close()

An env with several agents (a two-player game, a solver and its verifier) declares its *seats*
and plays them in turn; :mod:`omrl.rollout.seats` gives each seat its own chat::

    seats = ("player_0", "player_1")     # class attribute; () (the default): one agent
    first = env.reset(task_id)           # first.seat moves first; first.views: each seat's opening text
    result = env.step(action)            # the action of the seat to move; result.seat moves next,
                                         # result.views: what each seat sees of this step (its own view),
                                         # on the last step result.seat_rewards: every seat's reward
    env.scripted_action(seat)            # the env's own player's move for the seat to move, or None

A seated env is stepped with ``""`` for a reply that did not parse, so its invalid-move rule
(retry, forfeit) holds for every seat alike and no game stalls on one seat's format. Seat rewards
lie in [-1, 1]: +1 a win, -1 a loss, 0 a draw (a role: +1 it succeeded, -1 it failed).

``StepResult.info`` carries ``won`` (bool) and ``score`` (float in [0, 1]), kept apart from the step
reward; the last step (``done``) must carry both, or the rollout ends the episode as env_error naming
the env (a step before it may leave them out: not won, score 0). A step that was a tool call (code
run, a server's tool) names the tool in ``info["tool"]`` and sets ``info["tool_error"]`` when the call
went wrong; the metrics count them (``tool_call_rate``, ``valid_tool_call_rate``). An invalid action
returns an explanatory observation with ``info["invalid"] = True``; it never raises. Stepping a finished
episode raises :class:`EpisodeFinishedError`; an unknown task raises
:class:`UnknownTaskError`. The answers' types and their checks live in :mod:`omrl.env_results`; this
module offers them all, as it offers every name of the contract.
"""

from __future__ import annotations

import inspect
import itertools
import numbers
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from omrl.env_results import (
    Observation,
    StepResult,
    check_seats,
    reset_problem,
    seat_reset_problem,
    seat_step_problem,
    step_problem,
)
from omrl.errors import ConfigError, OmrlError, short_repr
from omrl.plugin_options import check_arguments, option_type_problem

# the plugin contract: every name a plugin imports from here, the answers and their checks included
__all__ = [
    "DemoTurn",
    "Env",
    "EnvError",
    "EpisodeFinishedError",
    "Observation",
    "StepResult",
    "UnknownTaskError",
    "check_arguments",
    "check_seats",
    "check_task",
    "clean_text",
    "create_env",
    "env_variant",
    "fork_support",
    "install_command",
    "package_installed",
    "reset_problem",
    "seat_reset_problem",
    "seat_step_problem",
    "step_problem",
]


class EnvError(OmrlError):
    """An environment failed (its server died, its engine crashed)."""


class UnknownTaskError(EnvError, KeyError):
    """A task id that the env's split does not contain."""

    def __str__(self) -> str:
        return str(self.args[0])


class EpisodeFinishedError(EnvError):
    """``step`` was called after the episode ended."""


@dataclass(frozen=True)
class DemoTurn:
    """One turn of an env's worked example: what the env showed and a good reply to it."""

    observation: str
    thought: str
    action: str


class Env(ABC):
    """Base class of a multi-turn text environment."""

    #: one line shown in `omrl plugins` / `omrl env list` comes from the class docstring
    #: How the agent acts, shown to the model by the action template, e.g.
    #: "search[keywords] or click[value]".
    action_help: ClassVar[str] = "Reply with one action as plain text."
    #: A concrete action for the template's example, e.g. "search[red shoes]" ("" derives one from ``tools``).
    action_example: ClassVar[str] = ""
    #: Actions as tools, for the tool_call template: [{"name", "description", "parameters"}]
    #: plus how to turn a call into action text: see ``action_from_tool_call``.
    tools: ClassVar[list[dict[str, Any]]] = []
    #: ``action_help`` for a template that offers ``tools`` as function calls, without the text syntax of
    #: ``action_help`` ("call the python tool", not "python[...]"); "" uses ``action_help``.
    tool_help: ClassVar[str] = ""
    #: True for envs that wait on I/O: the rollout steps them from a thread pool.
    io_bound: ClassVar[bool] = False
    #: The split names this env offers.
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    #: A sensible cap on turns per episode.
    max_turns: ClassVar[int] = 15
    #: A short worked example of another task (a one-shot prompt, as ReAct used), shown before each
    #: task unless ``env.demonstration=false``: small models follow the action format far more often.
    demonstration: ClassVar[tuple[DemoTurn, ...]] = ()
    #: True when an episode is a function of its task and actions alone (the same actions always
    #: give the same observations, rewards and info): tree search may then copy a live episode by
    #: replaying its actions from ``reset`` when the env has no ``snapshot``/``restore``.
    deterministic: ClassVar[bool] = False
    #: The PyPI distribution whose engine the env plays ("" when omrl itself holds the env) and the
    #: omrl extra that installs it: `omrl env list` reads both without building the env.
    package: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    #: The seats of a game played by several agents, in a fixed order, e.g. ("player_0", "player_1"):
    #: each gets its own chat (omrl.rollout.seats). () (the default): one agent plays every turn.
    seats: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def task_ids(self, split: str) -> Sequence[int]:
        """The task ids of ``split``; an unknown split raises UnknownTaskError."""

    @abstractmethod
    def reset(self, task_id: int) -> Observation:
        """Start the episode of ``task_id`` and return the first observation."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Play ``action``; invalid actions return an explanatory observation."""

    def admissible_actions(self) -> list[str] | None:
        """The actions valid now, or None where the env does not know them."""
        return None

    def expert_action(self) -> str | None:
        """A scripted expert's next action, or None where the env has no expert."""
        return None

    def scripted_action(self, seat: str) -> str | None:
        """Seated envs: the env's own player's move for ``seat``, the seat to move now (a random legal move,
        or a rule-based one), or None where the env has no player of its own (the default)."""
        return None

    def expert_thought(self) -> str:
        """Why the expert plays its next action, in a short sentence, or "" (the default). Asked right
        after :meth:`expert_action`, before the step; the template writes it as the reply's reasoning,
        so expert SFT data teaches a thought where the env gives one and no empty one where it does not."""
        return ""

    def action_from_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        """Turn a tool call into this env's action text (default: ``name[arg]``)."""
        values = list(arguments.values())
        if not values:
            return name
        return f"{name}[{values[0]}]" if len(values) == 1 else f"{name}[{', '.join(map(str, values))}]"

    def snapshot(self) -> Any:
        """The live episode's state, as a value :meth:`restore` takes (optional; tree search forks with it).

        The value must stay as it is while this instance plays on, and restoring it (any number
        of times, onto any instance built with the same options) must not change it either:
        immutable values (tuples, frozen dataclasses) or fresh copies. Envs that cannot copy an
        episode keep this default, which raises NotImplementedError.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot snapshot an episode")

    def restore(self, state: Any) -> None:
        """Continue the episode that :meth:`snapshot` returned ``state`` for, on this instance."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore an episode")

    def end_episode(self) -> None:
        """The episode this instance played is over, finished or cut short (a turn cap, a full
        context); the next call, if any, is a reset. An env whose episode holds something outside
        the process (a server-side env) frees it here, at once; the default holds nothing."""

    def close(self) -> None:
        """Free what the instance holds (connections, processes)."""

    def check_reachable(self) -> None:
        """Optional: raise :class:`EnvError` when the service this env plays on cannot be reached (one cheap
        request, no retries). A run asks before its model loads (:func:`check_env_reachable`), so a server that
        is down costs seconds, not a model's load; an env that plays in-process has nothing to check."""

    def tasks_of(self, name: str, split: str) -> Sequence[int]:
        """:meth:`split_of`, or a ConfigError where the split holds no task, naming ``name`` (the env's
        registered name) and the splits that have tasks: nothing is played on an empty split."""
        ids = self.split_of(split)
        if len(ids):
            return ids
        others = [f"{other} ({len(self.split_of(other))})" for other in self.splits if other != split]
        held = [text for text in others if not text.endswith(" (0)")]
        try:
            options = ", ".join(inspect.signature(type(self)).parameters) or "none"
        except (TypeError, ValueError):
            options = "none"
        raise ConfigError(
            f"env {name!r} has no tasks in split {split!r}; "
            + (f"splits with tasks: {', '.join(held)} (--split or env.split)" if held else "no split has tasks")
            + f"; or give it tasks there through its options (plugins.{name}.* or -o): {options}"
        )

    def split_of(self, split: str) -> Sequence[int]:
        """``task_ids`` with a clear error for an unknown split name, or for an answer that is no ids."""
        if split not in self.splits:
            raise UnknownTaskError(f"{type(self).__name__} has no split {split!r}; valid: {', '.join(self.splits)}")
        ids = self.task_ids(split)
        if (
            isinstance(ids, (str, bytes, dict))
            or not (hasattr(ids, "__len__") and hasattr(ids, "__iter__"))
            or not isinstance(ids, range)
            and any(not isinstance(i, numbers.Integral) or isinstance(i, bool) for i in itertools.islice(ids, 8))
        ):
            raise EnvError(
                f"env {type(self).__name__}'s task_ids({split!r}) returned {short_repr(ids)}; it must return the "
                "split's task ids as a sequence of ints, e.g. range(100) or a list"
            )
        return ids


def fork_support(env: Env) -> str | None:
    """How a live episode of ``env`` can be copied: ``"snapshot"`` (it implements ``snapshot`` and
    ``restore``), ``"replay"`` (it is ``deterministic``: replay the actions from ``reset``), or None."""
    cls = type(env)
    if cls.snapshot is not Env.snapshot and cls.restore is not Env.restore:
        return "snapshot"
    # read on the instance: an env may decide per instance (an option, a server's answer)
    return "replay" if getattr(env, "deterministic", False) is True else None


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str | None) -> str:
    """``text`` writable as UTF-8: lone surrogates (which no file format can hold) become U+FFFD."""
    if not text:
        return ""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def package_installed(env_class: type[Env]) -> bool:
    """Whether the distribution ``env_class.package`` is installed (True when it needs none); imports nothing."""
    if not env_class.package:
        return True
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(env_class.package)
        return True
    except PackageNotFoundError:
        return False


def install_command(env_class: type[Env]) -> str:
    """How to install the package ``env_class`` needs: its omrl extra, else the package itself."""
    extra = getattr(env_class, "extra", "")
    return f"pip install 'omrl[{extra}]'" if extra else f"pip install {env_class.package}"


def env_variant(env_class: type[Env], class_name: str, doc: str, **fixed: Any) -> type[Env]:
    """A subclass of ``env_class`` with the options ``fixed`` set, for registering one game of a family
    under its own name (``textarena:Sudoku-v0``) without importing the game's package.

    The variant's signature leaves the fixed options out, so passing one is refused with the
    options it does take.
    """
    signature = inspect.signature(env_class)
    unknown = sorted(set(fixed) - set(signature.parameters))
    if unknown:
        raise TypeError(f"{env_class.__name__} takes no options {unknown}")

    def __init__(self, **options: Any) -> None:
        env_class.__init__(self, **fixed, **options)

    variant = type(
        class_name,
        (env_class,),
        {"__init__": __init__, "__doc__": doc, "__module__": env_class.__module__, "fixed_options": dict(fixed)},
    )
    variant.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for name, p in signature.parameters.items() if name not in fixed]
    )
    return variant


def check_task(env: Env, task_id: int, known: Sequence[int] | range) -> None:
    """Raise UnknownTaskError naming the valid range when ``task_id`` is not known."""
    if task_id in known:
        return
    if isinstance(known, range):
        valid = f"{known.start}..{known.stop - 1}"
    else:
        valid = f"{len(known)} ids, e.g. {', '.join(map(str, list(known)[:5]))}"
    raise UnknownTaskError(f"{type(env).__name__}: unknown task id {task_id!r}; valid: {valid}")


def check_env_reachable(env_class: Any, options: dict[str, Any] | None, name: str) -> None:
    """Ask an env whose class answers :meth:`Env.check_reachable` whether its service is up: an instance is
    made (a constructor must not connect), asked and closed. Others are not built: some load data for seconds."""
    if getattr(env_class, "check_reachable", Env.check_reachable) is Env.check_reachable:
        return
    env = create_env(env_class, options, name)
    try:
        env.check_reachable()
    finally:
        env.close()


def create_env(env_class: type[Env], options: dict[str, Any] | None = None, name: str = "") -> Env:
    """An instance of ``env_class`` built with ``options`` (the config's ``plugins.<env>`` block).

    Options the class does not take raise ConfigError naming the ones it does; so does a value of another
    kind where the parameter is annotated a flag or a number (:func:`option_type_problem`), once the env's
    own checks, which say more, had their say: an env that checks nothing would meet the text mid-episode,
    as its own failure. An ``__init__`` that fails on such a value (comparing ``"abc" < 3``) fails on the
    user's option, not on a bug of the env.
    """
    options = dict(options or {})
    what = f"env {name or env_class.__name__!r}"
    check_arguments(env_class, options, what, "options")
    problem = option_type_problem(inspect.signature(env_class), options, by_default=False)
    try:
        env = env_class(**options)
    except ConfigError:
        raise
    except Exception as exc:
        if problem:
            raise ConfigError(f"{what} option {problem}") from exc
        raise
    if problem:
        close = getattr(env, "close", None)
        if callable(close):
            close()
        raise ConfigError(f"{what} option {problem}")
    return env
