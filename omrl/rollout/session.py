"""A rollout session: env pool, template, tokenizer and backend built once from a config.

The commands (`omrl rollout`, `omrl eval`) and the trainer build one session
and call :meth:`RolloutSession.play` as often as they need: env instances and
the generation engine are created once, never per sample or per step.
"""

from __future__ import annotations

from typing import Any, Sequence

from omrl import registry, rewards
from omrl.backends import Backend, make_backend
from omrl.chat.conformance import check_run_template, check_template_options
from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.rollout.loop import RolloutLimits, collect
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.templates import Template


class RolloutSession:
    """Plays episodes of one env with one template and one backend (or the env's expert)."""

    def __init__(
        self,
        pool: EnvPool,
        template: Template,
        tokenizer: Any,
        backend: Backend | None,
        limits: RolloutLimits,
        reward_weights: dict[str, float] | None = None,
        plugin_options: dict[str, dict[str, Any]] | None = None,
        demonstration: bool = True,
        agent: Any = None,
        agent_options: Any = None,
        model_label: str = "omrl-policy",
    ):
        self.pool = pool
        self.template = template
        self.tokenizer = tokenizer
        self.backend = backend
        self.limits = limits
        self.reward_weights = dict(reward_weights or {})
        self.plugin_options = dict(plugin_options or {})
        self.demonstration = demonstration  # open every chat with the env's worked example (if it has one)
        self.reward_summary: dict[str, float] = {}  # what compose_rewards returned for the last play
        # an agent program plays instead of the template (omrl.gateway.play.AgentSpec), through a gateway
        # built at its first play from the run's agent section (host, port, sampling, batch window)
        self.agent = agent
        self.agent_options = agent_options
        self.model_label = model_label  # what the gateway's /v1/models names
        self._gateway: Any = None

    @classmethod
    def from_config(
        cls, cfg: Any, *, model: Any = None, tokenizer: Any = None, expert: bool = False, backend: Backend | None = None
    ) -> "RolloutSession":
        """Build from a run config with ``env``, ``generation``, ``chat``, ``model``, ``reward`` and ``plugins`` sections.

        ``model``/``tokenizer`` reuse objects the caller already holds (the
        trainer's policy); ``expert=True`` builds no backend at all. A config naming a mixture of envs
        (:mod:`omrl.mixture`) gets a :class:`~omrl.rollout.mixed.MixedSession`, which plays like this.
        """
        from omrl.mixture import is_mixture
        from omrl.models import check_context_window, load_tokenizer

        if is_mixture(cfg.env):
            from omrl.rollout.mixed import MixedSession

            return MixedSession.from_config(cfg, model=model, tokenizer=tokenizer, expert=expert, backend=backend)  # type: ignore[return-value]

        env_class = registry.envs.get(cfg.env.name)
        template_class = registry.templates.get(cfg.env.template)
        plugins = dict(getattr(cfg, "plugins", {}) or {})
        pool = EnvPool(env_class, plugins.get(cfg.env.name, {}), name=cfg.env.name, num_workers=cfg.env.num_workers)
        # the env is built now, and kept for the first episode: an env that cannot be built (bad options,
        # an MCP server that cannot start) is refused before a model loads
        pool.probe()
        try:
            template = template_class(**plugins.get(cfg.env.template, {}))
            if tokenizer is None:
                tokenizer = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
            limits = RolloutLimits.from_config(
                cfg.generation, cfg.env.max_turns, cfg.chat.history, cfg.chat.template_kwargs
            )
            if not expert:  # a template whose episodes would be laid out wrongly is refused before a model loads
                check_context_window(cfg.model.name, limits.max_context, "generation.max_context")
                check_template_options(tokenizer, limits.template_kwargs)
                check_run_template(tokenizer, limits.history, limits.template_kwargs)
            if backend is None and not expert:
                backend = backend_of(cfg, tokenizer, model)
        except BaseException:
            pool.close()  # the built env's processes and servers stop with the failed session
            raise
        agent = agent_of(cfg)
        return cls(
            pool,
            template,
            tokenizer,
            backend,
            limits,
            reward_weights=cfg.reward.weights,
            plugin_options=plugins,
            demonstration=cfg.env.demonstration,
            agent=agent,
            agent_options=cfg.agent if agent is not None else None,
            model_label=cfg.model.name,
        )

    def task_ids(self, split: str, count: int) -> list[int]:
        """The first ``count`` task ids of ``split`` (all of them when the split is smaller)."""
        if count < 1:
            raise OmrlError(f"num_tasks must be >= 1, got {count}")
        return list(self.pool.probe().split_of(split))[:count]

    def play(
        self,
        tasks: Sequence[int],
        *,
        split: str,
        group_size: int = 1,
        seed: int = 0,
        expert: bool = False,
        progress: RolloutProgress | None = None,
        max_parallel: int = 0,
    ) -> list[Episode]:
        """Play ``group_size`` samples of each task, then compose their rewards."""
        if self.agent is not None:
            return self._play_agents(tasks, split, group_size, seed, expert, progress, max_parallel)
        episodes = collect(
            self.pool,
            self.template,
            self.tokenizer,
            tasks,
            backend=self.backend,
            limits=self.limits,
            split=split,
            group_size=group_size,
            seed=seed,
            expert=expert,
            max_parallel=max_parallel,
            demonstration=self.demonstration,
            progress=progress,
        )
        self.reward_summary = compose_rewards(episodes, self.reward_weights, self.plugin_options)
        return episodes

    def _play_agents(
        self,
        tasks: Sequence[int],
        split: str,
        group_size: int,
        seed: int,
        expert: bool,
        progress: RolloutProgress | None,
        max_parallel: int,
    ) -> list[Episode]:
        """The agent program plays every episode through the gateway (:mod:`omrl.gateway.play`)."""
        from omrl.gateway.play import play_agents, reward_components
        from omrl.gateway.server import Gateway

        if expert or self.backend is None:
            raise OmrlError("an agent program plays with the policy; the env's scripted expert cannot play with it")
        if self._gateway is None:
            options = self.agent_options
            self._gateway = Gateway(
                self.tokenizer,
                self.backend,
                self.limits,
                model_name=self.model_name,
                host=options.host,
                port=options.port,
                window_s=options.batch_window_ms / 1000,
                honor_sampling=options.sampling == "request",
                call_timeout_s=self.agent.timeout_s,  # a generate call as long as a whole episode is stuck
                max_calls=options.max_calls,
                batch_on_caller=True,  # play_agents generates on this thread (torch is slower on others)
            )
        self._gateway.limits, self._gateway.batcher.seed = self.limits, seed  # evaluations swap the limits
        episodes = play_agents(
            self.agent,
            self._gateway,
            self.pool,
            tasks,
            split=split,
            group_size=group_size,
            max_parallel=max_parallel or self.agent_options.max_parallel,
            progress=progress,
        )
        if self.agent.reward is not None:
            self.reward_summary = reward_components(episodes)
        else:
            self.reward_summary = compose_rewards(episodes, self.reward_weights, self.plugin_options)
        return episodes

    @property
    def model_name(self) -> str:
        return self.model_label or "omrl-policy"

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None
        self.pool.close()
        if self.backend is not None:
            self.backend.close()

    def __enter__(self) -> "RolloutSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    )


def compose_rewards(
    episodes: list[Episode], weights: dict[str, float], options: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """Fill ``episode.rewards`` through :func:`omrl.rewards.compose_rewards`.

    ``options`` is the config's per-plugin block; each weighted reward gets its own entry.
    """
    if not episodes:
        return {}
    reward_options = {name: options[name] for name in weights if name in options}
    return dict(rewards.compose_rewards(episodes, weights, reward_options))
