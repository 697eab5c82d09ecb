"""Fixtures for search tests (the fakes live in fakes.py)."""

from __future__ import annotations

import pytest

from .fakes import ChestPlugin


@pytest.fixture
def chest_plugins(register_plugin):
    """The chest envs and the `chest-action` template, registered for one test."""
    register_plugin(ChestPlugin(), name="search-fakes")
    return ChestPlugin


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir):
    """One tiny model + tokenizer shared by a test module (generation never changes its weights)."""
    from omrl.models import load_model

    return load_model(tiny_model_dir)
