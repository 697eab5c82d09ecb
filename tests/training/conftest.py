"""Fixtures for the training tests: a small agent dataset, SFT configs and gridworld RL configs on the tiny model."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from .helpers import SampleIndexReward, gridworld_configs
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


@pytest.fixture
def sft_reference(sft_config, tmp_path):
    """``sft_reference(**overrides)``: the output folder of the :func:`sft_config` of ``overrides`` run through
    in ``tmp_path / "reference"``, uninterrupted: the run a stopped and resumed one must match."""
    from omrl.training.sft import run_sft

    def run_through(**overrides) -> Path:
        run_sft(
            sft_config(logging__output_dir=str(tmp_path / "reference"), **overrides),
            console=Console(file=io.StringIO()),
        )
        return tmp_path / "reference"

    return run_through


@pytest.fixture
def sample_index_configs(tiny_model_dir, tmp_path, register_plugin):
    """``sample_index_configs(*settings)``: :func:`gridworld_configs` of the tiny model under ``tmp_path``,
    rewarded by the sample's index (its plugin registered: every group's rewards differ, so steps update),
    8 rows a micro-batch, then ``settings``."""
    register_plugin(SampleIndexReward(), name="sample-index")
    return lambda *settings: gridworld_configs(
        tiny_model_dir, tmp_path, "reward.weights={sample_index: 1.0}", "optim.micro_batch_size=8", *settings
    )
