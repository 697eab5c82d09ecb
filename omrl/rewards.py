"""Composing reward components and placing the composed reward on tokens.

Every reward plugin follows one calling convention::

    fn(episodes: list[Episode], **options) -> list[list[float]]

one list per episode with one float per turn (an episode-level reward sits on
the last turn; an episode with no turns gets ``[]``). :func:`episode_reward`
turns a per-episode scalar function into that convention.

:func:`compose_rewards` runs the weighted components over a batch and stores
each one's per-turn values in ``episode.rewards[name]`` and their weighted sum in
``episode.rewards["total"]``. :func:`allocate_rewards` then spreads an episode's
per-turn totals over its token ids for the training loss.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from bisect import bisect_left
from typing import Any, Callable, Sequence

from omrl import plugin_options
from omrl.data.trajectory import Episode
from omrl.env_results import finite_number
from omrl.errors import ConfigError, OmrlError, UnknownNameError, short_repr
from omrl.processes import is_main_process
from omrl.supervisor import StageStalled, on_stall, stage

ALLOCATION_MODES = ("last_token", "uniform_positive", "discounted", "per_turn")
TOTAL = "total"
#: Below this batch size an all-zero batch is too likely by chance to warn about.
ZERO_WARNING_MIN_EPISODES = 8

RewardFn = Callable[..., list[list[float]]]


class RewardError(OmrlError):
    """A reward component was misconfigured or returned values of the wrong shape."""


class ZeroRewardWarning(UserWarning):
    """Every episode of a batch got a total reward of exactly 0."""


def episode_reward(fn: Callable[..., float]) -> RewardFn:
    """Turn ``fn(episode, **options) -> float`` into a batch reward that puts the value on the last turn.

    Episodes without turns get ``[]`` and ``fn`` is not called for them.

    >>> from omrl.data import Episode, Turn
    >>> @episode_reward
    ... def turns_used(episode):
    ...     return float(len(episode.turns))
    >>> turn = Turn("obs", "Act: up", "up", True, 0.0, False)
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", turns=[turn, turn])
    >>> turns_used([ep, Episode(env="gridworld", task_id=1, split="train", instruction="")])
    [[0.0, 2.0], []]
    """

    @functools.wraps(fn)
    def batch(episodes: Sequence[Episode], **options: Any) -> list[list[float]]:
        out = []
        for ep in episodes:
            if not ep.turns:
                out.append([])
                continue
            value = fn(ep, **options)
            if type(value).__name__ in ("bool", "bool_"):  # won or not (numpy's too): 1.0 or 0.0, as it was
                value = float(value)
            out.append([0.0] * (len(ep.turns) - 1) + [value])  # a None or a text: the composer names it
        return out

    return batch


def _describe(ep: Episode, index: int) -> str:
    return f"episode {index} (env {ep.env!r}, task {ep.task_id})"


def _check_options(name: str, fn: RewardFn, options: dict[str, Any]) -> None:
    """Raise naming the reward's valid options when ``options`` does not fit its signature."""
    plugin_options.check_options(fn, options, f"reward {name!r}", fixed=1)


def _checked(name: str, values: Any, episodes: Sequence[Episode]) -> list[list[float]]:
    """``values`` as floats, after checking one finite float per turn of every episode."""
    if not isinstance(values, (list, tuple)) or len(values) != len(episodes):
        got = f"{len(values)} lists" if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardError(
            f"reward {name!r} returned {got} for {len(episodes)} episodes; "
            "expected one list of per-turn floats per episode"
        )
    out = []
    for i, (ep, per_turn) in enumerate(zip(episodes, values)):
        if hasattr(per_turn, "tolist") and not isinstance(per_turn, (list, tuple)):  # a numpy array, a tensor
            per_turn = per_turn.tolist()
        if not isinstance(per_turn, (list, tuple)) or len(per_turn) != len(ep.turns):
            got = f"{len(per_turn)} values" if isinstance(per_turn, (list, tuple)) else short_repr(per_turn)
            raise RewardError(
                f"reward {name!r} gave {_describe(ep, i)} {got} for its {len(ep.turns)} turns; "
                "expected a list of one float per turn"
            )
        row = []
        for t, value in enumerate(per_turn):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not finite_number(value):
                raise RewardError(
                    f"reward {name!r} gave {_describe(ep, i)} turn {t} the value {value!r}; expected a finite float"
                )
            row.append(float(value))
        out.append(row)
    return out


