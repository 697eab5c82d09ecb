"""Fixtures for the training tests: a small agent dataset and SFT configs on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from .sample_data import agent_records, sft_run_config


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread: OpenMP threads spin-wait for each other, and on a busy 2-core machine two of
    them ran the tiny model's forward/backward 15x slower than one (measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def agent_jsonl(tmp_path):
    """A JSONL dataset of 8 agent conversations."""
    path = tmp_path / "agent.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in agent_records()))
    return path


@pytest.fixture
def sft_config(tiny_model_dir, agent_jsonl, tmp_path):
    """``sft_config(**overrides)``: a fast SFT config on the tiny model (dotted keys as ``a__b``)."""
    return lambda **overrides: sft_run_config(tiny_model_dir, agent_jsonl, tmp_path / "run", **overrides)
