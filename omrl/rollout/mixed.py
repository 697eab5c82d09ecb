"""A rollout session over a mixture of envs (:mod:`omrl.mixture`).

One :class:`RolloutSession` per env (its pool, template, turn cap, reward weights and plugin
options), all sharing one tokenizer and one backend. Chains of every env play in one batched
rollout (:func:`omrl.rollout.loop.collect_lanes`); a search strategy plays each env's tasks in
turn. Tasks are :class:`omrl.mixture.EnvTask` values, so each names its env and split.
"""

from __future__ import annotations

from typing import Any, Sequence

from omrl.backends import Backend
from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.mixture import EnvTask, MixMember, member_config, mix_members
from omrl.rollout.loop import Lane, RolloutLimits, collect_lanes
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.session import RolloutSession, backend_of, compose_rewards


def is_mixed(session: Any) -> bool:
    """Whether ``session`` plays a mixture (a :class:`MixedSession`, or anything with its ``sessions``
    per env), whose tasks are :class:`~omrl.mixture.EnvTask` values and whose metrics go per env."""
    return hasattr(session, "sessions")


class MixedSession:
    """Plays episodes of several envs with one backend; ``sessions`` maps each env to its own session."""

    def __init__(
        self,
        members: list[MixMember],
        sessions: dict[str, RolloutSession],
        tokenizer: Any,
        backend: Any,
        split: str = "",
    ):
        self.members = members
        self.split = split  # the run's env.split: asked for it, each env gives its own (env.mix's split)
        self.sessions = sessions
        self.tokenizer = tokenizer
        self.backend = backend
        self.reward_summary: dict[str, float] = {}  # the last play's, over every env (episode-weighted)
        self.reward_summaries: dict[str, dict[str, float]] = {}  # the last play's, per env

    @classmethod
    def from_config(
        cls, cfg: Any, *, model: Any = None, tokenizer: Any = None, expert: bool = False, backend: Backend | None = None
    ) -> "MixedSession":
        from omrl.models import load_tokenizer

        members = mix_members(cfg)
        if tokenizer is None:
            tokenizer = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
        if backend is None and not expert:
            backend = backend_of(cfg, tokenizer, model)
        sessions: dict[str, RolloutSession] = {}
        try:
            for member in members:
                sessions[member.name] = RolloutSession.from_config(
                    member_config(cfg, member), tokenizer=tokenizer, expert=True, backend=backend
                )
        except BaseException:
            for session in sessions.values():
                session.pool.close()
            if backend is not None:
                backend.close()
            raise
        return cls(members, sessions, tokenizer, backend, cfg.env.split)

    @property
    def env_names(self) -> list[str]:
        return [member.name for member in self.members]

    @property
    def limits(self) -> RolloutLimits:
        """The first env's limits; setting them sets every env's (each keeps its own turn cap)."""
        return next(iter(self.sessions.values())).limits

    @limits.setter
    def limits(self, limits: RolloutLimits) -> None:
        for session in self.sessions.values():
            turns = session.limits.max_turns
            session.limits = RolloutLimits(**{**vars(limits), "max_turns": turns})

    def session_of(self, env: str) -> RolloutSession:
        if env not in self.sessions:
            raise OmrlError(f"env {env!r} is not in this mixture; its envs: {', '.join(self.sessions)}")
        return self.sessions[env]

    def task_ids(self, split: str, count: int) -> list[EnvTask]:
        """The first ``count`` task ids of ``split`` of every env (fewer where an env has fewer); asked for
        the run's own split, each env's own split (an ``env.mix`` entry may set one)."""
        out = []
        for member in self.members:
            own = member.env.split if split == self.split else split
            out += [EnvTask(member.name, own, task) for task in self.sessions[member.name].task_ids(own, count)]
        return out

    def play(
        self,
        tasks: Sequence[EnvTask],
        *,
        split: str = "",
        group_size: int = 1,
        seed: int = 0,
        expert: bool = False,
        progress: RolloutProgress | None = None,
        max_parallel: int = 0,
        rewards: bool = True,
    ) -> list[Episode]:
        """``group_size`` samples of each task, every env's chains in one batched rollout, each env's
        rewards composed with its own weights (``rewards=False``: not composed). ``split`` is not read:
        each task names its own."""
        lanes: dict[tuple[str, str], int] = {}
        lane_list: list[Lane] = []
        pairs = []
        for task in tasks:
            env, task_split, task_id = _env_task(task)
            session = self.session_of(env)
            if (env, task_split) not in lanes:
                lanes[(env, task_split)] = len(lane_list)
                limits = session.limits
                lane_list.append(
                    Lane(session.pool, session.template, task_split, limits.max_turns, session.demonstration)
                )
            pairs.append((lanes[(env, task_split)], task_id))
        episodes = collect_lanes(
            lane_list,
            self.tokenizer,
            pairs,
            backend=self.backend,
            limits=self.limits,
            group_size=group_size,
            seed=seed,
            expert=expert,
            max_parallel=max_parallel,
            progress=progress,
        )
        if rewards:
            self.compose(episodes)
        return episodes

    def compose(self, episodes: list[Episode]) -> dict[str, float]:
        """Each env's rewards with its own weights and options; the summaries, per env and over all."""
        self.reward_summaries = {}
        for env, session in self.sessions.items():
            mine = [ep for ep in episodes if ep.env == env]
            if mine:
                summary = compose_rewards(mine, session.reward_weights, session.plugin_options)
                self.reward_summaries[env] = summary
        self.reward_summary = merged_summary(
            {env: (s, sum(ep.env == env for ep in episodes)) for env, s in self.reward_summaries.items()}
        )
        return self.reward_summary

    def split_by_env(self, tasks: Sequence[EnvTask]) -> dict[str, list[int]]:
        """The positions in ``tasks`` of each env's tasks (for strategies that play one env at a time)."""
        out: dict[str, list[int]] = {}
        for index, task in enumerate(tasks):
            out.setdefault(_env_task(task)[0], []).append(index)
        return out

    def close(self) -> None:
        for session in self.sessions.values():
            session.pool.close()
        if self.backend is not None:
            self.backend.close()

    def __enter__(self) -> "MixedSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merged_summary(summaries: dict[str, tuple[dict[str, float], int]]) -> dict[str, float]:
    """Per-episode means over every env from each env's (means, episode count): a term only some
    envs reward is averaged over those envs' episodes."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for summary, n in summaries.values():
        for key, value in summary.items():
            totals[key] = totals.get(key, 0.0) + value * n
            counts[key] = counts.get(key, 0) + n
    return {key: totals[key] / max(1, counts[key]) for key in totals}


def _env_task(task: Any) -> tuple[str, str, int]:
    if not isinstance(task, tuple) or len(task) != 3:
        raise OmrlError(f"a mixture's task names its env and split (an EnvTask), got {task!r}")
    return str(task[0]), str(task[1]), int(task[2])
