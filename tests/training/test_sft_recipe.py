"""The SFT recipe on the tiny model: it learns, saves what it should, and survives bad steps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console

from omrl.config import from_dict
from omrl.config.options import SftRunConfig
from omrl.errors import NonFiniteLossError, NothingLearned
from omrl.models import load_model
from omrl.training.checkpoint import CheckpointError, complete_checkpoints
from omrl.training.metrics import read_metrics
from omrl.training.optim import lr_multiplier
from omrl.training.sft import SftRecipe, run_sft
from tests.training.helpers import train_then_clean_up

QUIET = Console(file=io.StringIO())


def test_short_run_lowers_the_loss_and_fills_the_output_dir(sft_config):
    cfg = sft_config(
        num_train_epochs=3.0, packing=True, max_seq_length=230, optim__learning_rate=3e-3, logging__save_steps=3
    )
    summary = run_sft(cfg, console=QUIET)
    losses = [r["loss"] for r in read_metrics(cfg.logging.output_dir)]
    assert summary["steps"] == len(losses) >= 6
    assert losses[-1] < 0.8 * losses[0]  # 4 distinct conversations, seen 3 times each
    out = cfg.logging.output_dir
    names = {p.name for p in Path(out).iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "config.yaml",
        "metrics.jsonl",
        "checkpoints",
    } <= names
    assert from_dict(SftRunConfig, yaml.safe_load((Path(out) / "config.yaml").read_text())) == cfg
    assert [p.name for p in complete_checkpoints(out)][-1] == f"step-{summary['steps']:08d}"  # the final one
    model, tok = load_model(out)
    assert tok.chat_template and model.num_parameters() > 0


def test_lora_run_saves_a_merged_model_that_loads_plainly(sft_config, tiny_model_dir):
    cfg = sft_config(
        model__lora_rank=4,
        model__lora_target_modules=["q_proj", "v_proj"],
        optim__learning_rate=1e-2,
        num_train_epochs=1.0,
    )
    run_sft(cfg, console=QUIET)
    out = cfg.logging.output_dir
    assert not any(p.name.startswith("adapter_") for p in Path(out).iterdir())
    merged, _ = load_model(out)
    base, _ = load_model(tiny_model_dir)
    layer, base_layer = merged.model.layers[0].self_attn, base.model.layers[0].self_attn
    assert not torch.equal(layer.q_proj.weight, base_layer.q_proj.weight)  # the adapter is merged in
    assert torch.equal(layer.k_proj.weight, base_layer.k_proj.weight)  # untargeted modules untouched


def _nan_on_calls(model, calls):
    """Make the last hidden state NaN on the given forward calls (counted from 1). The hook sits on the
    decoder's final norm, which runs once a forward (the LM head runs once per chunk of labelled tokens)."""
    seen = {"n": 0}

    def hook(module, inputs, output):
        seen["n"] += 1
        return output * float("nan") if seen["n"] in calls else output

    model.get_decoder().norm.register_forward_hook(hook)


def test_a_nan_step_is_skipped_and_counted(sft_config):
    cfg = sft_config(num_train_epochs=1.0)
    recipe = SftRecipe(cfg, console=QUIET)
    recipe.setup()
    before = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    _nan_on_calls(recipe.model, calls={1})
    summary = train_then_clean_up(recipe)
    records = read_metrics(cfg.logging.output_dir)
    assert summary["skipped_updates"] == 1 and records[0]["loss"] is None and records[1]["skipped_updates"] == 1
    assert all(r["loss"] is not None for r in records[1:])
    assert any(not torch.equal(v, before[k]) for k, v in recipe.model.state_dict().items())


def test_a_run_whose_every_update_was_skipped_fails_after_saving(sft_config):
    cfg = sft_config(num_train_epochs=1.0, optim__max_nan_steps=1000)
    recipe = SftRecipe(cfg, console=QUIET)
    recipe.setup()
    _nan_on_calls(recipe.model, calls=set(range(1, 1000)))
    with pytest.raises(NothingLearned, match=f"this run's {recipe.total_steps} updates was skipped.*non-finite loss"):
        train_then_clean_up(recipe)
    assert (Path(cfg.logging.output_dir) / "config.json").exists()  # the model saved first
    assert read_metrics(cfg.logging.output_dir)[-1]["skipped_updates"] == recipe.total_steps


