"""The tasks of an ``agentgym`` server: its splits' task ids, from the options, listed by an omrl
server's ``GET /tasks`` or from a known AgentGym server's table, and the self-description (action
help, turn cap, example) that an omrl server's answer carries.

A known name may be served by omrl (``omrl env serve textcraft``): its server is asked ``GET /tasks``
at the first need of splits, turn cap or action help, and when it describes itself its splits win
over the table (the splits option wins over both). AgentGym's own servers lack the route (404/405):
the table then. One that cannot be reached: the table too, until a ``/create`` answer names an omrl
instance, which asks again.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from omrl.envs import UnknownTaskError
from omrl.errors import ConfigError, short_repr
from omrl_plugins.envs.agentgym.held_env import HeldEnv
from omrl_plugins.envs.agentgym.splits import describe_ids, task_ids_of
from omrl_plugins.envs.agentgym.transport import HttpTransport, ServerFailure, ServerRefused, snippet

#: (base URL, env name) -> what an omrl server said of itself: the env instances a run opens later (one
#: discarded after a failure is replaced) read it here, so a server that went down since is no reason to
#: fall back to AgentGym's table and play an episode under another prompt and turn cap
_DESCRIPTIONS: dict[tuple[str, str], dict[str, Any]] = {}


class ServerTasks:
    """The splits of one client's server, and an omrl server's self-description, each read once at first use."""

    def __init__(
        self,
        server: HttpTransport,
        held: HeldEnv,
        env_name: str,
        splits: dict[str, range] | None,
        table: dict[str, range] | None = None,
        known: bool = False,
    ):
        self._server, self._held, self.env_name = server, held, env_name
        self._splits: dict[str, Sequence[int]] | None = splits  # the option's, or those the server listed
        self._table = table  # a known AgentGym server's splits: for a server that does not list its own
        self._known = known  # a known AgentGym name, whose server may lack GET /tasks
        self._description: dict[str, Any] | None = None
        self._asked = False  # GET /tasks answered (a known server's refusal or silence included)
        self._no_listing = ""  # why the server lists no tasks

    def described(self) -> dict[str, Any]:
        """An omrl server's self-description (GET /tasks): splits, action help, turn cap; {} from a known
        AgentGym server that has none."""
        if not self._asked:
            key = (self._server.base_url, self.env_name)
            self._description = _DESCRIPTIONS.get(key) or self._ask()
            if self._description:
                _DESCRIPTIONS[key] = self._description
            self._asked = True
        return self._description or {}

    def omrl_server_seen(self) -> None:
        """A /create answer named an omrl instance: a server that was not reached before is asked again."""
        if self._description is None:
            self._asked = False

    def _ask(self) -> dict[str, Any] | None:
        """GET /tasks: the server's self-description, or None from a known name's server without one."""
        try:
            answer = self._server.call("GET", self._held.route("/tasks"), json_answer=not self._known)
        except ServerRefused as exc:
            if exc.status not in (404, 405):  # a token, a busy server: not a missing route
                raise
            self._no_listing = str(exc)
            if self._known:
                return None  # an AgentGym server: the table's splits
            raise self._no_splits() from exc
        except ServerFailure:
            if self._table is None:
                raise
            return None  # not reached (e.g. `omrl env list`): the table, until a create names an omrl instance
        if not isinstance(answer, dict) or not isinstance(answer.get("splits"), dict):
            if self._known:
                return None  # a foreign server's own route of that name
            raise ServerFailure(
                self._server.message("GET /tasks", f"expected {{'splits': ...}}, got {snippet(json.dumps(answer))}")
            )
        wrong = _wrong_description(answer)
        if wrong:
            raise ServerFailure(self._server.message("GET /tasks", wrong))
        return answer

    def _no_splits(self) -> ConfigError:
        return ConfigError(
            f"the server at {self._server.base_url} does not list its tasks ({self._no_listing}) and env_name "
            f"{self.env_name!r} has no default splits; set plugins.agentgym.splits, e.g. {{test: [0, 100]}}"
        )

    def split_ids(self) -> dict[str, Sequence[int]]:
        """Each split's task ids."""
        if self._splits is not None:
            return self._splits
        names = self.described().get("splits")
        if names is None:
            if self._table is None:
                raise self._no_splits()
            return self._table  # not kept: a server not reached yet may still list its own
        splits = {}
        for name in names:
            answer = self._server.call("GET", self._held.route("/tasks"), params={"split": name})
            ids = task_ids_of(answer)
            if ids is None:
                problem = "expected {'range': [start, stop, step]} or {'task_ids': [...]}, got "
                raise ServerFailure(self._server.message(f"GET /tasks?split={name}", problem + snippet(str(answer))))
            splits[name] = ids
        self._splits = splits
        return self._splits

    def task_ids(self, split: str) -> Sequence[int]:
        """The task ids of ``split``, or UnknownTaskError naming the valid splits."""
        splits = self.split_ids()
        if split not in splits:
            raise UnknownTaskError(f"agentgym env {self.env_name!r} has no split {split!r}; valid: {', '.join(splits)}")
        return splits[split]

    def check_task(self, task_id: int) -> None:
        """Raise UnknownTaskError, naming every split's ids, unless some split holds ``task_id``. Before
        the server was asked, a known server's table holding the id will do (the server refuses a task
        it lacks): a reset sends AgentGym's servers no GET /tasks."""
        if not self._asked and self._splits is None and any(task_id in ids for ids in (self._table or {}).values()):
            return
        splits = self.split_ids()
        if not any(task_id in ids for ids in splits.values()):
            ranges = ", ".join(f"{n} {describe_ids(ids)}" for n, ids in splits.items())
            raise UnknownTaskError(f"agentgym env {self.env_name!r}: unknown task id {task_id!r}; valid: {ranges}")


def _wrong_description(answer: dict[str, Any]) -> str | None:
    """What is wrong with the optional parts of a server's self-description, or None."""
    turns = answer.get("max_turns")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        return f"max_turns must be a whole number of turns, 1 or more; got {short_repr(turns)}"
    for key in ("action_help", "action_example"):
        if answer.get(key) is not None and not isinstance(answer[key], str):
            return f"{key} must be text; got {short_repr(answer[key])}"
    demonstration = answer.get("demonstration")
    if demonstration is None:
        return None
    fine = isinstance(demonstration, list) and all(
        isinstance(turn, list) and len(turn) == 3 and all(isinstance(part, str) for part in turn)
        for turn in demonstration
    )
    if not fine:
        return f"demonstration must be a list of [observation, thought, action] texts; got {short_repr(demonstration)}"
    return None
