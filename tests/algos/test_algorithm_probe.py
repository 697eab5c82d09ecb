"""The recipe runs the configured advantage estimator and policy loss once on a probe batch before any
rollout (omrl.training.algo_probe.check_algorithms): what either returns outside its calling convention
(omrl.algos) is a PluginError naming it and its plugin, not a TypeError deep in an update."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from rich.console import Console

from omrl import registry
from omrl.algos import require_present
from omrl.config.options import TrainRunConfig
from omrl.errors import ConfigError, OmrlError, PluginError
from omrl.hookspecs import hookimpl
from omrl.training import algo_probe
from omrl.training.rl import run_rl
from tests.training.helpers import gridworld_config


def fine(data, cfg):
    """Each row's reward sum minus the group's mean."""
    scores = (data.token_rewards * data.loss_mask).sum(-1, keepdim=True)
    advantages = (scores - scores.mean()) * data.loss_mask
    return advantages, advantages


def loss_ok(data, cfg):
    """A plain policy gradient."""
    return -(data.advantages * data.log_probs * data.loss_mask).sum(), {"ratio": 1.0}


def needs_values(data):
    """gae's way: refuse a run without a critic, and read its values (the rows' rewards less them)."""
    require_present("needs_values", values=data.values)
    advantages = (data.token_rewards - data.values) * data.loss_mask
    return advantages, advantages


def _nan_past_probe(data) -> float:
    return float("nan") if data.loss_mask.shape[1] > 3 else 1.0


ADVANTAGES = {
    "one_tensor": lambda data, cfg: fine(data, cfg)[0],
    "rows": lambda data, cfg: tuple(t.sum(-1) for t in fine(data, cfg)),
    "lists": lambda data, cfg: tuple(t.tolist() for t in fine(data, cfg)),
    "nan": lambda data, cfg: (fine(data, cfg)[0] * float("nan"), fine(data, cfg)[1]),
    "raises": lambda data, cfg: 1 / 0,
    "one_parameter": lambda data: fine(data, None),
    "needs_values": lambda data, cfg: needs_values(data),
    "omrl_error": lambda data, cfg: (_ for _ in ()).throw(OmrlError("pass_k must be below group_size")),
    # the probe's rows are 3 tokens long, a real rollout's longer: these pass the probe, then fail
    "nan_on_real_rows": lambda data, cfg: tuple(t * _nan_past_probe(data) for t in fine(data, cfg)),
    "raises_on_real_rows": lambda data, cfg: fine(data, cfg) if data.loss_mask.shape[1] <= 3 else [][1],
}
LOSSES = {
    "bare": lambda data, cfg: loss_ok(data, cfg)[0],
    "vector": lambda data, cfg: (-(data.advantages * data.log_probs), {}),
    "float": lambda data, cfg: (loss_ok(data, cfg)[0].item(), {}),
    "detached": lambda data, cfg: (loss_ok(data, cfg)[0].detach(), {}),
    "word_metric": lambda data, cfg: (loss_ok(data, cfg)[0], {"x": "hi"}),
    "raises": lambda data, cfg: [][0],
}


class Algorithms:
    @hookimpl
    def register_algorithms(self, register):
        register("fine", fine, kind="advantage")
        register("loss_ok", loss_ok, kind="policy_loss")
        for name, fn in ADVANTAGES.items():
            register(f"adv_{name}", fn, kind="advantage")
        for name, fn in LOSSES.items():
            register(f"loss_{name}", fn, kind="policy_loss")


@pytest.fixture
def check(register_plugin):
    """``check(advantage, policy_loss, ppo=False)``: check_algorithms on the run's registered pair."""
    register_plugin(Algorithms(), name="odd-algorithms")

    def run(advantage: str, policy_loss: str, ppo: bool = False) -> None:
        algo = dataclasses.replace(
            TrainRunConfig().algorithm, name="ppo" if ppo else "grpo", advantage=advantage, policy_loss=policy_loss
        )
        cfg = dataclasses.replace(TrainRunConfig(), algorithm=algo)
        adv = registry.algorithms.get(advantage, kind="advantage")
        algo_probe.check_algorithms(cfg, adv, ppo, False, registry.algorithms.get(policy_loss, kind="policy_loss"))

    return run


ESTIMATOR = "advantage estimator 'adv_{}' (plugin 'odd-algorithms', -) "
LOSS = "policy loss 'loss_{}' (plugin 'odd-algorithms', -) "