def test_a_skipped_update_does_not_advance_the_schedule(sft_config):
    cfg = sft_config(
        num_train_epochs=1.0, optim__warmup_steps=2, optim__lr_schedule="linear", optim__learning_rate=1e-3
    )
    recipe = SftRecipe(cfg, console=QUIET)
    recipe.setup()
    _nan_on_calls(recipe.model, calls={2})
    summary = train_then_clean_up(recipe)
    total = recipe.total_steps
    assert summary["skipped_updates"] == 1 and summary["steps"] == total >= 4
    # step 2 is skipped: step 3 uses the rate step 2 would have, and every later step one update behind
    applied_before = [0, 1, 1] + list(range(2, total - 1))
    lrs = [r["lr"] for r in read_metrics(cfg.logging.output_dir)]
    assert lrs == pytest.approx([1e-3 * lr_multiplier(n, total, 2, "linear") for n in applied_before])
    assert recipe.scheduler.last_epoch == total - 1


def test_nan_steps_in_a_row_stop_the_run_with_a_clear_error(sft_config):
    cfg = sft_config(optim__max_nan_steps=2)
    recipe = SftRecipe(cfg, console=QUIET)
    recipe.setup()
    before = {k: v.clone() for k, v in recipe.model.state_dict().items()}
    _nan_on_calls(recipe.model, calls=set(range(1, 100)))
    with pytest.raises(NonFiniteLossError, match=r"2 updates in a row \(up to step 2\).*optim.max_nan_steps=2"):
        train_then_clean_up(recipe)
    assert all(torch.equal(v, before[k]) for k, v in recipe.model.state_dict().items())  # no update applied


def test_a_conversation_the_template_cannot_lay_out_fails_with_file_and_row(sft_config, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, '
        '{"role": "assistant", "content": "c"}]}\n'
    )
    with pytest.raises(Exception, match=rf"{bad} row 1: message 2 has role 'assistant'"):
        run_sft(sft_config(dataset=str(bad)), console=QUIET)


def test_fresh_run_over_old_checkpoints_and_changed_data_are_refused(sft_config, agent_jsonl):
    cfg = sft_config(num_train_epochs=0.5)
    run_sft(cfg, console=QUIET)
    with pytest.raises(CheckpointError, match="holds checkpoints of an earlier run; pass --resume"):
        run_sft(cfg, console=QUIET)
    agent_jsonl.write_text(agent_jsonl.read_text().replace("Verified", "Checked"))
    with pytest.raises(CheckpointError, match="the training data changed"):
        cfg.resume = True
        run_sft(cfg, console=QUIET)


def test_conversations_cut_to_max_seq_length_are_reported(sft_config):
    out = io.StringIO()
    run_sft(sft_config(max_seq_length=48, packing=False), console=Console(file=out, width=300))
    assert "conversations were longer than max_seq_length=48 tokens and were cut to it" in out.getvalue()


def test_a_run_says_first_what_it_trains_on_and_how_its_steps_add_up(sft_config):
    """It began with "step 1/52": nothing said the model, the data, the packing or where the steps come from."""
    out = io.StringIO()
    cfg = sft_config(num_train_epochs=2.0, packing=False, optim__micro_batch_size=1,
                     optim__gradient_accumulation_steps=2)  # fmt: skip
    summary = run_sft(cfg, console=Console(file=out, width=400))
    first = out.getvalue().splitlines()[0]
    assert first.startswith(f"omrl sft: {cfg.model.name} on ") and " conversations; 2 epochs of " in first
    conversations = int(first.split(" on ")[1].split(" conversations")[0])
    per_epoch = -(-conversations // 2)  # a row a micro-batch, two a step
    assert f"2 epochs of {per_epoch} steps ({conversations} micro-batches of up to 1 rows" in first
    assert first.endswith(f"): {summary['steps']} steps -> {cfg.logging.output_dir}")
    assert summary["steps"] == 2 * per_epoch
