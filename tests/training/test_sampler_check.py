"""The sampler checked after every weight sync: a generation server that silently keeps its old
weights stops the run, naming the version; one that loads them trains on."""

from __future__ import annotations

import pytest

from omrl.backends.hf import HFBackend
from omrl.config.options import TrainRunConfig
from omrl.models import load_model
from omrl.training.metrics import read_metrics
from omrl.training.online_run import SamplerStale
from omrl.training.rl import run_rl
from tests.backends.fake_openai import FakeOpenAIServer
from tests.helpers import served_grpo_config
from tests.training.helpers import SampleIndexReward


@pytest.fixture
def server(tiny_model_dir, register_plugin):
    model, tokenizer = load_model(tiny_model_dir)
    served = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    register_plugin(SampleIndexReward(), name="sample-index")  # rewards that differ within a group: updates
    yield served
    served.stop()


def grpo_from(server, tmp_path, *overrides: str) -> TrainRunConfig:
    return served_grpo_config(server.base_url, tmp_path, "files", "steps=3", "optim.learning_rate=1e-2", *overrides)


def test_a_server_that_keeps_its_old_weights_stops_the_run_naming_the_version(server, tmp_path):
    server._reload = lambda folder: None  # answers the reload, loads nothing
    with pytest.raises(SamplerStale, match=r"did not sample with the weights after 1 steps"):
        run_rl(grpo_from(server, tmp_path, "generation.sampler_check_kl=0.001"))
    steps = [m["step"] for m in read_metrics(tmp_path / "run")]
    assert steps == [1]  # step 2's rollout came from the old weights: not logged, not checkpointed


def test_a_server_that_loads_the_weights_passes_the_same_bound(server, tmp_path):
    run_rl(grpo_from(server, tmp_path, "generation.sampler_check_kl=0.001"))
    gaps = [m["mismatch_kl_k3"] for m in read_metrics(tmp_path / "run")]
    assert len(gaps) == 3 and max(gaps) < 0.001
