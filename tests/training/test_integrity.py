"""Integrity of what training writes: every checkpoint and final model carries a manifest of sha256
digests that resume and every load check; one without it is refused on resume; a full disk mid-save
is an error naming the path (never "a bug in omrl") that leaves nothing complete-looking behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from typer.testing import CliRunner

from omrl.cli import build_app, main
from omrl.errors import DamagedModelError, WriteFailed
from omrl.models import MODEL_MANIFEST, load_model, resolve_model_path
from omrl.training import checkpoint as ckpt
from omrl.training.checkpoint_marker import damage
from omrl.training.model_setup import save_final_model
from omrl.training.resume import resume_checkpoint
from tests.training.helpers import sft_command

TORCH_FULL = RuntimeError(
    "[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/0: file write failed"
)
SAFETENSORS_FULL = SafetensorError(
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


def _flip_a_byte(file: Path, offset: int = -100) -> None:
    """A bit rot inside a tensor's data (not its header): the file still loads, with one weight changed."""
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _save(output_dir, tiny_model, step: int) -> Path:
    model, tok = tiny_model
    return ckpt.save_checkpoint(output_dir, step, model, tokenizer=tok, config={"seed": 0})


def _as_an_older_omrl(path: Path) -> None:
    """COMPLETE as an older omrl wrote it: ``step N`` alone, no file count and no sha256 lines."""
    marker = path / ckpt.COMPLETE_MARKER
    marker.write_text(marker.read_text().splitlines()[0].split(" files ")[0] + "\n")


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_model_dir):
    """A finished one-step SFT run (final model and one checkpoint); tests copy it before changing it."""
    import json

    from .sample_data import agent_records

    root = tmp_path_factory.mktemp("sft")
    dataset = root / "agent.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in agent_records()))
    result = CliRunner().invoke(
        build_app(), sft_command(tiny_model_dir, dataset, root / "run", "logging.tensorboard=false")
    )
    assert result.exit_code == 0, result.output
    return root / "run"


