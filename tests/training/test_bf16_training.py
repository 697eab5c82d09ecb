"""``omrl train bf16=true``: every forward of the policy (generation on the hf backend, the update's
forwards) runs under bfloat16 autocast, while weights, gradients and optimizer state stay float32."""

from __future__ import annotations

import io
import math

import pytest
import torch
from rich.console import Console

from omrl.training.dpo import DPORecipe
from omrl.training.metrics import read_metrics
from omrl.training.rl import RLRecipe
from tests.training.helpers import SampleIndexReward, gridworld_configs

QUIET = Console(file=io.StringIO())


@pytest.mark.parametrize("algo", ["grpo", "dpo"])
@pytest.mark.parametrize("bf16", [False, True])
def test_every_policy_forward_runs_in_the_precision_asked_for(tiny_model_dir, tmp_path, register_plugin, algo, bf16):
    register_plugin(SampleIndexReward(), name="sample-index")  # rewards that differ: an update to make
    cfg = gridworld_configs(tiny_model_dir, tmp_path, "env.max_turns=2", "eval_tasks=0", "steps=1")(
        f"algorithm.name={algo}", "group_size=3", "reward.weights={sample_index: 1.0}", f"bf16={str(bf16).lower()}"
    )
    recipe = (DPORecipe if algo == "dpo" else RLRecipe)(cfg, console=QUIET)
    seen: list[tuple[bool, torch.dtype]] = []  # (gradients on, the dtype computed in), call by call
    try:
        recipe.setup()
        projection = recipe.model.model.layers[0].self_attn.q_proj
        projection.register_forward_hook(lambda m, i, out: seen.append((torch.is_grad_enabled(), out.dtype)))
        summary = recipe.train()
    finally:
        recipe.cleanup()
    wanted = torch.bfloat16 if bf16 else torch.float32
    assert {dtype for _, dtype in seen} == {wanted}
    assert any(grad for grad, _ in seen) and not all(grad for grad, _ in seen)  # the update and the rollout both ran
    assert {p.dtype for p in recipe.model.parameters()} == {torch.float32}
    moments = [t for state in recipe.optimizer.state.values() for t in state.values() if t.dim()]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert summary["skipped_updates"] == 0
    (record,) = read_metrics(cfg.logging.output_dir)
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
