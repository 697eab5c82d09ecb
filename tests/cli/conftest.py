"""Running ``omrl.cli.main`` in the test process: what it changes for the process is put back after."""

from __future__ import annotations

import warnings

import pytest

from omrl.cli import main


@pytest.fixture
def omrl_main(monkeypatch, capsys):
    """``omrl_main(*argv)``: run the command line as ``omrl`` would; (exit status, stdout, stderr)."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main prints warnings its own way
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("COLUMNS", "200")

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main(list(argv))
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what is refused must be refused before."""

    def from_pretrained(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", from_pretrained)
