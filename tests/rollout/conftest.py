"""Fixtures for rollout tests (the fakes themselves live in fakes.py)."""

from __future__ import annotations

import pytest

from .fakes import FakePlugin, KeyEnv


@pytest.fixture
def fake_plugins(register_plugin):
    """The `keys` env and the `action` template, registered for one test."""
    KeyEnv.instances = 0
    register_plugin(FakePlugin(), name="rollout-fakes")
    return FakePlugin


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir):
    """One tiny model + tokenizer shared by a test module (generation never changes its weights)."""
    from omrl.models import load_model

    return load_model(tiny_model_dir)
