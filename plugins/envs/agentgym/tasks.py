"""The tasks of an ``agentgym`` server: its splits' task ids, from the options or listed by an omrl
server's ``GET /tasks``, and the self-description (action help, turn cap, example) that answer carries."""

from __future__ import annotations

import json
from typing import Any, Sequence

from omrl.envs import UnknownTaskError
from omrl.errors import ConfigError, short_repr
from omrl_plugins.envs.agentgym.held_env import HeldEnv
from omrl_plugins.envs.agentgym.splits import describe_ids, task_ids_of
from omrl_plugins.envs.agentgym.transport import HttpTransport, ServerFailure, ServerRefused, snippet


class ServerTasks:
    """The splits of one client's server, and an omrl server's self-description, each read once at first use."""

    def __init__(self, server: HttpTransport, held: HeldEnv, env_name: str, splits: dict[str, range] | None):
        self._server, self._held, self.env_name = server, held, env_name
        self._splits: dict[str, Sequence[int]] | None = splits  # None: listed by the server
        self._description: dict[str, Any] | None = None

    def described(self) -> dict[str, Any]:
        """An omrl server's self-description (GET /tasks): splits, action help, turn cap."""
        if self._description is None:
            try:
                answer = self._server.call("GET", self._held.route("/tasks"))
            except ServerRefused as exc:
                if exc.status not in (404, 405):  # a token, a busy server: not a missing route
                    raise
                raise ConfigError(
                    f"the server at {self._server.base_url} does not list its tasks ({exc}) and env_name "
                    f"{self.env_name!r} has no default splits; set plugins.agentgym.splits, e.g. "
                    "{test: [0, 100]}"
                ) from exc
            if not isinstance(answer, dict) or not isinstance(answer.get("splits"), dict):
                raise ServerFailure(
                    self._server.message("GET /tasks", f"expected {{'splits': ...}}, got {snippet(json.dumps(answer))}")
                )
            wrong = _wrong_description(answer)
            if wrong:
                raise ServerFailure(self._server.message("GET /tasks", wrong))
            self._description = answer
        return self._description

    def split_ids(self) -> dict[str, Sequence[int]]:
        """Each split's task ids."""
        if self._splits is None:
            splits = {}
            for name in self.described()["splits"]:
                answer = self._server.call("GET", self._held.route("/tasks"), params={"split": name})
                ids = task_ids_of(answer)
                if ids is None:
                    problem = "expected {'range': [start, stop, step]} or {'task_ids': [...]}, got "
                    raise ServerFailure(
                        self._server.message(f"GET /tasks?split={name}", problem + snippet(str(answer)))
                    )
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
        """Raise UnknownTaskError, naming every split's ids, unless some split holds ``task_id``."""
        splits = self.split_ids()
        if not any(task_id in ids for ids in splits.values()):
            ranges = ", ".join(f"{n} {describe_ids(ids)}" for n, ids in splits.items())
            raise UnknownTaskError(f"agentgym env {self.env_name!r}: unknown task id {task_id!r}; valid: {ranges}")


def _wrong_description(answer: dict[str, Any]) -> str | None:
    """What is wrong with the optional parts of a server's self-description, or None."""
    turns = answer.get("max_turns")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        return f"max_turns must be a whole number of turns, 1 or more; got {short_repr(turns)}"
    help_text = answer.get("action_help")
    if help_text is not None and not isinstance(help_text, str):
        return f"action_help must be text; got {short_repr(help_text)}"
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