@pytest.fixture
def run(sft_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(sft_run, copy)
    return copy


# -- checkpoints without a manifest -----------------------------------------------------------------


def test_a_checkpoint_without_digests_is_refused_on_resume_until_vouched_for(tmp_path, tiny_model):
    path = _save(tmp_path, tiny_model, 1)
    _as_an_older_omrl(path)
    _flip_a_byte(path / "model" / "model.safetensors")  # nothing can tell: it must not be resumed silently
    with pytest.raises(ckpt.CheckpointError, match="lists no sha256 digests") as refused:
        resume_checkpoint(tmp_path, {"seed": 0})
    assert str(path) in str(refused.value) and f"omrl checkpoint trust {path}" in str(refused.value)

    assert ckpt.trust_checkpoint(path) and not ckpt.trust_checkpoint(path)  # the second time: left as it is
    assert resume_checkpoint(tmp_path, {"seed": 0}) == path
    _flip_a_byte(path / "model" / "model.safetensors", offset=-200)  # from now on a change is found
    with pytest.raises(ckpt.CheckpointError, match="model/model.safetensors changed since it was written"):
        resume_checkpoint(tmp_path, {"seed": 0})


def test_trusting_something_that_is_not_a_checkpoint_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["checkpoint", "trust", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"{tmp_path} is not a complete checkpoint" in " ".join(capsys.readouterr().err.split())


def test_a_damaged_checkpoint_model_loaded_as_a_model_is_refused_naming_the_file(tmp_path, tiny_model):
    path = _save(tmp_path, tiny_model, 1)
    _flip_a_byte(path / "model" / "model.safetensors")
    with pytest.raises(DamagedModelError, match="model/model.safetensors changed since it was written"):
        load_model(str(path / "model"))


# -- the final model ----------------------------------------------------------------------------------


def test_the_final_model_carries_a_manifest_and_loads(run):
    lines = (run / MODEL_MANIFEST).read_text().splitlines()
    names = {line.split(" ", 2)[2] for line in lines}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    assert all(line.startswith("sha256 ") for line in lines)
    model, _ = load_model(str(run))
    assert model is not None


def test_eval_of_a_run_whose_final_weights_changed_exits_2_naming_the_file(run, capsys):
    _flip_a_byte(run / "model.safetensors")
    with pytest.raises(DamagedModelError, match="model.safetensors changed since it was written"):
        load_model(str(run))
    with pytest.raises(SystemExit) as info:
        main(["eval", "--env", "gridworld", "--model", str(run), "--num-tasks", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2 and "bug in omrl" not in err, err
    assert f"model {run.resolve()} is damaged: model.safetensors changed since it was written" in err, err


@pytest.mark.parametrize("damage", ["cut", "garbled header"])
def test_a_cut_or_garbled_weights_file_without_a_manifest_is_an_error_naming_it(tmp_path, tiny_model_dir, damage):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "cut" else data[:8] + b"#" * 32 + data[40:])
    with pytest.raises(DamagedModelError, match=f"{weights}: Error while deserializing header"):
        resolve_model_path(str(model_dir))


# -- a full disk --------------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["torch", "safetensors"])
def test_a_full_disk_during_a_checkpoint_save_names_the_checkpoint_and_keeps_the_last(
    tmp_path, tiny_model, monkeypatch, writer
):
    import transformers.modeling_utils

    first = _save(tmp_path, tiny_model, 1)

    def full(*args, **kwargs):
        raise TORCH_FULL if writer == "torch" else SAFETENSORS_FULL

    if writer == "torch":
        monkeypatch.setattr(torch, "save", full)
    else:
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    with pytest.raises(WriteFailed) as failed:
        ckpt.save_checkpoint(
            tmp_path,
            2,
            tiny_model[0],
            optimizer=torch.optim.SGD(tiny_model[0].parameters(), 0.1),
            tokenizer=tiny_model[1],
            config={"seed": 0},
        )
    assert str(ckpt.checkpoint_path(tmp_path, 2)) in str(failed.value)
    assert ("the disk is full" if writer == "safetensors" else "is the disk full?") in str(failed.value)
    monkeypatch.undo()
    assert ckpt.complete_checkpoints(tmp_path) == [first] and damage(first) is None
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]  # no partial directory


def test_a_full_disk_during_the_final_save_moves_nothing_in(tmp_path, tiny_model, monkeypatch):
    import transformers.modeling_utils

    def full(*args, **kwargs):
        raise SAFETENSORS_FULL

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    with pytest.raises(WriteFailed, match=f"cannot write the final model into {tmp_path}: the disk is full"):
        save_final_model(tiny_model[0], tiny_model[1], tmp_path, merge_lora=False)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_mid_run_exits_2_saying_so(tiny_model_dir, agent_jsonl, tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise TORCH_FULL

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(SystemExit) as info:
        main(sft_command(tiny_model_dir, agent_jsonl, tmp_path / "run", "logging.tensorboard=false"))
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2 and "bug in omrl" not in err, err
    assert f"cannot write checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-00000001'}: the write failed" in err
    assert ckpt.complete_checkpoints(tmp_path / "run") == []
    # it said "continue with --resume", which then found nothing to resume
    assert "no checkpoint came before it, so the steps done are lost" in err and "--resume" not in err


def test_a_chat_template_edited_on_purpose_is_accepted_by_checkpoint_trust(run, capsys):
    template = run / "chat_template.jinja"
    if not template.is_file():  # the tokenizer keeps its template in tokenizer_config.json
        template = run / "tokenizer_config.json"
    template.write_text(template.read_text() + "\n")
    with pytest.raises(
        DamagedModelError, match=f"changed on purpose\\? accept it: omrl checkpoint trust {run.resolve()}"
    ):
        load_model(str(run))
    with pytest.raises(SystemExit) as info:
        main(["checkpoint", "trust", str(run)])
    assert info.value.code == 0
    assert f"{run}: accepted as it is now: {template.name}" in capsys.readouterr().out
    model, _ = load_model(str(run))  # the change is the model's now
    assert model is not None
    _flip_a_byte(run / "model.safetensors")  # and any later change is found again
    with pytest.raises(DamagedModelError, match="model.safetensors changed since it was written"):
        load_model(str(run))


def test_a_cut_weights_file_is_never_vouched_for(tmp_path, tiny_model, run, capsys):
    """`checkpoint trust` wrote the digests of a truncated file, and the next load took it as whole."""
    path = _save(tmp_path, tiny_model, 1)
    _as_an_older_omrl(path)
    weights = path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(ckpt.CheckpointError, match=r"cannot vouch for .*: model/model.safetensors cannot be read"):
        ckpt.trust_checkpoint(path)
    assert not ckpt.has_manifest(path)  # nothing written
    final = run / "model.safetensors"  # a final model's, changed: accepted only when it reads whole
    final.write_bytes(final.read_bytes()[:-64])
    with pytest.raises(SystemExit) as info:
        main(["checkpoint", "trust", str(run)])
    assert info.value.code == 2 and "model.safetensors cannot be read" in " ".join(capsys.readouterr().err.split())
