"""``omrl checkpoint merge``: a LoRA run's checkpoint held its adapter alone, and no command could
evaluate it; merged, it is the model the run would have saved at that step."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.cli import main
from omrl.models import load_model
from omrl.training.checkpoint import CheckpointError, complete_checkpoints, trust_checkpoint
from omrl.training.lora_merge import merge_checkpoint
from omrl.training.sft import run_sft


@pytest.fixture
def lora_run(sft_config) -> Path:
    cfg = sft_config(
        model__lora_rank=4,
        model__lora_target_modules=["q_proj", "v_proj"],
        optim__learning_rate=1e-2,
        num_train_epochs=1.0,
        logging__save_steps=1,
    )
    run_sft(cfg, console=Console(file=io.StringIO()))
    return Path(cfg.logging.output_dir)


def test_the_last_checkpoint_merged_is_the_runs_final_model(lora_run, tiny_model_dir, capsys):
    last = complete_checkpoints(lora_run)[-1]
    with pytest.raises(SystemExit) as done:
        main(["checkpoint", "merge", str(last / "model")])  # its model/ folder names it too
    assert done.value.code == 0
    step = int(last.name.split("-")[1])
    out = lora_run.with_name(f"{lora_run.name}-step-{step}")
    assert f"merged into {out}" in capsys.readouterr().out
    merged, tokenizer = load_model(str(out))  # checked against the manifest it was written with
    final, _ = load_model(str(lora_run))
    base, _ = load_model(tiny_model_dir)
    weights, final_weights, base_weights = (m.state_dict() for m in (merged, final, base))
    assert weights.keys() == final_weights.keys()
    assert all(torch.equal(weights[k], final_weights[k]) for k in weights)
    assert not torch.equal(
        weights["model.layers.0.self_attn.q_proj.weight"], base_weights["model.layers.0.self_attn.q_proj.weight"]
    )
    assert tokenizer.chat_template and (out / "omrl_model.step").read_text().strip() == str(step)


def test_an_earlier_checkpoint_merges_to_its_own_weights(lora_run):
    first, last = complete_checkpoints(lora_run)[0], complete_checkpoints(lora_run)[-1]
    a = load_model(str(merge_checkpoint(first, lora_run.parent / "a")))[0].state_dict()
    b = load_model(str(merge_checkpoint(last, lora_run.parent / "b")))[0].state_dict()
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"])


def test_what_cannot_be_merged_is_named(lora_run, sft_config, tmp_path):
    last = complete_checkpoints(lora_run)[-1]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(CheckpointError, match="full exists and is not an empty folder: give another --output-dir"):
        merge_checkpoint(last, tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "mine"
    with pytest.raises(CheckpointError, match=f"is a run's folder; give one of its checkpoints: .*{last}"):
        merge_checkpoint(lora_run)
    with pytest.raises(CheckpointError, match="is not a complete checkpoint .* RUN/checkpoints/step-00000012"):
        merge_checkpoint(tmp_path)
    gone = last.parent / "step-00000099"  # as the docs' step-00000012 reads in a run of fewer steps
    for refuse in (merge_checkpoint, trust_checkpoint):
        with pytest.raises(CheckpointError, match=f"no such folder {gone}; the run's checkpoints: .*{last}"):
            refuse(gone)
    weights = last / "model" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="is damaged: .*adapter_model.safetensors"):
        merge_checkpoint(last, tmp_path / "out")
    plain = sft_config(logging__output_dir=str(tmp_path / "plain"), logging__save_steps=1, num_train_epochs=1.0)
    run_sft(plain, console=Console(file=io.StringIO()))
    with pytest.raises(CheckpointError, match="a run without LoRA: its model is whole already; give .*/model"):
        merge_checkpoint(complete_checkpoints(tmp_path / "plain")[-1], tmp_path / "out")