def refusal(check, named: str, name: str) -> str:
    with pytest.raises(PluginError) as info:
        check(f"adv_{name}", "loss_ok") if named == ESTIMATOR else check("fine", f"loss_{name}")
    return str(info.value)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("one_tensor", "returned a tensor of shape (4, 3) on a probe batch of shape (4, 3)"),
        ("rows", "returned tensors of shapes (4,) and (4,)"),
        ("lists", "returned a tuple of (a list of 4 items, a list of 4 items)"),
        ("nan", "returned values that are not finite (NaN or infinite)"),
    ],
)
def test_an_estimator_that_returns_outside_its_calling_convention_is_named_before_any_rollout(check, name, problem):
    message = refusal(check, ESTIMATOR, name)
    assert message.startswith(ESTIMATOR.format(name) + problem), message
    assert message.endswith("valid: (advantages, returns), two finite tensors shaped as data.loss_mask [bs, T]")


LOSS_PROBLEMS = {
    "bare": "returned a tensor of shape ()",
    "vector": "returned a tuple of (a tensor of shape (1, 2), {})",
    "float": "returned a tuple of (-0.0, {})",
    "detached": "returned a loss with no gradient",
    "word_metric": "returned metrics that are not numbers: x='hi'",
}


@pytest.mark.parametrize("name", LOSS_PROBLEMS)
def test_a_policy_loss_that_returns_outside_its_calling_convention_is_named_before_any_rollout(check, name):
    message = refusal(check, LOSS, name)
    assert message.startswith(LOSS.format(name) + LOSS_PROBLEMS[name]), message


@pytest.mark.parametrize(
    "named, name, error",
    [
        (ESTIMATOR, "raises", "ZeroDivisionError: division by zero"),
        (ESTIMATOR, "one_parameter", "TypeError: "),
        (LOSS, "raises", "IndexError: list index out of range"),
    ],
)
def test_an_algorithm_that_raises_is_named_before_any_rollout(check, named, name, error):
    message = refusal(check, named, name)
    assert message.startswith(f"{named.format(name)}failed on a probe batch: {error}"), message


def test_a_pair_inside_the_conventions_passes(check):
    check("fine", "loss_ok")
    check("adv_needs_values", "loss_ok", ppo=True)


def test_only_an_estimator_that_runs_given_values_is_told_it_needs_a_critic(check):
    with pytest.raises(ConfigError) as info:
        check("adv_needs_values", "loss_ok")
    assert str(info.value).endswith("; adv_needs_values needs a critic: use algorithm.name=ppo")
    with pytest.raises(ConfigError) as info:
        check("adv_omrl_error", "loss_ok")
    assert str(info.value) == (  # a setting of its own, not the recipe: the recipe is not blamed
        "algorithm.advantage=adv_omrl_error cannot run with these settings: pass_k must be below group_size"
    )


def test_a_critic_trained_for_an_estimator_that_reads_no_values_is_warned_of(check):
    """--algo ppo with algorithm.advantage=grpo trained a value loss that nothing read, and said nothing."""
    with pytest.warns(
        UserWarning, match="the ppo recipe trains a critic, but algorithm.advantage=fine reads no values"
    ):
        check("fine", "loss_ok", ppo=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check("adv_needs_values", "loss_ok", ppo=True)  # it reads them: nothing to say


def test_every_builtin_estimator_and_policy_loss_passes_the_probe(check):
    builtin = {c.name for c in registry.algorithms.components() if c.distribution == "omrl"}
    for name in sorted(builtin & set(registry.algorithms.names("advantage"))):
        if name not in ("pass_at_k", "gae", "remax"):  # pass_k 4 needs more than 4 samples; gae a critic
            check(name, "ppo_clip")
    check("gae", "ppo_clip", ppo=True)
    for name in sorted(builtin & set(registry.algorithms.names("policy_loss"))):
        check("grpo", name)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize(
    "name, problem",
    [
        ("nan_on_real_rows", "returned values that are not finite (NaN or infinite) on step 1's rollout of shape"),
        ("raises_on_real_rows", "failed on step 1's rollout: IndexError: list index out of range"),
    ],
)
def test_an_estimator_that_fails_only_on_a_real_rollout_is_named_and_nothing_is_trained(
    check, tiny_model_dir, tmp_path, name, problem
):
    cfg = gridworld_config(tiny_model_dir, tmp_path / "run", f"algorithm.advantage=adv_{name}")
    with pytest.raises(PluginError) as info:
        run_rl(cfg, console=Console(quiet=True))
    assert str(info.value).startswith(ESTIMATOR.format(name) + problem), info.value
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or "loss" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    )
