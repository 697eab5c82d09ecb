"""A rollout session: the envs, template, tokenizer and backend of a run, built once from its config.

The commands (`omrl rollout`, `omrl eval`) and the trainer build one session and call
:meth:`RolloutSession.play` as often as they need: env instances and the generation engine are
created once, never per sample or per step. A session plays one env or a mixture of several
(:mod:`omrl.mixture`) alike: each env is a lane of one batched rollout (:class:`SessionEnv`: its pool,
template, turn cap, reward weights and plugin options), and one env is a mixture of one. A play takes
one value in (:class:`~omrl.rollout.spec.PlaySpec`) and gives one back (:class:`~omrl.rollout.spec.Played`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from omrl import registry, rewards
from omrl.backends import Backend, make_backend
from omrl.chat.conformance import check_run_template
from omrl.chat.history import warn_foreign_call_format
from omrl.chat.template_check import check_template_options
from omrl.data.trajectory import Episode
from omrl.envs import check_arguments
from omrl.errors import ConfigError, OmrlError
from omrl.mixture import EnvTask, MixMember, is_mixture, mix_members
from omrl.rollout.loop import Lane, collect_lanes
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.seating import PastCheckpoints, SeatSource, close_seating, expert_seating, seating_of
from omrl.rollout.seats import play_seats
from omrl.rollout.spec import (
    OverlongPromptWarning,
    Played,
    PlaySpec,
    RolloutLimits,
    UnscoredEpisodes,
    measured,
    merged_rewards,
    overlong_note,
)
from omrl.templates import Template, reward_options


@dataclass(eq=False)
class SessionEnv:
    """One env of a session: its instances, action template, own split (``env.split``, or its
    ``env.mix`` entry's), turn cap (0: the env's own), whether its worked example opens each chat, and
    the reward weights and ``plugins.*`` options its episodes are scored with."""

    name: str
    pool: EnvPool
    template: Template
    split: str
    max_turns: int = 0
    demonstration: bool = True
    reward_weights: dict[str, float] | None = None
    plugin_options: dict[str, dict[str, Any]] | None = None
    seating: dict[str, SeatSource] | None = None  # an env of several seats: who plays each (omrl.rollout.seating)

    def task_ids(self, split: str, count: int) -> list[int]:
        """The first ``count`` task ids of ``split`` (all of them when the split is smaller)."""
        if count < 1:
            raise OmrlError(f"num_tasks must be >= 1, got {count}")
        return list(self.pool.probe().tasks_of(self.name, split))[:count]

    def lane(self, split: str) -> Lane:
        return Lane(self.pool, self.template, split or self.split, self.max_turns, self.demonstration)

    def compose(self, episodes: list[Episode]) -> dict[str, float]:
        """Fill each episode's ``rewards`` (:func:`compose_rewards`) with this env's weights, options and template."""
        return compose_rewards(episodes, dict(self.reward_weights or {}), self.plugin_options or {}, self.template)


class RolloutSession:
    """Plays episodes of its envs with one template per env, one tokenizer and one backend (or the
    envs' experts). ``mixture``: the run names a mixture, whose tasks are :class:`~omrl.mixture.EnvTask`
    values and whose metrics go per env; a one-env session's tasks are bare task ids."""

    def __init__(
        self,
        envs: list[SessionEnv],
        tokenizer: Any,
        backend: Backend | None,
        limits: RolloutLimits,
        *,
        mixture: bool = False,
        split: str = "",
        agent: Any = None,
        agent_options: Any = None,
        model_label: str = "omrl-policy",
        max_parallel: int = 0,
    ):
        if not envs:
            raise OmrlError("a rollout session plays at least one env")
        self.envs, self.tokenizer, self.backend, self.mixture = envs, tokenizer, backend, mixture
        self.limits = limits  # every play's, unless its PlaySpec brings its own
        self.split = split  # the run's env.split: asked for it, each env gives its own
        # an agent program plays instead of the template (omrl.gateway.play.AgentSpec), through a gateway
        # built at its first play from the run's agent section (host, port, sampling, batch window)
        self.agent = agent
        self.agent_options = agent_options
        self.model_label = model_label  # what the gateway's /v1/models names
        self.max_parallel = max_parallel  # env.max_parallel: episodes (games) at once, unless a play sets its own
        self._gateway: Any = None

    @classmethod
    def from_config(
        cls, cfg: Any, *, model: Any = None, tokenizer: Any = None, expert: bool = False, backend: Backend | None = None
    ) -> "RolloutSession":
        """Build from a run config with ``env``, ``generation``, ``chat``, ``model``, ``reward`` and ``plugins``
        sections. ``model``/``tokenizer`` reuse objects the caller already holds (the trainer's policy);
        ``expert=True`` builds no backend at all. Every env is built first: one that cannot be built
        (bad options, an MCP server that cannot start) is refused before a model loads."""
        from omrl.models import check_context_window, load_tokenizer

        mixture, agent = is_mixture(cfg.env), agent_of(cfg)
        if mixture and agent is not None:
            raise ConfigError("an agent program plays one env; name one env in env.name (not env.mix or a list)")
        envs: list[SessionEnv] = []
        try:
            for member in mix_members(cfg):
                envs.append(session_env(member))
            if tokenizer is None:
                tokenizer = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
            limits = RolloutLimits.from_config(
                cfg.generation, cfg.env.max_turns, cfg.chat.history, cfg.chat.template_kwargs
            )
            if not expert:  # a template whose episodes would be laid out wrongly is refused before a model loads
                check_context_window(cfg.model.name, limits.max_context, "generation.max_context")
                check_template_options(tokenizer, limits.template_kwargs)
                check_run_template(tokenizer, limits.history, limits.template_kwargs)
            for env in envs:  # what a reward or a template would do wrong with this model is said before it loads
                rewards.check_for_play(env.reward_weights or {}, env.plugin_options or {}, tokenizer)
                warn_foreign_call_format(env.template, tokenizer, limits.template_kwargs)
                env.seating = seating_of(cfg, env.pool.env_class, env.name, tokenizer, expert, mixture, agent)
            if backend is None and not expert:
                backend = backend_of(cfg, tokenizer, model)
        except BaseException:
            for env in envs:  # the built envs' processes and servers stop with the failed session
                env.pool.close()
                close_seating(env.seating)
            raise
        return cls(
            envs,
            tokenizer,
            backend,
            limits,
            mixture=mixture,
            split=cfg.env.split,
            agent=agent,
            agent_options=cfg.agent if agent is not None else None,
            model_label=cfg.model.name,
            max_parallel=getattr(cfg.env, "max_parallel", 0),
        )

    @property
    def env_names(self) -> list[str]:
        return [env.name for env in self.envs]

    def env_of(self, name: str | None = None) -> SessionEnv:
        """The env ``name`` of this session; None: its one env (a mixture must name one)."""
        if name is None:
            if len(self.envs) > 1:
                raise OmrlError(f"this session plays {len(self.envs)} envs; name one of {', '.join(self.env_names)}")
            return self.envs[0]
        for env in self.envs:
            if env.name == name:
                return env
        raise OmrlError(f"env {name!r} is not in this session; its envs: {', '.join(self.env_names)}")

    def task_ids(self, split: str, count: int) -> list[Any]:
        """The first ``count`` task ids of ``split``: bare ids of a one-env session; in a mixture, each
        env's (fewer where it has fewer) as :class:`EnvTask` values, and asked for the run's own split,
        each env's own split (an ``env.mix`` entry may set one)."""
        if not self.mixture:
            return self.envs[0].task_ids(split, count)
        out = []
        for env in self.envs:
            own = env.split if split == self.split else split
            out += [EnvTask(env.name, own, task) for task in env.task_ids(own, count)]
        return out

    def env_task(self, task: Any, split: str = "") -> EnvTask:
        """``task`` as an :class:`EnvTask`: a mixture's names its env and split; a bare id is a task of
        a one-env session, in ``split`` ("" for the env's own)."""
        if isinstance(task, tuple) and len(task) == 3:
            return EnvTask(str(task[0]), str(task[1]), int(task[2]))
        if self.mixture or isinstance(task, tuple):
            raise OmrlError(f"a mixture's task names its env and split (an EnvTask), got {task!r}")
        return EnvTask(self.envs[0].name, split or self.envs[0].split, int(task))

    def play(
        self, tasks: Sequence[Any], spec: PlaySpec = PlaySpec(), progress: RolloutProgress | None = None
    ) -> Played:
        """``spec.group_size`` samples of each task, every env's chains in one batched rollout, each
        env's rewards composed with its own weights (unless ``spec.rewards`` is off). Episode.group is
        the task's position in ``tasks``. Episodes whose opening prompt did not fit the context are
        said in an :class:`~omrl.rollout.spec.OverlongPromptWarning` naming the setting to raise."""
        played = self._play(tasks, spec, progress)
        note = overlong_note(played.episodes, (spec.limits or self.limits).max_context)
        if note:
            warnings.warn(note, OverlongPromptWarning, stacklevel=2)
        return played

    def _play(self, tasks: Sequence[Any], spec: PlaySpec, progress: RolloutProgress | None) -> Played:
        if self.agent is not None:
            return self._play_agents(tasks, spec, progress)
        if self.envs[0].seating:  # a seated env plays alone (seating_of refuses it in a mixture)
            return self._play_seats(self.envs[0], tasks, spec, progress)
        lanes: dict[tuple[str, str], int] = {}
        lane_list: list[Lane] = []
        pairs = []
        for task in tasks:
            env, split, task_id = self.env_task(task, spec.split)
            if (env, split) not in lanes:
                lanes[(env, split)] = len(lane_list)
                lane_list.append(self.env_of(env).lane(split))
            pairs.append((lanes[(env, split)], task_id))
        episodes = collect_lanes(
            lane_list, self.tokenizer, pairs, expert=spec.expert, **self._player_options(spec, progress)
        )
        return self.compose(episodes) if spec.rewards else Played(episodes)

    def _player_options(self, spec: PlaySpec, progress: RolloutProgress | None) -> dict[str, Any]:
        """What the chain loop and the seated games both take from a play: the backend, the limits, the
        samples per task, the seed, the cap on episodes (games) at once and the progress hooks."""
        return {
            "backend": self.backend,
            "limits": spec.limits or self.limits,
            "group_size": spec.group_size,
            "seed": spec.seed,
            "max_parallel": spec.max_parallel or self.max_parallel,
            "progress": progress,
        }

    def compose(self, episodes: list[Episode]) -> Played:
        """``episodes`` with each env's rewards composed with its own weights and options, and the means
        of each reward term per env and over all."""
        per_env: dict[str, dict[str, float]] = {}
        counts: dict[str, int] = {}
        for env in self.envs:
            mine = [ep for ep in episodes if ep.env == env.name]
            if mine:
                try:
                    per_env[env.name] = env.compose(mine)
                except OmrlError as exc:  # a reward's error (its options, its judge's key): the play is kept, unscored
                    for ep in episodes:
                        ep.rewards = {}
                    raise UnscoredEpisodes(str(exc), episodes, self.tokenizer) from exc
                counts[env.name] = measured(mine)  # after composing: a reward may fail an episode too
        total = merged_rewards({name: (summary, counts[name]) for name, summary in per_env.items()})
        return Played(episodes, total, per_env)

    def _play_seats(
        self, env: SessionEnv, tasks: Sequence[Any], spec: PlaySpec, progress: RolloutProgress | None
    ) -> Played:
        """Games of ``env``'s seats (:func:`omrl.rollout.seats.play_seats`): the policy's episodes, one
        per (game, seat it played), grouped per (task, seat); with ``spec.expert`` the env's scripted
        player plays the policy's seats as the expert (:func:`~omrl.rollout.seating.expert_seating`)."""
        seating = expert_seating(env.seating or {}) if spec.expert else env.seating or {}
        episodes = play_seats(
            env.pool,
            env.template,
            self.tokenizer,
            [self.env_task(task, spec.split).task for task in tasks],
            seating=seating,
            split=spec.split or env.split,
            demonstration=env.demonstration,
            **self._player_options(spec, progress),
        )
        return self.compose(episodes) if spec.rewards else Played(episodes)

    def past_checkpoints(self, folders: Sequence[str]) -> None:
        """The model folders, oldest first, that seats played by past checkpoints draw from."""
        for env in self.envs:
            for source in (env.seating or {}).values():
                if isinstance(source, PastCheckpoints):
                    source.folders = [str(folder) for folder in folders]

    def _play_agents(self, tasks: Sequence[Any], spec: PlaySpec, progress: RolloutProgress | None) -> Played:
        """The agent program plays every episode through the gateway (:mod:`omrl.gateway.play`)."""
        from omrl.gateway.play import play_agents, reward_components
        from omrl.gateway.server import Gateway

        if spec.expert or self.backend is None:
            raise OmrlError("an agent program plays with the policy; the env's scripted expert cannot play with it")
        if self._gateway is None:
            options = self.agent_options
            self._gateway = Gateway(
                self.tokenizer,
                self.backend,
                spec.limits or self.limits,
                model_name=self.model_name,
                host=options.host,
                port=options.port,
                window_s=options.batch_window_ms / 1000,
                honor_sampling=options.sampling == "request",
                call_timeout_s=self.agent.timeout_s,  # a generate call as long as a whole episode is stuck
                max_calls=options.max_calls,
                batch_on_caller=True,  # play_agents generates on this thread (torch is slower on others)
            )
        self._gateway.limits, self._gateway.batcher.seed = spec.limits or self.limits, spec.seed
        env = self.envs[0]
        episodes = play_agents(
            self.agent,
            self._gateway,
            env.pool,
            [self.env_task(task, spec.split).task for task in tasks],
            split=spec.split or env.split,
            group_size=spec.group_size,
            max_parallel=spec.max_parallel or self.agent_options.max_parallel,
            progress=progress,
        )
        if self.agent.reward is None:
            return self.compose(episodes)
        summary = reward_components(episodes)
        return Played(episodes, summary, {env.name: summary})

    @property
    def model_name(self) -> str:
        return self.model_label or "omrl-policy"

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None
        for env in self.envs:
            env.pool.close()
            close_seating(env.seating)
        if self.backend is not None:
            self.backend.close()

    def __enter__(self) -> "RolloutSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def session_env(member: MixMember) -> SessionEnv:
    """A mixture member's env, built and probed (:meth:`EnvPool.probe`), with its template."""
    env_class = registry.envs.get(member.env.name)
    template_class = registry.templates.get(member.env.template)
    plugins = dict(member.plugins or {})
    pool = EnvPool(
        env_class, plugins.get(member.env.name, {}), name=member.env.name, num_workers=member.env.num_workers
    )
    try:
        pool.probe()  # the env is built now, and kept for the first episode
        options = plugins.get(member.env.template, {})
        check_arguments(template_class, options, f"template {member.env.template!r}", "options")
        template = template_class(**options)
    except BaseException:
        pool.close()
        raise
    return SessionEnv(
        member.name,
        pool,
        template,
        member.env.split,
        member.env.max_turns,
        member.env.demonstration,
        dict(member.reward_weights),
        plugins,
    )


def agent_of(cfg: Any) -> Any:
    """The agent program a run config names (:class:`omrl.gateway.play.AgentSpec`), or None."""
    section = getattr(cfg, "agent", None)
    if section is None:
        return None
    from omrl.gateway.play import AgentSpec

    return AgentSpec.from_config(section)


def backend_of(cfg: Any, tokenizer: Any, model: Any = None) -> Backend:
    """The generation backend a run config names (``model``: a loaded model the hf backend may share)."""
    return make_backend(
        cfg.generation.backend,
        tokenizer,
        cfg.generation,
        model=model,
        model_name=cfg.model.name,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        bf16=cfg.bf16,
    )


def compose_rewards(
    episodes: list[Episode], weights: dict[str, float], options: dict[str, dict[str, Any]], template: Any = None
) -> dict[str, float]:
    """Fill ``episode.rewards`` (:func:`omrl.rewards.compose_rewards`; options: :func:`~omrl.templates.reward_options`)."""
    if not episodes:
        return {}
    rewards.check_weights(weights)  # an unknown reward is named before its options are read
    return dict(rewards.compose_rewards(episodes, weights, reward_options(template, weights, options)))
