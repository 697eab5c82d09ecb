"""The algorithms' calling conventions, checked before the first rollout and on each.

Each registered estimator, policy loss and rollout correction runs once on a tiny made-up rollout
before any real one (:func:`check_algorithms`), and an estimator's advantages on each real rollout
are checked again (:func:`estimate`), so that a plugin returning the wrong thing is named as the
plugin, not reported as a bug of omrl nor trained on (a NaN advantage would turn every later loss
into NaN)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from omrl import registry
from omrl.algos import AdvantageInput, CorrectionInput, PolicyLossInput
from omrl.config.options import TrainRunConfig
from omrl.errors import ConfigError, OmrlError, PluginError, short_repr
from omrl.search import strategy_traits
from omrl.training.config_checks import searched

PROBE = "a probe batch"


def check_algorithms(
    cfg: TrainRunConfig,
    advantage_fn: Any,
    has_critic: bool,
    greedy: bool = False,
    loss_fn: Any = None,
    correction_fn: Any = None,
) -> None:
    """Run the advantage estimator once on a tiny made-up rollout of one task, before any real
    rollout: an estimator that needs what this run lacks (a critic's values) or a group size
    under which every advantage is 0 is refused now, naming the fix, not after a whole rollout.
    ``greedy``: the run plays the greedy baselines the estimator asked for. The policy loss
    (``loss_fn``) and the rollout correction (``correction_fn``) run once too, so that an option of
    theirs out of range fails now rather than at the first update."""
    algo, group = cfg.algorithm, cfg.group_size
    zeros, ones = torch.zeros(1, 2), torch.ones(1, 2)
    if loss_fn is not None:  # loss_norm_tokens 0: the recipe sets the run's token budget (episode_token_budget)
        resolved = dataclasses.replace(algo, loss_norm_tokens=algo.loss_norm_tokens or 1)
        log_probs = zeros.clone().requires_grad_()  # as the policy's are: the loss must carry their gradient
        loss = _probe("policy_loss", algo.policy_loss, loss_fn, PolicyLossInput(log_probs, zeros, ones, ones), resolved)
        _check_loss(algo.policy_loss, loss)
    if correction_fn is not None:
        correction_fn(CorrectionInput(zeros, zeros, ones), algo)
    if not strategy_traits(cfg.rollout.strategy).group_in_one_tree:  # a task's group is the leaves of its
        group = max(group, 2)  # group_size trees, and a tree has several
    rewards = torch.zeros(group, 3)
    # the samples of the task differ, the last one at pass_threshold: estimators counting passes see both
    rewards[:, -1] = torch.arange(1 - group, 1, dtype=torch.float32) + algo.pass_threshold
    probe = AdvantageInput(
        token_rewards=rewards,
        loss_mask=torch.ones(group, 3),
        group_ids=torch.zeros(group, dtype=torch.long),
        values=torch.zeros(group, 3) if has_critic else None,
        turn_index=torch.zeros(group, 3, dtype=torch.long),
        turn_rewards=rewards[:, -1:],
        turn_state_ids=torch.zeros(group, 1, dtype=torch.long),
        turn_node_ids=torch.arange(group)[:, None] if searched(cfg) else None,
        turn_parent_ids=torch.full((group, 1), -1) if searched(cfg) else None,
        tree_ids=torch.zeros(group, dtype=torch.long) if searched(cfg) else None,
        greedy_scores=torch.full((group,), algo.pass_threshold - group) if greedy else None,
    )
    try:
        advantages = checked_advantages(
            algo.advantage, _probe("advantage", algo.advantage, advantage_fn, probe, algo), probe
        )
    except PluginError:
        raise
    except OmrlError as err:  # a critic's values (gae), say: named as what to run instead when they would do
        if _reads_values(advantage_fn, probe, algo):
            raise ConfigError(
                f"algorithm.advantage={algo.advantage} cannot run with algorithm.name={algo.name}: {err}; "
                f"{algo.advantage} needs a critic: use algorithm.name=ppo"
            ) from err
        raise ConfigError(f"algorithm.advantage={algo.advantage} cannot run with these settings: {err}") from err
    if has_critic and _ignores_values(advantage_fn, probe, algo, advantages):
        warnings.warn(
            f"the {algo.name} recipe trains a critic, but algorithm.advantage={algo.advantage} reads no values: "
            "its value loss is trained and added to the loss for nothing; use an estimator that reads a "
            "critic's values, or --algo grpo",
            stacklevel=2,
        )
    if not advantages.any():
        # with two samples or more, a setting of the estimator's own makes the group too small (pass_k = G)
        fix = "use group_size >= 2" if group < 2 else "raise group_size, or change the estimator's own algorithm.* keys"
        raise ConfigError(
            f"algorithm.advantage={algo.advantage} gives every sample an advantage of 0 with "
            f"group_size={group} (it compares the samples of a task): nothing would be learned; {fix}"
        )
    if algo.dynamic_sampling:
        same = dataclasses.replace(probe, token_rewards=torch.ones_like(rewards), turn_rewards=torch.ones(group, 1))
        equal = checked_advantages(algo.advantage, _probe("advantage", algo.advantage, advantage_fn, same, algo), same)
        if (equal * same.loss_mask).abs().max() > 0:  # such a group still moves the policy: it must stay
            raise ConfigError(
                "algorithm.dynamic_sampling drops the groups whose samples got the same reward, which carry "
                f"no signal only where each advantage compares a group's samples; algorithm.advantage="
                f"{algo.advantage} gives such a group advantages of up to {float(equal.abs().max()):.3g}: "
                "use an estimator that compares a group's samples, or no dynamic sampling"
            )


def check_run_algorithms(cfg: TrainRunConfig) -> None:
    """:func:`check_algorithms` with the estimator, policy loss and rollout correction ``cfg`` names, as
    the online recipe runs it: ``omrl config show`` refuses what ``omrl train`` would."""
    from omrl.training.config_checks import wants_greedy_baseline
    from omrl.training.rollout_correction import correction_name

    algo = cfg.algorithm
    check_algorithms(
        cfg,
        registry.algorithms.get(algo.advantage, kind="advantage"),
        algo.name == "ppo",
        wants_greedy_baseline(cfg),
        registry.algorithms.get(algo.policy_loss, kind="policy_loss"),
        registry.algorithms.get(correction_name(cfg), kind="rollout_correction"),
    )


def _named(kind: str, name: str) -> str:
    component = registry.algorithms.component(name, kind=kind)
    label = {"advantage": "advantage estimator", "policy_loss": "policy loss"}[kind]
    return f"{label} {name!r} (plugin {component.plugin!r}, {component.distribution})"


def _shown(value: Any) -> str:
    """What a plugin returned, in a few words (a tensor as its shape: its values may be many lines)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)) and len(value) <= 3:
        return f"a {type(value).__name__} of ({', '.join(_shown(item) for item in value)})"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return short_repr(value)


