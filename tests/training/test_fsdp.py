"""FSDP pieces in one process (a world of 1, gloo): optimizer state that stays untouched until the
first update, weights that do not fit, and checkpoints written the other way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from omrl.models import load_model
from omrl.parallel import fsdp
from omrl.training.checkpoint import CheckpointError, _check_optimizer_layout, load_model_weights


def fsdp_load(model, weights, ignore=frozenset()):
    return fsdp.load_full_state_dict(model, weights, ignore=ignore)


@pytest.fixture
def process_group(tmp_path):
    """A one-process group, destroyed afterwards."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_saving_an_untouched_optimizer_leaves_it_untouched(process_group, tiny_model_dir, tmp_path):
    model, _ = load_model(tiny_model_dir)
    fsdp.shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = fsdp.full_optimizer_state(model, optimizer)  # torch steps at lr 0 to fill the state in
    assert not optimizer.state  # ... which must not count as AdamW's first step
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fsdp.load_full_optimizer_state(model, fresh, saved)
    assert not fresh.state


def test_whole_weights_that_miss_a_layer_are_refused(process_group, tiny_model_dir, tmp_path):
    from safetensors.torch import save_file

    model, _ = load_model(tiny_model_dir)
    weights = {k: v.clone() for k, v in model.state_dict().items() if ".layers.0." not in k}
    (tmp_path / "model").mkdir()
    save_file(weights, tmp_path / "model" / "model.safetensors")
    fsdp.shard(model)
    with pytest.raises(CheckpointError, match="does not fit the model: missing .*layers.0"):
        load_model_weights(model, tmp_path / "model", strategy=SimpleNamespace(load_weights=fsdp_load))


def test_the_unsharded_copy_follows_the_sharded_model(process_group, tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    replica, _ = load_model(tiny_model_dir)
    fsdp.shard(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    fsdp.copy_whole_weights(model, replica)
    whole = fsdp.full_state_dict(model)
    for name, tensor in replica.state_dict().items():
        torch.testing.assert_close(tensor, whole[name], msg=name)


@pytest.mark.parametrize("sharded, written", [(True, "a data-parallel"), (False, "a sharded")])
def test_a_checkpoint_is_resumed_only_the_way_it_was_written(tmp_path, sharded, written):
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(layer.parameters())
    state = optimizer.state_dict()  # parameters by position, as data parallel saves them
    if written == "a sharded":
        state["param_groups"][0]["params"] = ["weight", "bias"]  # by name, as FSDP and ZeRO-3 save them
    with pytest.raises(CheckpointError, match=f"written by {written} run"):
        _check_optimizer_layout(tmp_path, state, sharded=sharded)
    _check_optimizer_layout(tmp_path, state, sharded=written == "a sharded")  # the same way: accepted
