"""Episodes that failed in the world, not the model (``end_reason`` ``env_error``: a server down, a
simulator crash, an agent program that raised): which episodes measured the model, why the others failed,
what they failed in, and whether more failed than ``max_env_error_rate`` allows."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from omrl.data.trajectory import Episode
from omrl.rollout.spec import overlong


def measured(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes that measured the model: all but those that failed in the env (``env_error``: a
    server down, a simulator crash) and those whose opening prompt did not fit ``generation.max_context``
    (:func:`~omrl.rollout.spec.overlong`), which say nothing of the model and count as neither win nor loss."""
    return [ep for ep in episodes if ep.end_reason != "env_error" and not overlong(ep)]


def env_error_reasons(episodes: Sequence[Episode], limit: int = 3) -> list[str]:
    """The first ``limit`` distinct reasons episodes failed in the env, each with how many share it and
    the first task it hit (``"3 episodes, the first of task 2: connection refused"``)."""
    counts: Counter[str] = Counter()
    first_task: dict[str, int] = {}
    for ep in episodes:
        if ep.end_reason == "env_error":
            reason = ep.error or "no reason given"
            counts[reason] += 1
            first_task.setdefault(reason, ep.task_id)
    lines = [
        f"{n} episodes, the first of task {first_task[reason]}: {reason}"
        if n > 1
        else f"1 episode, of task {first_task[reason]}: {reason}"
        for reason, n in counts.items()
    ]
    return lines[:limit] + ([f"... and {len(lines) - limit} other reasons"] if len(lines) > limit else [])


def failed_in(episodes: Sequence[Episode], env: str) -> str:
    """What the ``env_error`` episodes among ``episodes`` failed in: their agent, or the action template, where
    each one's reason names it (:data:`~omrl.gateway.agents.AGENT_REASON`,
    :data:`~omrl.rollout.live.TEMPLATE_REASON`), else the env ``env``."""
    from omrl.gateway.agents import AGENT_REASON, IN_THE_AGENT
    from omrl.rollout.live import TEMPLATE_REASON

    reasons = [ep.error or "" for ep in episodes if ep.end_reason == "env_error"]
    if reasons and all(AGENT_REASON.match(reason) for reason in reasons):
        return IN_THE_AGENT
    found = [TEMPLATE_REASON.search(reason) for reason in reasons]
    if found and all(found) and len({f[1] for f in found}) == 1:
        return f"the action template {found[0][1]} (a bug in its code, not the env)"
    return the_env(env, [ep.env for ep in episodes if ep.end_reason == "env_error"])


def the_env(env: str, failed: Sequence[str]) -> str:
    """The env ``env`` for a message; of a mixture (``env`` names several), the ones in ``failed`` (the
    envs episodes failed in), not the whole mixture."""
    named = list(dict.fromkeys(failed))
    if "," not in env or not named:
        return f"the env {env!r}"
    return f"the env {named[0]!r}" if len(named) == 1 else f"the envs {', '.join(map(repr, named))}"


def check_max_env_error_rate(max_rate: float) -> None:
    """Before any episode plays: the share must be one."""
    from omrl.errors import ConfigError

    if not 0.0 <= max_rate <= 1.0:
        raise ConfigError(
            f"max_env_error_rate must be a share between 0 and 1, got {max_rate!r} (e.g. 0.1: at most "
            "one episode in ten may fail in the env)"
        )


def check_env_errors(episodes: Sequence[Episode], max_rate: float, env: str, where: str) -> None:
    """Raise EnvFailure when more than ``max_rate`` of ``episodes`` failed in the env ``env`` or its agent
    (``where``: the command's words): the rest measures the model on the tasks the env did not break on."""
    from omrl.errors import EnvFailure

    check_max_env_error_rate(max_rate)
    failed = sum(ep.end_reason == "env_error" for ep in episodes)
    if not episodes or failed / len(episodes) <= max_rate:
        return
    reasons = "; ".join(env_error_reasons(episodes))
    if failed == len(episodes):
        raise EnvFailure(
            f"every one of the {failed} episodes failed in {failed_in(episodes, env)} ({where}), so the model was not "
            f"measured; the first reasons: {reasons}"
        )
    raise EnvFailure(
        f"{failed} of {len(episodes)} episodes ({100 * failed / len(episodes):.0f}%) failed in "
        f"{failed_in(episodes, env)} ({where}), more than max_env_error_rate={max_rate:g} allows; success and scores cover only the "
        f"other {len(episodes) - failed}; the first reasons: {reasons}"
    )
