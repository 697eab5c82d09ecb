"""LoRA as a recipe sets it up and saves it: bad settings refused before training, and the merged final
model equal to the adapter it was trained as, tied embeddings included."""

from __future__ import annotations

import pytest
import torch

from omrl.cli import main
from omrl.config.options import ModelConfig
from omrl.errors import ConfigError
from omrl.models import load_model
from omrl.training.config_checks import check_model_config
from omrl.training.model_setup import made_trainable, save_final_model

TINY_MODULES = "down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


@pytest.mark.parametrize("tied", [["lm_head"], ["embed_tokens"], ["lm_head", "embed_tokens"]])
def test_a_merged_model_with_tied_embeddings_adapted_is_the_trained_one(tiny_model_dir, tmp_path, tied):
    base, tok = load_model(tiny_model_dir)
    assert base.config.tie_word_embeddings  # as every built-in model
    embedding = base.get_input_embeddings().weight.detach().clone()
    model = made_trainable(base, ModelConfig(name=tiny_model_dir, lora_rank=4, lora_target_modules=["q_proj", *tied]))
    torch.manual_seed(0)
    with torch.no_grad():  # as if trained: every adapter changes its module (peft starts one factor at 0)
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.1)
    ids = torch.tensor([tok("hello there, how are you").input_ids])
    with torch.no_grad():
        trained = model.eval()(input_ids=ids).logits
    save_final_model(model, tok, tmp_path, merge_lora=True)
    saved, _ = load_model(str(tmp_path))
    with torch.no_grad():
        merged = saved.eval()(input_ids=ids).logits
    assert (trained - merged).abs().max().item() < 1e-4
    assert not saved.config.tie_word_embeddings
    if tied == ["lm_head"]:  # the input embedding as it was: only the head learned
        assert torch.equal(saved.get_input_embeddings().weight, embedding)


def test_untied_targets_keep_the_model_tied(tiny_model_dir, tmp_path):
    base, tok = load_model(tiny_model_dir)
    model = made_trainable(base, ModelConfig(name=tiny_model_dir, lora_rank=4, lora_target_modules=["q_proj"]))
    save_final_model(model, tok, tmp_path, merge_lora=True)
    saved, _ = load_model(str(tmp_path))
    assert saved.config.tie_word_embeddings
    assert saved.get_output_embeddings().weight is saved.get_input_embeddings().weight


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lora_dropout": 1.5}, "model.lora_dropout must be in [0, 1) (the chance each input of a LoRA adapter"),
        ({"lora_dropout": -0.1}, "model.lora_dropout must be in [0, 1)"),
        ({"lora_target_modules": []}, "model.lora_target_modules=[] names no module for LoRA"),
        ({"lora_alpha": 0}, "model.lora_alpha must be > 0 (the adapter's scale is alpha / rank), got 0"),
    ],
)
def test_bad_lora_settings_are_refused_before_a_model_loads(overrides, message):
    with pytest.raises(ConfigError) as info:
        check_model_config(ModelConfig(name="tiny", lora_rank=4, **overrides))
    assert message in str(info.value)


def test_lora_settings_unused_without_lora_may_be_empty():
    check_model_config(ModelConfig(name="tiny", lora_target_modules=[]))  # lora_rank=0: no LoRA


def test_a_target_no_module_of_the_model_has_is_refused_listing_them(tiny_model_dir):
    base, _ = load_model(tiny_model_dir)
    cfg = ModelConfig(name="tiny", lora_rank=4, lora_target_modules=["q_proj", "qproj", "mlp"])
    with pytest.raises(ConfigError) as info:
        made_trainable(base, cfg)
    assert str(info.value) == (
        "model.lora_target_modules: no linear or embedding module of model 'tiny' is named 'qproj', 'mlp'; "
        f"valid: {TINY_MODULES}"
    )
    peft_matched = made_trainable(base, ModelConfig(lora_rank=4, lora_target_modules=["self_attn.q_proj"]))
    assert len(peft_matched.targeted_module_names) == 2  # a dotted tail matches, as in peft


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (
            "model.lora_target_modules=[qproj]",
            f"module of model 'tiny' is named 'qproj'; valid: {TINY_MODULES}",
        ),
        ("model.lora_target_modules=[]", "model.lora_target_modules=[] names no module for LoRA"),
        ("model.lora_dropout=1.5", "model.lora_dropout must be in [0, 1)"),
    ],
)
def test_omrl_sft_reports_a_bad_lora_setting_in_one_line(
    tiny_model_dir, agent_jsonl, tmp_path, capsys, setting, expected
):
    out = tmp_path / "run"
    args = ["sft", "--model", "tiny", "--dataset", str(agent_jsonl), "--output-dir", str(out), "--lora-rank", "4"]
    with pytest.raises(SystemExit) as info:
        main([*args, setting])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert expected in err.replace("\n", "") and "bug in omrl" not in err
    assert not (out / "checkpoints").exists()
