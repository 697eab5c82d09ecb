"""Checkpoints: what they restore, atomic writes, keep-last-N, and the resume config check."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch

from omrl.config.options import OptimConfig
from omrl.training import checkpoint as ckpt
from omrl.training.checkpoint_marker import damage
from omrl.training.optim import build_optimizer, build_scheduler
from omrl.training.resume import resume_checkpoint


def _train_one_step(model, optimizer, scheduler):
    ids = torch.arange(1, 17, device=model.device).unsqueeze(0)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


@pytest.fixture
def trained(tiny_model):
    model, tok = tiny_model
    optimizer = build_optimizer(model, OptimConfig(learning_rate=1e-2))
    scheduler = build_scheduler(optimizer, OptimConfig(warmup_steps=3), total_steps=10)
    _train_one_step(model, optimizer, scheduler)
    return model, tok, optimizer, scheduler


def _save(tmp_path, trained, step, **kw):
    model, tok, optimizer, scheduler = trained
    return ckpt.save_checkpoint(
        tmp_path,
        step,
        model,
        optimizer=optimizer,
        scheduler=scheduler,
        tokenizer=tok,
        data_state={"epoch": 1, "index": 3},
        config=kw.pop("config", {"seed": 0, "optim": {"lr": 1.0}}),
        **kw,
    )


def test_load_restores_weights_optimizer_scheduler_rng_and_extra(tmp_path, trained, tiny_model_dir):
    from omrl.models import load_model

    model, _, optimizer, scheduler = trained
    head = torch.nn.Linear(4, 1)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(tmp_path, trained, 7, extra={"value_head": head.state_dict(), "rl_position": {"batch": 5}})
    expected_draws = (random.random(), np.random.rand(), torch.rand(1))
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}

    fresh, _ = load_model(tiny_model_dir)
    fresh_opt = build_optimizer(fresh, OptimConfig(learning_rate=1e-2))
    fresh_sched = build_scheduler(fresh_opt, OptimConfig(warmup_steps=3), total_steps=10)
    state = ckpt.load_checkpoint(path, fresh, optimizer=fresh_opt, scheduler=fresh_sched)

    assert (state.step, state.data_state, state.config["optim"]) == (7, {"epoch": 1, "index": 3}, {"lr": 1.0})
    assert all(torch.equal(v, expected_weights[k].to(v.device)) for k, v in fresh.state_dict().items())
    assert torch.equal(state.extra["value_head"]["weight"], head.weight) and state.extra["rl_position"] == {"batch": 5}
    assert (
        fresh_sched.last_epoch == scheduler.last_epoch == 1
        and fresh_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    )
    first = next(iter(optimizer.state.values()))
    assert torch.equal(next(iter(fresh_opt.state.values()))["exp_avg"], first["exp_avg"].to("cpu"))
    assert (random.random(), np.random.rand()) == expected_draws[:2] and torch.equal(torch.rand(1), expected_draws[2])
    reloaded, _ = load_model(str(path / "model"))  # the checkpoint's model is a plain HF directory
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight.to("cpu"))


def test_a_crash_mid_write_leaves_no_complete_looking_checkpoint(tmp_path, trained, monkeypatch):
    first = _save(tmp_path, trained, 1)
    real_save = torch.save

    def crash_on_optimizer(obj, path, *a, **kw):
        if str(path).endswith("optimizer.pt"):
            raise OSError("disk full")
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", crash_on_optimizer)
    with pytest.raises(OSError, match="disk full"):
        _save(tmp_path, trained, 2)
    monkeypatch.undo()
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]


def test_only_renamed_dirs_with_the_marker_count(tmp_path, trained):
    """What a SIGKILL can leave behind: a temp dir (even a full one) or a step dir without the marker."""
    first = _save(tmp_path, trained, 1)
    root = tmp_path / "checkpoints"
    shutil.copytree(first, root / ".tmp-step-00000003-4242")  # killed just before the rename
    shutil.copytree(first, root / "step-00000002")
    (root / "step-00000002" / ckpt.COMPLETE_MARKER).unlink()
    assert ckpt.latest_checkpoint(tmp_path) == first
    with pytest.raises(ckpt.CheckpointError, match="not a complete checkpoint"):
        ckpt.load_checkpoint(root / "step-00000002", trained[0])
    _save(tmp_path, trained, 4)
    assert not (root / ".tmp-step-00000003-4242").exists()  # the next save clears what a killed run left


def test_a_complete_marker_cut_after_a_line_is_damage(tmp_path, trained):
    """Cut between two manifest lines, the marker still reads well: the files it no longer lists (an
    optimizer state flipped since, say) went unchecked."""
    path = _save(tmp_path, trained, 1)
    marker = path / ckpt.COMPLETE_MARKER
    lines = marker.read_text().splitlines(keepends=True)
    assert damage(path) is None and len(lines) > 2
    marker.write_text("".join(lines[:2]))
    assert damage(path).startswith("its COMPLETE marker is cut: its manifest does not list ")


def test_a_complete_marker_cut_after_its_step_line_is_damage_not_an_older_omrls(tmp_path, trained):
    """``step N`` alone is what an older omrl wrote (no manifest: the user may vouch for it); a marker of
    this omrl cut after that line says how many files it listed, so it is damage and cannot be vouched for."""
    path = _save(tmp_path, trained, 1)
    marker = path / ckpt.COMPLETE_MARKER
    first = marker.read_text().splitlines()[0]
    assert first.startswith("step 1 files ")
    marker.write_text(first + "\n")
    assert damage(path).startswith("its COMPLETE marker is cut: it lists 0 of its ")
    assert not ckpt.trust_checkpoint(path)  # nothing to vouch for: a manifest was written and lost
    marker.write_text("step 1\n")  # an older omrl's
    assert damage(path) is None and ckpt.trust_checkpoint(path) and damage(path) is None


def test_keep_last_n(tmp_path, trained):
    for step in (1, 2, 3, 4):
        _save(tmp_path, trained, step, keep=2)
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000003", "step-00000004"]


def test_resume_refuses_a_different_config_naming_the_keys(tmp_path, trained):
    _save(tmp_path, trained, 1)
    changed = {"seed": 1, "optim": {"lr": 2.0}, "logging": {"logging_steps": 5}}
    with pytest.raises(ckpt.CheckpointError) as info:
        resume_checkpoint(tmp_path, changed)
    message = str(info.value)
    assert "seed: 0 -> 1" in message and "optim.lr: 1.0 -> 2.0" in message and "logging_steps" not in message
    same = {"seed": 0, "optim": {"lr": 1.0}, "description": "renamed", "logging": {"save_steps": 9}}
    assert resume_checkpoint(tmp_path, same).name == "step-00000001"
    with pytest.raises(ckpt.CheckpointError, match="nothing to resume"):
        resume_checkpoint(tmp_path / "elsewhere", same)


def test_a_run_stopped_by_a_tight_deadline_resumes_with_longer_deadlines(tmp_path, trained):
    saved = {"seed": 0, "deadlines": {"generate_s": 5.0, "on_stall": "stop", "grace_s": 30.0}}
    _save(tmp_path, trained, 1, config=saved)
    longer = {"seed": 0, "deadlines": {"generate_s": 2000.0, "on_stall": "drop", "grace_s": 60.0}}
    assert resume_checkpoint(tmp_path, longer).name == "step-00000001"


def test_a_run_whose_generation_server_moved_resumes_against_its_new_address(tmp_path, trained):
    """A server that failed often comes back on another port: generation.base_url was refused as a changed key."""
    saved = {"seed": 0, "generation": {"base_url": "http://a:8000/v1", "weight_dir": "/w1", "temperature": 1.0}}
    _save(tmp_path, trained, 1, config=saved)
    moved = {"seed": 0, "generation": {"base_url": "http://b:9000/v1", "weight_dir": "/w2", "temperature": 1.0}}
    assert resume_checkpoint(tmp_path, moved).name == "step-00000001"
    hotter = {"seed": 0, "generation": {**moved["generation"], "temperature": 0.5}}
    with pytest.raises(ckpt.CheckpointError, match="generation.temperature: 1.0 -> 0.5"):  # what is sampled: not
        resume_checkpoint(tmp_path, hotter)


def test_an_option_newer_than_the_checkpoint_warns_at_its_default_and_refuses_otherwise(tmp_path, trained):
    _save(tmp_path, trained, 1)  # saved config: {"seed": 0, "optim": {"lr": 1.0}}
    defaults = {"seed": 0, "optim": {"lr": 1.0}, "env": {"demonstration": True}}
    newer = {"seed": 0, "optim": {"lr": 1.0}, "env": {"demonstration": True}}
    with pytest.warns(
        UserWarning, match=r"before omrl had the option\(s\) env.demonstration: .*env.demonstration=True"
    ):
        assert resume_checkpoint(tmp_path, newer, defaults=defaults).name == "step-00000001"
    changed = {"seed": 0, "optim": {"lr": 1.0}, "env": {"demonstration": False}}
    with pytest.raises(ckpt.CheckpointError, match="env.demonstration: '<absent>' -> False"):
        resume_checkpoint(tmp_path, changed, defaults=defaults)


def test_saved_weights_are_as_readable_as_the_umask_allows(tmp_path, trained):
    """safetensors writes 0600 whatever the umask: a run's model and checkpoints were the writer's alone,
    so a vLLM server run by another user could not read them."""
    from omrl.training.model_setup import save_final_model

    old = os.umask(0o022)
    try:
        checkpoint = _save(tmp_path / "run", trained, 1)
        save_final_model(trained[0], trained[1], tmp_path / "final", merge_lora=False)
    finally:
        os.umask(old)
    for folder in (checkpoint, tmp_path / "final"):
        modes = {
            p.relative_to(folder).as_posix(): oct(p.stat().st_mode & 0o777) for p in folder.rglob("*") if p.is_file()
        }
        assert any(name.endswith(".safetensors") for name in modes)
        assert set(modes.values()) == {"0o644"}, modes


def test_a_resume_in_another_number_of_processes_is_told_what_that_changes(tmp_path, trained, monkeypatch):
    """A two-process RL run resumed as its Ctrl-C message said (plain ``omrl train --resume``) went on in one
    process with no word: its episodes from there were another run's."""
    model, tok, optimizer, scheduler = trained
    path = ckpt.save_checkpoint(tmp_path, 1, model, optimizer=optimizer, scheduler=scheduler, processes=2)
    with pytest.warns(UserWarning, match="resuming in 1 process\\(es\\) a run that 2 checkpointed.*launch 2 processes"):
        ckpt.load_checkpoint(path, model, optimizer=optimizer, scheduler=scheduler)

    monkeypatch.setenv("WORLD_SIZE", "2")  # what the Ctrl-C message of a run of two says
    assert (
        f"Continue with: accelerate launch --num_processes 2 -m omrl train --resume --output-dir {tmp_path} (with "
        "--config_file as this run was launched)" in str(ckpt.interrupted(tmp_path, "train"))
    )
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert f"Continue with: omrl train --resume --output-dir {tmp_path}" in str(ckpt.interrupted(tmp_path, "train"))


def test_a_file_where_a_checkpoint_goes_leaves_nothing_behind(tmp_path, trained):
    """It was renamed to .deleting-* and left there: rmtree does nothing to a file."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step-00000001").write_text("in the way")
    _save(tmp_path, trained, 1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001"]
