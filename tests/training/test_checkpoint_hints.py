"""The ``omrl checkpoint trust`` lines omrl prints run as printed, on a path with a space too."""

from __future__ import annotations

import shlex

import pytest

from omrl.errors import DamagedModelError
from omrl.models import MODEL_MANIFEST
from omrl.models.loading import check_model_files
from omrl.models.manifest import manifest
from omrl.training.checkpoint import CheckpointError
from omrl.training.resume import resume_checkpoint


def printed_command(message: str, starts: str) -> list[str]:
    """The words of the command that ``message`` prints from ``starts`` to its end (or a backtick)."""
    return shlex.split(starts + message.split(starts, 1)[1].split("`")[0])


def test_the_trust_line_for_an_edited_model_runs_on_a_path_with_a_space(tmp_path):
    model = tmp_path / "my model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / MODEL_MANIFEST).write_text(manifest(model, ["config.json"]))
    (model / "config.json").write_text('{"edited": true}')
    with pytest.raises(DamagedModelError) as refused:
        check_model_files(model)
    assert printed_command(str(refused.value), "omrl checkpoint trust") == ["omrl", "checkpoint", "trust", str(model)]


def test_the_trust_line_for_an_older_checkpoint_runs_on_a_path_with_a_space(tmp_path):
    run = tmp_path / "my run"
    kept = run / "checkpoints" / "step-00000001"
    kept.mkdir(parents=True)
    (kept / "COMPLETE").write_text("step 1\n")  # an older omrl's: no digests
    with pytest.raises(CheckpointError) as refused:
        resume_checkpoint(run, {"seed": 0})
    assert printed_command(str(refused.value), "omrl checkpoint trust") == ["omrl", "checkpoint", "trust", str(kept)]
