"""Low-rank deltas: a fine-tune shipped as a small file, rebuilt exactly; bad files named clearly."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from omrl.errors import OmrlError
from omrl.models.delta import apply_low_rank_delta, describe, export_low_rank_delta, file_digest


@pytest.fixture
def base_and_tuned(tiny_model_dir):
    """The tiny model's weights, and a copy moved by a rank-2 change per matrix and a shift of each norm."""
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    generator = torch.Generator().manual_seed(0)
    tuned = {}
    for name, weight in base.items():
        if weight.ndim == 2:
            left = torch.randn(weight.shape[0], 2, generator=generator)
            right = torch.randn(2, weight.shape[1], generator=generator)
            tuned[name] = weight + 1e-3 * left @ right
        else:
            tuned[name] = weight + 1e-3
    return base, tuned


def test_a_low_rank_change_round_trips_at_its_rank(tmp_path, base_and_tuned):
    base, tuned = base_and_tuned
    stats = export_low_rank_delta(base, tuned, tmp_path / "d.safetensors", rank=2, base_name="tiny")
    assert stats["kept"] == pytest.approx(1.0, abs=1e-9)
    rebuilt = apply_low_rank_delta(base, tmp_path / "d.safetensors")
    for name in base:
        change, error = tuned[name] - base[name], rebuilt[name] - tuned[name]
        assert error.abs().max() <= 2e-2 * change.abs().max() + 1e-7, name  # int8 factors: within 2%
        assert rebuilt[name].dtype == base[name].dtype
    assert describe(tmp_path / "d.safetensors") == {"format": "omrl-low-rank-delta/1", "base": "tiny", "rank": 2}


def test_a_lower_rank_keeps_less_and_the_same_inputs_give_the_same_bytes(tmp_path, base_and_tuned):
    base, tuned = base_and_tuned
    first = export_low_rank_delta(base, tuned, tmp_path / "a.safetensors", rank=1, base_name="tiny")
    export_low_rank_delta(base, tuned, tmp_path / "b.safetensors", rank=1, base_name="tiny")
    assert 0.3 < first["kept"] < 0.999
    assert file_digest(tmp_path / "a.safetensors") == file_digest(tmp_path / "b.safetensors")


def test_bad_inputs_are_named(tmp_path, base_and_tuned):
    base, tuned = base_and_tuned
    with pytest.raises(OmrlError, match="rank must be at least 1"):
        export_low_rank_delta(base, tuned, tmp_path / "d.safetensors", rank=0, base_name="tiny")
    with pytest.raises(OmrlError, match="different weights"):
        export_low_rank_delta(base, {**tuned, "extra.weight": torch.zeros(2)}, tmp_path / "d.safetensors", 1, "tiny")
    assert not list(tmp_path.iterdir()), "a refused export must leave no file"
    (tmp_path / "junk.safetensors").write_text("not a tensor file")
    with pytest.raises(OmrlError, match="junk.safetensors: not a readable delta file"):
        apply_low_rank_delta(base, tmp_path / "junk.safetensors")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(OmrlError, match="plain.safetensors: a safetensors file, but not an omrl delta"):
        apply_low_rank_delta(base, tmp_path / "plain.safetensors")
    export_low_rank_delta(base, tuned, tmp_path / "d.safetensors", rank=1, base_name="tiny")
    other = {name.replace("model.", "other."): weight for name, weight in base.items()}
    with pytest.raises(OmrlError, match="which the base model \\(tiny\\) does not have"):
        apply_low_rank_delta(other, tmp_path / "d.safetensors")


def test_mismatched_dtypes_and_broken_files_are_refused(tmp_path, base_and_tuned):
    from safetensors.torch import save

    base, tuned = base_and_tuned
    halved = {name: weight.bfloat16() for name, weight in tuned.items()}
    with pytest.raises(OmrlError, match="torch.float32 in the base.*torch.bfloat16 in the tuned model"):
        export_low_rank_delta(base, halved, tmp_path / "d.safetensors", rank=1, base_name="tiny")
    with pytest.raises(OmrlError, match="delta file .*nope.safetensors does not exist"):
        apply_low_rank_delta(base, tmp_path / "nope.safetensors")
    export_low_rank_delta(base, tuned, tmp_path / "d.safetensors", rank=1, base_name="tiny")
    meta = {"omrl_delta": '{"base": "tiny", "format": "omrl-low-rank-delta/1", "rank": 1}'}
    tensors = load_file(tmp_path / "d.safetensors")
    up = next(key for key in tensors if key.endswith(".delta_up"))
    cut = {key: value for key, value in tensors.items() if key != up.replace("_up", "_down")}
    (tmp_path / "cut.safetensors").write_bytes(save(cut, metadata=meta))
    with pytest.raises(OmrlError, match="incomplete; .*delta_up is there but not .*delta_down"):
        apply_low_rank_delta(base, tmp_path / "cut.safetensors")
    (tmp_path / "odd.safetensors").write_bytes(save({**tensors, "stray": torch.zeros(1)}, metadata=meta))
    with pytest.raises(OmrlError, match="unknown entry 'stray'; every entry ends in one of .delta"):
        apply_low_rank_delta(base, tmp_path / "odd.safetensors")


def test_a_model_built_from_another_delta_is_rebuilt(tmp_path):
    from omrl.models import loading as models

    built = tmp_path / "smollm2-135m-webshop"
    built.mkdir()
    assert not models._built_from_another_delta(built)  # no digest: nothing to compare
    (built / models._DELTA_DIGEST).write_text(file_digest(models.WEBSHOP_DELTA) + "\n")
    assert not models._built_from_another_delta(built)
    (built / models._DELTA_DIGEST).write_text("0" * 64 + "\n")
    assert models._built_from_another_delta(built)