def estimate(name: str, advantage_fn: Any, data: AdvantageInput, algo: Any, where: str) -> tuple[Any, Any]:
    """``advantage_fn(data, algo)`` on a real rollout (``where``: which), its result checked as the probe's."""
    result = _probe("advantage", name, advantage_fn, data, algo, where)
    checked_advantages(name, result, data, where)
    return result


def _probe(kind: str, name: str, fn: Any, data: Any, algo: Any, where: str = PROBE) -> Any:
    """``fn(data, algo)``; an error that is not an OmrlError becomes a PluginError naming the plugin."""
    try:
        return fn(data, algo)
    except OmrlError:
        raise
    except Exception as exc:
        raise PluginError(f"{_named(kind, name)} failed on {where}: {type(exc).__name__}: {exc}") from exc


def checked_advantages(name: str, result: Any, data: AdvantageInput, where: str = PROBE) -> torch.Tensor:
    """The advantages of an estimator's ``(advantages, returns)`` on ``data`` (``where`` says which batch),
    both finite tensors shaped as its loss_mask; else PluginError naming the estimator. On a real
    rollout, values that are not finite where its inputs are not finite either (a diverged critic's
    values) are the run's to report, not the estimator's: returned as they are."""
    shape = tuple(data.loss_mask.shape)
    pair = isinstance(result, (tuple, list)) and len(result) == 2
    if not (pair and all(isinstance(t, torch.Tensor) for t in result)):
        problem = f"returned {_shown(result)}"
    elif any(tuple(t.shape) != shape for t in result):
        problem = f"returned tensors of shapes {tuple(result[0].shape)} and {tuple(result[1].shape)}"
    elif not all(bool(torch.isfinite(t).all()) for t in result) and _finite_inputs(data):
        problem = "returned values that are not finite (NaN or infinite)"
    else:
        return result[0]
    raise PluginError(
        f"{_named('advantage', name)} {problem} on {where} of shape {shape}; valid: (advantages, returns), "
        "two finite tensors shaped as data.loss_mask [bs, T]"
    )


def _check_loss(name: str, result: Any) -> None:
    """PluginError naming the policy loss unless it returned ``(loss, metrics)``: a 0-d tensor with a gradient
    and a dict of numbers."""
    loss, metrics = result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not isinstance(metrics, dict):
        problem = f"returned {_shown(result)}"
    elif loss.grad_fn is None:
        problem = "returned a loss with no gradient (detached, or not computed from data.log_probs)"
    else:
        bad = [key for key, value in metrics.items() if not _number(value)]
        if not bad:
            return
        problem = f"returned metrics that are not numbers: {', '.join(f'{k}={short_repr(metrics[k])}' for k in bad)}"
    raise PluginError(
        f"{_named('policy_loss', name)} {problem} on a probe batch; valid: (loss, metrics), loss a 0-d tensor "
        "computed from data.log_probs, metrics a dict of floats"
    )


def _number(value: Any) -> bool:
    try:
        return float(value) is not None
    except (TypeError, ValueError, RuntimeError):
        return False


def _reads_values(advantage_fn: Any, probe: AdvantageInput, algo: Any) -> bool:
    """Whether the estimator that failed on ``probe`` runs given a critic's values (so it needs a critic)."""
    if probe.values is not None:
        return False
    try:
        advantage_fn(dataclasses.replace(probe, values=torch.zeros_like(probe.token_rewards)), algo)
    except Exception:
        return False
    return True


def _ignores_values(advantage_fn: Any, probe: AdvantageInput, algo: Any, advantages: torch.Tensor) -> bool:
    """Whether the estimator gives ``probe`` the same ``advantages`` whatever the critic's values."""
    other = dataclasses.replace(
        probe, values=torch.linspace(-1.0, 1.0, probe.token_rewards.numel()).view_as(probe.token_rewards)
    )
    try:
        moved = advantage_fn(other, algo)[0]
    except Exception:  # noqa: BLE001 - whatever it makes of other values, it read them
        return False
    return bool(torch.equal(moved, advantages))


def _finite_inputs(data: AdvantageInput) -> bool:
    """Whether every number an estimator reads is finite (rewards always are: omrl.rewards checks them)."""
    tensors = (data.token_rewards, data.turn_rewards, data.values, data.greedy_scores)
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)