def check_weights(weights: Any, where: str = "reward.weights") -> None:
    """Refuse reward weights (``where`` names them) that compose nothing: none, the composed ``total``
    itself, a weight that is not a finite number, a component no plugin registers."""
    from omrl import registry

    valid = f"registered rewards: {', '.join(registry.rewards.names())}"
    if not isinstance(weights, dict) or not weights:
        raise RewardError(f"{where} has no reward components: give weights such as {{'goal': 1.0}}; {valid}")
    if TOTAL in weights:
        raise RewardError(f"{TOTAL!r} is the composed reward and cannot be a component of {where}; {valid}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not finite_number(weight):
            raise RewardError(f"{where}: the reward weight for {name!r} must be a finite number, got {weight!r}")
        try:
            registry.rewards.get(name)
        except UnknownNameError as exc:  # its message has the close match and the registered names
            raise UnknownNameError(f"{where}: {exc}") from None


def check_options(weights: dict[str, float], options: dict[str, Any]) -> None:
    """Refuse a weighted reward's options (``options``: the config's ``plugins`` block) before anything is
    played: the names its signature takes, then its own ``check_options`` trait, which checks the values
    without scoring (a judge's scale, a reward model's path) so that a run does not find them bad only
    once its first rollout is played."""
    from omrl import registry

    for name in weights:
        component = registry.rewards.component(name)
        opts = dict(options.get(name) or {})
        _check_options(name, component.obj, opts)
        check = component.traits.get("check_options")
        if check is None:
            continue
        try:
            check(**opts)
        except OmrlError as exc:  # a plugin's message that does not say whose it is: named here
            if f"'{name}'" in str(exc) or f"plugins.{name}." in str(exc):
                raise
            raise ConfigError(f"reward {name!r} (plugins.{name}): {exc}") from exc


def check_for_play(weights: dict[str, float], options: dict[str, Any], tokenizer: Any) -> None:
    """When a session starts, not once its first rollout is played: refuse a weighted reward that cannot score the
    token ids of the policy's ``tokenizer`` (its ``check_tokenizer`` trait: a reward model trained on another base
    model), and stop where one's service cannot be reached (its ``check_reachable`` trait: a judge's endpoint)."""
    _each_check("check_tokenizer", weights, options, tokenizer)
    if is_main_process():  # under a launch, one process asks: a blip seen by any other would end the run
        _each_check("check_reachable", weights, options)


def _each_check(trait: str, weights: dict[str, float], options: dict[str, Any], *args: Any) -> None:
    """Each weighted reward's ``trait`` check, called with ``args`` and the reward's options."""
    from omrl import registry

    for name in weights:
        check = registry.rewards.component(name).traits.get(trait)
        if check is not None:
            check(*args, **dict(options.get(name) or {}))


def check_allocation(mode: str, gamma: float) -> None:
    """Refuse an allocation mode no one knows, or a discount outside [0, 1] (``reward.allocation``, ``reward.gamma``)."""
    if mode not in ALLOCATION_MODES:
        raise RewardError(f"unknown reward allocation {mode!r}; valid: {', '.join(ALLOCATION_MODES)}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
        raise RewardError(f"gamma must be a number in [0, 1], got {gamma!r}")


def _weighted_totals(weights: dict[str, float], components: dict[str, list[list[float]]], i: int, ep: Episode):
    """Episode ``i``'s weighted per-turn total; RewardError where finite values and weights overflow a float
    (it was trained on as inf, and the run blamed the gradients)."""
    totals = [sum(weights[name] * components[name][i][t] for name in weights) for t in range(len(ep.turns))]
    for t, total in enumerate(totals):
        if not math.isfinite(total):
            parts = " + ".join(f"{name} {weights[name]:g} x {components[name][i][t]:g}" for name in weights)
            raise RewardError(
                f"the weighted reward of {_describe(ep, i)} turn {t} is {total} ({parts}): too large for a float; "
                "lower reward.weights, or the scale of the reward that gives such values"
            )
    return totals


def compose_rewards(
    episodes: Sequence[Episode], weights: dict[str, float], options: dict[str, dict[str, Any]] | None = None
) -> dict[str, float]:
    """Compute the weighted reward components of a batch and store them on the episodes.

    Each component in ``weights`` is looked up in ``omrl.registry.rewards`` and
    called once with the whole batch and ``options[name]``; its per-turn values
    go to ``episode.rewards[name]`` and the weighted per-turn sum to
    ``episode.rewards["total"]``. A weight of 0 logs a component without
    training on it. Nothing is stored unless every component succeeds. Episodes whose env failed
    (``end_reason`` ``env_error``) are passed to no component: they measured nothing, so each
    component and the total are 0 on their turns and they count in no mean. A component may end an
    episode so itself (setting its ``end_reason`` to ``env_error`` and its ``error``, as a judge that
    could not score it does): it still returns a value for it, which is dropped, and later components
    no longer see it.

    ``options`` may be a run config's whole ``plugins`` block (options keyed by
    plugin name): keys that name no weighted component, such as the env's or
    the template's options, are left alone.

    Returns each component's (and the total's) mean per-episode sum over the episodes that did not
    fail in the env, for logging.

    >>> from omrl.data import Episode, Turn
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="", won=True, score=1.0,
    ...              turns=[Turn("obs", "Think: go\\nAct: up", "up", True, 0.0, True)])
    >>> compose_rewards([ep], {"goal": 1.0, "format": 0.5})
    {'goal': 1.0, 'format': 1.0, 'total': 1.5}
    >>> ep.rewards["total"]
    [1.5]
    """
    from omrl import registry

    check_weights(weights)
    options = dict(options or {})

    episodes = list(episodes)
    # an episode whose env failed measured nothing: no reward function sees it, and it scores 0
    played = [ep for ep in episodes if ep.end_reason != "env_error"]
    components: dict[str, list[list[float]]] = {}
    for name in weights:
        fn = registry.rewards.get(name)
        opts = dict(options.get(name) or {})
        _check_options(name, fn, opts)
        try:
            try:
                with stage("reward", component=name, episode=f"{len(played)} episodes"):
                    values = fn(played, **opts) if played else []
            except StageStalled as stall:
                if not (stall.drops_episodes() and on_stall() == "retry"):
                    raise
                with stage("reward", component=name, episode=f"{len(played)} episodes, called again"):
                    values = fn(played, **opts)  # deadlines.on_stall=retry: called once more
        except StageStalled as stall:
            if not stall.drops_episodes():
                raise
            # no score could be had for them: they measured nothing, as if their env had failed
            for ep in played:
                ep.end_reason, ep.error = "env_error", f"reward {name!r}: {stall}"
            played, components = [], {key: [] for key in weights}
            break
        except OmrlError:
            raise
        except Exception as exc:  # the reward's own failure (or its service's): named, never an omrl bug
            from omrl.plugins import plugin_site

            raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {exc}{plugin_site(exc)}") from exc
        components[name] = _checked(name, values, played) if played else []
        # a component may end an episode as env_error itself (a judge that could not score it): from here on
        # it is one of the episodes that measured nothing, for the next components and the total alike
        kept = [i for i, ep in enumerate(played) if ep.end_reason != "env_error"]
        for ep in played:  # named as the reward's failure, not the env's (omrl.training.rollout_health reads it)
            if ep.end_reason == "env_error" and not (ep.error or "").startswith(f"reward {name!r}"):
                ep.error = f"reward {name!r}: {ep.error or 'it could not score the episode'}"
        if len(kept) < len(played):
            played = [played[i] for i in kept]
            components = {key: [values[i] for i in kept] for key, values in components.items()}

    totals = [_weighted_totals(weights, components, i, ep) for i, ep in enumerate(played)]
    for ep in episodes:
        if ep.end_reason == "env_error":
            ep.rewards.update({name: [0.0] * len(ep.turns) for name in [*weights, TOTAL]})
    for i, ep in enumerate(played):
        for name, values in components.items():
            ep.rewards[name] = values[i]
        ep.rewards[TOTAL] = totals[i]

    n = max(len(played), 1)
    means = {name: sum(sum(v) for v in values) / n for name, values in components.items()}
    means[TOTAL] = sum(sum(ep.rewards[TOTAL]) for ep in played) / n
    scored = [ep for ep in played if ep.turns]  # one without a turn has no reward to be 0 (a game others ended)
    if (
        len(scored) >= ZERO_WARNING_MIN_EPISODES
        and any(weights.values())
        and all(v == 0.0 for ep in scored for v in ep.rewards[TOTAL])
    ):
        warnings.warn(
            f"all rewards are 0 over {len(scored)} episodes of {', '.join(sorted({ep.env for ep in scored}))} "
            f"(components: {', '.join(weights)}): most often the "
            "model does not solve any task yet (an untrained model: fine-tune it first, e.g. with `omrl sft` on "
            "the env's expert episodes); if the env's expert scores 0 too (`omrl rollout --expert`), check the "
            "env's score (Episode.score / Episode.won) and the reward weights",
            ZeroRewardWarning,
            stacklevel=2,
        )
    return means


def model_token_positions(episode: Episode) -> list[list[int]]:
    """For each turn, the positions in ``episode.token_ids`` of its model tokens (``loss_mask`` 1)."""
    n = len(episode.token_ids)
    if len(episode.loss_mask) != n:
        raise RewardError(
            f"episode (env {episode.env!r}, task {episode.task_id}) has {len(episode.loss_mask)} "
            f"loss-mask values for {n} token ids; they must be equally long"
        )
    positions = []
    previous_end = 0
    for t, turn in enumerate(episode.turns):
        start, end = turn.span
        if not previous_end <= start <= end <= n:
            raise RewardError(
                f"turn {t} of episode (env {episode.env!r}, task {episode.task_id}) has span "
                f"{turn.span}; spans must be [start, end) in order, not overlapping, "
                f"within its {n} token ids"
            )
        previous_end = end
        positions.append([p for p in range(start, end) if episode.loss_mask[p]])
    return positions


def allocate_rewards(episode: Episode, mode: str, gamma: float = 1.0) -> list[float]:
    """Spread the episode's per-turn ``rewards["total"]`` over its tokens: one float per token id.

    Tokens that the model did not generate get 0. Modes:

    - ``last_token``: the sum over turns on the last model token of the last turn.
    - ``uniform_positive``: a positive sum spread evenly over all model tokens;
      a sum <= 0 on the last model token (so a failure is not blamed on every token).
    - ``discounted`` (OpenManus-RL): walking the turns backwards from the sum,
      each turn's tokens get ``current / len(turn)``, then ``current *= gamma ** len(turn)``.
      Every turn's tokens sum to its discounted value, so the episode sum is not preserved.
    - ``per_turn``: each turn's reward on that turn's last model token.

    A turn without model tokens (an empty reply) hands its reward to the last
    model token before it, or to the episode's first model token if none is.

    >>> from omrl.data import Episode, Turn
    >>> ep = Episode(env="gridworld", task_id=0, split="train", instruction="",
    ...              token_ids=[7, 7, 1, 1, 7, 1, 1], loss_mask=[0, 0, 1, 1, 0, 1, 1],
    ...              turns=[Turn("o", "a", "a", True, 0.0, False, span=(2, 4)),
    ...                     Turn("o", "b", "b", True, 1.0, True, span=(5, 7))],
    ...              rewards={"total": [0.5, 1.0]})
    >>> allocate_rewards(ep, "per_turn")
    [0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    >>> allocate_rewards(ep, "last_token")
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.5]
    """
    check_allocation(mode, gamma)
    if TOTAL not in episode.rewards:
        raise RewardError(
            f"episode (env {episode.env!r}, task {episode.task_id}) has no composed reward; "
            "call omrl.rewards.compose_rewards on its batch first"
        )
    turn_rewards = episode.rewards[TOTAL]
    if len(turn_rewards) != len(episode.turns):
        raise RewardError(
            f"episode (env {episode.env!r}, task {episode.task_id}) has {len(turn_rewards)} "
            f"total rewards for {len(episode.turns)} turns"
        )

    segments = model_token_positions(episode)
    flat = [p for segment in segments for p in segment]
    out = [0.0] * len(episode.token_ids)
    if not flat:
        return out

    def anchor(turn: int) -> int:
        """The last model token at or before the end of ``turn``."""
        before = bisect_left(flat, episode.turns[turn].span[1]) - 1
        return flat[before] if before >= 0 else flat[0]

    total = float(sum(turn_rewards))
    if mode == "last_token":
        out[anchor(len(segments) - 1)] += total
    elif mode == "uniform_positive":
        if total > 0:
            for p in flat:
                out[p] = total / len(flat)
        else:
            out[anchor(len(segments) - 1)] += total
    elif mode == "discounted":
        current = total
        for segment in reversed(segments):
            for p in segment:
                out[p] = current / len(segment)
            current *= gamma ** len(segment)
    else:  # per_turn
        for t, reward in enumerate(turn_rewards):
            out[anchor(t)] += float(reward)
    return out
