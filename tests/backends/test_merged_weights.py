"""A LoRA model's weights for an engine that knows no adapters (the in-process vLLM): merged into the base
weights under the base model's names, which a plain model of the same kind loads and runs as the trained
one. vLLM's engine loaded peft's names and died at the first sync (``no module named 'base_model'``)."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from omrl.backends.merged_weights import merged_state
from omrl.models import load_model


def trained_lora(model_dir, targets: list[str]):
    base, tokenizer = load_model(model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # an update's worth of change (peft starts lora_B at zero: the base model)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn_like(p))
    return model, tokenizer


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "down_proj"]])
def test_merged_weights_are_peft_s_merge_and_a_plain_model_runs_them_as_the_trained_one(tiny_model_dir, targets):
    model, tokenizer = trained_lora(tiny_model_dir, targets)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state(model, model.state_dict())

    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert sorted(merged) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, msg=name)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the trained model is as it was

    plain, _ = load_model(tiny_model_dir)
    plain.load_state_dict(merged)
    ids = torch.tensor([tokenizer.encode("go north, then east")])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(load_model(tiny_model_dir)[0](ids).logits, model(ids).logits, atol=1e-3)


def test_a_model_without_an_adapter_is_sent_as_it_is(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    state = model.state_dict()
    merged = merged_state(model, state)
    assert merged.keys() == state.keys() and all(merged[k] is state[k] for k in state)
