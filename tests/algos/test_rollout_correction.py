"""Rollout corrections against hand-computed weights and masks, and what the loss makes of them.

One row of three loss tokens and a padding position, whose sampler saw ratios rho = p_old / p_sampler
of 3, 1/4 and 1 (the log-probs below), and a second row with rho = 1.5 and 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AlgoConfig, CorrectionInput
from omrl.data import Batch
from omrl.errors import ConfigError
from omrl.registry import algorithms
from omrl.training.losses import policy_gradient_loss
from omrl.training.rollout_correction import correct, correction_name, mismatch_means

OLD = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-1.0, -1.0, 0.0, 0.0]])
RHO = torch.tensor([[3.0, 0.25, 1.0, 1.0], [1.5, 1.0, 1.0, 1.0]])
SAMPLER = OLD - RHO.log()
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def corrected(name: str, **cfg):
    return algorithms.get(name, kind="rollout_correction")(CorrectionInput(OLD, SAMPLER, MASK), AlgoConfig(**cfg))


def test_none_keeps_every_loss_token_at_weight_one():
    weights, keep, metrics = corrected("none")
    assert weights.eq(1).all() and keep.tolist() == MASK.bool().tolist()
    assert metrics == {"rollout_weight_mean": 1.0, "rollout_weight_max": 1.0, "rollout_masked_share": 0.0}


def test_token_tis_caps_each_tokens_ratio():
    weights, keep, metrics = corrected("token_tis", rollout_is_cap=2.0)
    assert weights[0, :3].tolist() == pytest.approx([2.0, 0.25, 1.0])  # 3 capped at 2
    assert weights[1, :2].tolist() == pytest.approx([1.5, 1.0])
    assert weights[0, 3] == 1.0 and keep.tolist() == MASK.bool().tolist()  # padding: weight 1, not kept
    assert metrics["rollout_weight_mean"] == pytest.approx((2.0 + 0.25 + 1.0 + 1.5 + 1.0) / 5)
    assert metrics["rollout_weight_max"] == pytest.approx(2.0) and metrics["rollout_masked_share"] == 0.0


def test_seq_tis_weights_a_row_by_its_capped_product():
    weights, keep, _ = corrected("seq_tis", rollout_is_cap=2.0)
    assert weights[0, :3].tolist() == pytest.approx([0.75] * 3)  # 3 * 1/4 * 1, the padding's 1 not in it
    assert weights[1, :2].tolist() == pytest.approx([1.5] * 2)
    weights, _, _ = corrected("seq_tis", rollout_is_cap=1.2)
    assert weights[1, :2].tolist() == pytest.approx([1.2] * 2)


def test_token_mask_drops_tokens_outside_the_band_and_weights_the_rest():
    weights, keep, metrics = corrected("token_mask", rollout_band_low=0.5, rollout_band_high=2.0)
    assert keep.tolist() == [[False, False, True, False], [True, True, False, False]]  # 3 and 1/4 leave [0.5, 2]
    assert weights[0, 2] == pytest.approx(1.0) and weights[1, :2].tolist() == pytest.approx([1.5, 1.0])
    assert metrics["rollout_masked_share"] == pytest.approx(2 / 5)
    assert metrics["rollout_weight_mean"] == pytest.approx((1.0 + 1.5 + 1.0) / 3)


def test_seq_mask_drops_a_row_whose_product_passes_the_cap():
    weights, keep, metrics = corrected("seq_mask", rollout_is_cap=1.2)
    assert keep.tolist() == [[True, True, True, False], [False, False, False, False]]  # 0.75 kept, 1.5 dropped
    assert weights[0, :3].tolist() == pytest.approx([0.75] * 3)
    assert metrics["rollout_masked_share"] == pytest.approx(2 / 5)


# token log ratios past +-20 whose sums are not: [25, -24] sums to 1 (product e), [-25, 22] to -3
FAR_OLD = torch.zeros(2, 2)
FAR_SAMPLER = torch.tensor([[-25.0, 24.0], [25.0, -22.0]])
FAR_MASK = torch.ones(2, 2, dtype=torch.long)


def far_corrected(name: str, **cfg):
    data = CorrectionInput(FAR_OLD, FAR_SAMPLER, FAR_MASK)
    return algorithms.get(name, kind="rollout_correction")(data, AlgoConfig(**cfg))


def test_seq_tis_sums_the_rows_log_ratios_before_it_clamps():
    weights, _, metrics = far_corrected("seq_tis", rollout_is_cap=2.0)
    assert weights[0].tolist() == pytest.approx([2.0, 2.0])  # e^1 capped at 2, not e^(20 - 20) = 1
    assert weights[1].tolist() == pytest.approx([math.exp(-3.0)] * 2)  # not 1, 20 times too large
    # the weights applied: the capped one, not e (verl's rollout_is_max, the product before the cap)
    assert metrics["rollout_weight_max"] == pytest.approx(2.0)


def test_seq_mask_drops_a_row_whose_summed_log_ratio_passes_the_cap():
    weights, keep, _ = far_corrected("seq_mask", rollout_is_cap=2.0)
    assert keep.tolist() == [[False, False], [True, True]]  # e^1 > 2: dropped
    assert weights[1].tolist() == pytest.approx([math.exp(-3.0)] * 2)


def test_a_sequence_product_past_the_bound_is_clamped_after_the_sum():
    sampler = torch.tensor([[-15.0, -15.0], [15.0, 15.0]])  # each token within +-20, each sum past it
    weights, _, _ = algorithms.get("seq_tis", kind="rollout_correction")(
        CorrectionInput(FAR_OLD, sampler, FAR_MASK), AlgoConfig(rollout_is_cap=1e12)
    )
    assert weights[:, 0].tolist() == pytest.approx([math.exp(20.0), math.exp(-20.0)])


@pytest.mark.parametrize("setting", ["rollout_is_cap=0", "rollout_band_low=1.5", "rollout_band_high=0.9"])
def test_settings_out_of_range_name_the_key(setting):
    key, value = setting.split("=")
    name = "token_mask" if key.startswith("rollout_band") else "token_tis"
    with pytest.raises(ConfigError, match=f"algorithm.{key} must be"):
        corrected(name, **{key: float(value)})


def test_a_far_off_token_gives_a_finite_weight():
    sampler = OLD.clone()
    sampler[0, 0] = -500.0  # the sampler found the token near-impossible
    for name in ("token_tis", "seq_tis", "token_mask", "seq_mask"):
        weights, _, _ = algorithms.get(name, kind="rollout_correction")(
            CorrectionInput(OLD, sampler, MASK), AlgoConfig()
        )
        assert torch.isfinite(weights).all(), name


def test_mismatch_is_kl_of_the_sampler_from_the_old_policy_per_loss_token():
    got = mismatch_means(OLD, SAMPLER, MASK)
    rho = [3.0, 0.25, 1.0, 1.5, 1.0]
    assert got["mismatch_kl_k1"] == pytest.approx(sum(-math.log(r) for r in rho) / 5)
    assert got["mismatch_kl_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in rho) / 5)
    assert mismatch_means(OLD, OLD, MASK) == {"mismatch_kl_k1": 0.0, "mismatch_kl_k3": 0.0}


def test_correct_weighs_the_batch_and_drops_masked_tokens_from_its_loss_mask():
    batch = Batch({"old_log_probs": OLD, "sampler_log_probs": SAMPLER, "loss_mask": MASK.clone()})
    cfg = AlgoConfig(rollout_correction="token_mask", rollout_band_high=2.0)
    metrics = correct(batch, algorithms.get("token_mask", kind="rollout_correction"), cfg)
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0], [1, 1, 0, 0]]
    assert batch["rollout_weights"][1, :2].tolist() == pytest.approx([1.5, 1.0])
    assert metrics["rollout_masked_share"] == pytest.approx(2 / 5)
    with pytest.raises(ConfigError, match="needs the log-prob the sampler reported.*rollout_correction=none"):
        correct(
            Batch({"old_log_probs": OLD, "loss_mask": MASK}),
            algorithms.get("token_tis", kind="rollout_correction"),
            cfg,
        )


def test_the_weights_multiply_each_tokens_policy_loss():
    """ppo_clip at ratio 1 (on-policy): token loss -A_t, so the weighted loss is the mean of -w_t A_t."""
    advantages = torch.tensor([[1.0, -2.0, 0.5, 0.0], [3.0, 1.0, 0.0, 0.0]])
    weights = torch.tensor([[2.0, 0.25, 1.0, 1.0], [1.5, 1.0, 1.0, 1.0]])
    out = {"log_probs": OLD.clone().requires_grad_(), "entropy": torch.zeros_like(OLD)}
    mb = Batch({"loss_mask": MASK, "old_log_probs": OLD, "advantages": advantages, "rollout_weights": weights})
    ppo_clip = algorithms.get("ppo_clip", kind="policy_loss")
    loss, parts = policy_gradient_loss(out, mb, AlgoConfig(), ppo_clip, algorithms.get("k3", kind="kl"))
    expected = -(2.0 * 1.0 + 0.25 * -2.0 + 1.0 * 0.5 + 1.5 * 3.0 + 1.0 * 1.0) / 5
    assert loss.item() == pytest.approx(expected) and parts["pg_loss"] == pytest.approx(expected)
    loss.backward()
    assert out["log_probs"].grad[0, 0] == pytest.approx(-2.0 / 5)  # d(-w A r)/d log p = -w A r / 5 tokens


def test_auto_is_none_only_where_the_sampler_is_the_trainers_float32_model():
    def cfg(backend: str, dtype: str, chosen: str = "auto", bf16: bool = False):
        from types import SimpleNamespace

        return SimpleNamespace(
            algorithm=AlgoConfig(rollout_correction=chosen),
            generation=SimpleNamespace(backend=backend),
            model=SimpleNamespace(dtype=dtype),
            bf16=bf16,
        )

    assert correction_name(cfg("hf", "float32")) == "none"
    # float32 weights under bf16 autocast: sampler and update round apart (a gap 1000x float32's, measured)
    assert correction_name(cfg("hf", "float32", bf16=True)) == "token_tis"
    assert correction_name(cfg("hf", "bfloat16")) == "token_tis"
    assert correction_name(cfg("vllm", "float32")) == "token_tis"
    assert correction_name(cfg("openai", "float32")) == "token_tis"
    assert correction_name(cfg("vllm", "bfloat16", "seq_mask")) == "seq_mask"


def test_a_cap_below_1_is_refused_before_it_halves_every_update():
    """rollout_is_cap=0.5 capped every token's weight at 0.5: the update halved, silently."""
    from omrl.algos import check_settings

    with pytest.raises(ConfigError, match=r"algorithm.rollout_is_cap must be >= 1.0, got 0.5"):
        check_settings(AlgoConfig(rollout_is_cap=0.5))
    check_settings(AlgoConfig(rollout_is_cap=1.0))
