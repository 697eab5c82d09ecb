"""A run checkpointed by an older omrl (commit fa6e857, before the training code was reorganised)
resumes with today's code and computes the very step the old code computed next.

The fixture in tests/fixtures/legacy_ppo_run/ is the first of two PPO steps on gridworld with the
built-in ``tiny`` model (value head, KL to a reference, entropy bonus), written by::

    omrl train ppo model.name=tiny env.name=gridworld env.max_turns=3 generation.max_new_tokens=8 \\
        generation.max_context=512 logging.tensorboard=false steps=2 tasks_per_step=2 group_size=3 \\
        eval_tasks=2 "reward.weights={goal: 1.0, tag_count: 0.1}" optim.learning_rate=1e-3 \\
        optim.micro_batch_size=4 kl_coef=0.05 entropy_coef=0.01 logging.save_steps=1 seed=3

with the step-2 checkpoint removed; ``expected_step2.json`` holds what that run logged at step 2.

Its COMPLETE marker lists no sha256 digests (that omrl wrote none), so nothing could tell a byte
flipped in its weights: resuming refuses it, saying how to vouch for its files
(``omrl checkpoint trust``); once vouched for, it resumes to the same step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from omrl.cli import build_app
from omrl.training.checkpoint import CheckpointError
from omrl.training.metrics import read_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "legacy_ppo_run"


@pytest.mark.slow
def test_a_checkpoint_from_before_the_reorganisation_resumes_to_the_same_step(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    resume = ["train", str(run / "config.yaml"), "--resume", "--output-dir", str(run)]
    refused = CliRunner().invoke(build_app(), resume)
    assert isinstance(refused.exception, CheckpointError), refused.output
    assert "lists no sha256 digests" in str(refused.exception)
    assert "omrl checkpoint trust" in str(refused.exception)
    assert not (run / "checkpoints" / "step-00000002").exists()
    trusted = CliRunner().invoke(build_app(), ["checkpoint", "trust", str(run / "checkpoints" / "step-00000001")])
    assert trusted.exit_code == 0 and "manifest written" in trusted.output
    result = CliRunner().invoke(build_app(), resume)
    assert result.exit_code == 0, result.output
    step2 = [r for r in read_metrics(run) if r["step"] == 2][0]
    expected = json.loads((FIXTURE / "expected_step2.json").read_text())
    for key in ("loss", "kl", "entropy", "grad_norm", "pg_loss", "value_loss"):
        assert step2[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-8), key
