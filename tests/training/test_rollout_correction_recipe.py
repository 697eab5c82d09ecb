"""`omrl train` corrects for its sampler: the mismatch is measured every step, ~0 where the hf backend
samples the trainer's own float32 model, and a correction weighs or drops what another sampler saw."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from omrl.backends.base import Generation
from omrl.backends.hf import HFBackend
from omrl.errors import NothingLearned
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl

QUIET = Console(file=io.StringIO())


@pytest.fixture
def config(sample_index_configs):
    # the sampler differs on purpose (sampler_off_by_3): corrected, not a fault
    return sample_index_configs("steps=1", "generation.sampler_check_kl=0")


@pytest.fixture
def sampler_off_by_3(monkeypatch):
    """The hf backend as a sampler three times less sure of each token than the trainer (rho = 3)."""
    plain = HFBackend.generate

    def generate(self, prompts, params, messages=None):
        return [
            Generation(g.token_ids, [lp - math.log(3.0) for lp in g.logprobs], g.finish_reason, g.token_exact)
            for g in plain(self, prompts, params, messages)
        ]

    monkeypatch.setattr(HFBackend, "generate", generate)


def step_one(cfg) -> dict:
    run_rl(cfg, console=QUIET)
    return read_metrics(cfg.logging.output_dir)[0]


@pytest.mark.slow
def test_the_hf_sampler_in_float32_is_the_trainer_and_auto_corrects_nothing(config):
    record = step_one(config())
    assert abs(record["mismatch_kl_k1"]) < 1e-5 and 0 <= record["mismatch_kl_k3"] < 1e-8
    assert "rollout_weight_mean" not in record  # auto is none here: no weights


def test_a_sampler_that_differs_is_measured_and_its_tokens_weighted(config, sampler_off_by_3):
    plain = step_one(config("algorithm.rollout_correction=none", out="none"))
    assert plain["mismatch_kl_k1"] == pytest.approx(-math.log(3.0), abs=1e-4)
    assert plain["mismatch_kl_k3"] == pytest.approx(3.0 - 1.0 - math.log(3.0), abs=1e-3)
    tis = step_one(config("algorithm.rollout_correction=token_tis", out="tis"))
    assert tis["mismatch_kl_k1"] == pytest.approx(plain["mismatch_kl_k1"], abs=1e-4)  # measured before the update
    assert tis["rollout_weight_mean"] == pytest.approx(2.0, abs=1e-4) and tis["rollout_masked_share"] == 0.0
    # the same episodes (same seeds) with every token's loss doubled: rho = 3 capped at 2 (the loss of
    # centred advantages is about 0: a float32 sum in another order, on a GPU, lands 2e-7 from it)
    assert tis["pg_loss"] == pytest.approx(2.0 * plain["pg_loss"], rel=1e-3, abs=1e-6)
    assert tis["grad_norm"] == pytest.approx(2.0 * plain["grad_norm"], rel=1e-3)


def test_a_band_that_excludes_the_samplers_ratio_drops_every_token_and_skips_the_update(config, sampler_off_by_3):
    cfg = config("algorithm.rollout_correction=token_mask", "algorithm.rollout_band_high=2.0")
    with pytest.raises(NothingLearned, match="dropped every token"):
        run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert record["rollout_masked_share"] == 1.0 and record["skipped_updates"] == 1


def test_a_bf16_model_is_corrected_by_default(config):
    record = step_one(config("model.dtype=bfloat16"))
    assert "rollout_weight_mean" in record and record["rollout_masked_share"] == 0.0  # token_tis: weights, no mask
    assert 0 <= record["mismatch_kl_k3"] < 0.01 and record["rollout_weight_max"] <= 2.0
