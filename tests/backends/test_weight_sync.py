"""Trained weights into a generation server (``generation.weight_sync``): the files path against a
server speaking vLLM's RL routes, with the tiny model reloading the weights for real; the checks
that refuse what cannot work; a GRPO run whose rollouts come from the server."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omrl.backends import SamplingParams, make_backend
from omrl.backends.hf import HFBackend
from omrl.backends.sync_settings import check_weight_sync
from omrl.backends.weight_sync import make_weight_sync
from omrl.config.options import GenerationConfig
from omrl.errors import ConfigError, OmrlError
from omrl.models import load_model
from omrl.training.metrics import read_metrics
from tests.helpers import served_grpo_config
from tests.training.helpers import SampleIndexReward

from .fake_openai import FakeOpenAIServer
from .test_backends import chat_prompt, tempered_logprobs

UPDATE = [
    "pause?mode=keep",
    "collective_rpc:reload_weights",
    "reset_prefix_cache?reset_running_requests=true",
    "update_weight_version",
    "resume",
]


@pytest.fixture
def served(tiny_model_dir):
    """A server with its own copy of the tiny model, and the trainer's copy."""
    model, tokenizer = load_model(tiny_model_dir)
    server = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    trainer, _ = load_model(tiny_model_dir)
    yield server, trainer, tokenizer
    server.stop()


def generation(server, **options) -> GenerationConfig:
    return GenerationConfig(backend="openai", base_url=server.base_url, weight_sync="files", **options)


def test_files_sync_puts_the_trainers_weights_into_the_server(served, tmp_path):
    server, trainer, tokenizer = served
    backend = make_backend("openai", tokenizer, generation(server, weight_dir=str(tmp_path)), model_name="tiny")
    prompt = chat_prompt(tokenizer, "open the chest")
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    (before,) = backend.generate([prompt], params)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    backend.update_weights(trainer.state_dict(), version=1)
    assert server.calls == UPDATE and server.weight_version == "1" and not server.paused
    (after,) = backend.generate([prompt], params)
    # the server samples from the trainer's new weights: its log-probs are the trainer's
    assert after.logprobs == pytest.approx(tempered_logprobs(trainer, prompt, after.token_ids, 1.0), abs=1e-4)
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
    backend.update_weights(trainer.state_dict(), version=2)
    assert server.weight_version == "2"
    (own,) = tmp_path.iterdir()  # this run's own folder: runs sharing weight_dir never meet
    assert [p.name for p in own.iterdir()] == ["update-2"]  # the file the server read before is gone
    backend.close()
    assert tmp_path.exists() and not own.exists()  # the user's folder stays, this run's is removed


def test_a_weight_folder_is_absolute_and_removed_on_close(served, tmp_path, monkeypatch):
    server, trainer, tokenizer = served
    monkeypatch.chdir(tmp_path)
    sync = make_weight_sync(generation(server, weight_dir="relative/weights"))
    assert sync.root.is_absolute() and sync.root.parent == tmp_path / "relative" / "weights"
    sync.push(trainer.state_dict(), 1)  # the server resolves the path in its own working directory
    assert sync.root.exists()
    sync.close()
    assert not sync.root.exists()
    two = [make_weight_sync(generation(server, weight_dir=str(tmp_path / "shared"))) for _ in range(2)]
    for sync in two * 2:  # two runs (or a run and its resumption) on one folder
        sync.push(trainer.state_dict(), 1)
    for sync in two:
        sync.close()


def test_the_weights_are_as_readable_as_the_umask_allows(served, tmp_path):
    """A server under another user reads them where the umask lets it (mkdtemp alone makes a 0700 folder)."""
    server, trainer, _ = served
    old = os.umask(0o022)
    try:
        sync = make_weight_sync(generation(server, weight_dir=str(tmp_path)))
        sync.push(trainer.state_dict(), 1)
    finally:
        os.umask(old)
    (written,) = sync.root.rglob("model.safetensors")
    modes = [stat.S_IMODE(path.stat().st_mode) for path in (sync.root, written.parent, written)]
    sync.close()
    assert modes == [0o755, 0o755, 0o644]


# a run that starts a files sync on a server that is never called, then waits to be killed
KILLED_RUN = """
import sys, time
from omrl.backends.weight_sync import FileSync, ServerControl
print(FileSync(ServerControl("http://127.0.0.1:9/v1"), sys.argv[1]).root, flush=True)
time.sleep(300)
"""


@pytest.mark.slow  # a second process, SIGKILLed
def test_a_killed_runs_weight_folder_is_removed_by_the_next_run(served, tmp_path):
    server, _, _ = served
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    left = Path(run.stdout.readline().strip())
    run.send_signal(signal.SIGKILL)
    run.wait()
    elsewhere = tmp_path / "omrl-server-weights-another-host-12-34-abcd"  # another machine's run on shared storage
    elsewhere.mkdir()
    assert left.is_dir() and left.parent == tmp_path
    sync = make_weight_sync(generation(server, weight_dir=str(tmp_path)))
    assert sorted(tmp_path.iterdir()) == sorted([sync.root, elsewhere])  # a live run's folder stays too
    again = make_weight_sync(generation(server, weight_dir=str(tmp_path)))
    assert sync.root.is_dir()
    for one in (sync, again):
        one.close()


def test_a_server_without_the_rl_routes_is_named_with_how_to_start_it(served):
    server, trainer, tokenizer = served
    server.rl_routes = False
    backend = make_backend("openai", tokenizer, generation(server), model_name="tiny")
    with pytest.raises(OmrlError, match="no POST /pause .*VLLM_SERVER_DEV_MODE=1"):
        backend.update_weights(trainer.state_dict())
    backend.close()


def test_a_failed_reload_is_an_error_and_the_server_is_resumed(served, tmp_path):
    server, trainer, tokenizer = served
    backend = make_backend("openai", tokenizer, generation(server, weight_dir=str(tmp_path)), model_name="tiny")
    state = {k: v for k, v in trainer.state_dict().items() if "layers.0." not in k}  # weights missing
    with pytest.raises(OmrlError, match="HTTP 500.*missing"):
        backend.update_weights(state)
    assert server.calls[-1] == "resume" and not server.paused  # never left paused
    server.resume_fails = True
    with pytest.raises(OmrlError, match=r"HTTP 500.*missing.*\(and resuming the server failed too: .*resume broke"):
        backend.update_weights(state)  # the reload's failure is the one reported, the resume's beside it
    backend.close()


def test_a_refused_prefix_reset_is_an_error(served):
    """vLLM answers 200 with success false when it keeps its cache: old KV states would be reused."""
    server, trainer, tokenizer = served
    sync = make_weight_sync(generation(server))
    sync.push(trainer.state_dict(), 1)
    server.requests_hold_blocks = True
    sync.push(trainer.state_dict(), 2)  # requests hold blocks: reset with them, as vLLM does itself
    server.refuse_prefix_reset = True
    with pytest.raises(OmrlError, match="did not drop its prefix cache"):
        sync.push(trainer.state_dict(), 3)
    assert server.calls[-1] == "resume" and not server.paused
    sync.close()


def test_what_cannot_work_is_refused_naming_the_valid_choices():
    with pytest.raises(ConfigError, match="valid: none, files, nccl, lora"):
        check_weight_sync(GenerationConfig(backend="openai", weight_sync="rsync"), trains=True)
    with pytest.raises(ConfigError, match="hf backend gets them in process"):
        check_weight_sync(GenerationConfig(backend="hf", weight_sync="files"), trains=True)
    with pytest.raises(ConfigError, match="needs the trained weights on the server: set generation.weight_sync"):
        check_weight_sync(GenerationConfig(backend="openai"), trains=True)
    check_weight_sync(GenerationConfig(backend="openai"), trains=False)  # evaluation needs no weights
    with pytest.raises(ConfigError, match="model.lora_rank=8 trains adapters: set generation.weight_sync=lora"):
        check_weight_sync(GenerationConfig(backend="openai", weight_sync="files"), trains=True, lora_rank=8)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="weight_sync=nccl"):
            make_weight_sync(GenerationConfig(backend="openai", base_url="http://127.0.0.1:9/v1", weight_sync="nccl"))


def test_openai_backend_without_weight_sync_refuses_weights(served):
    server, trainer, tokenizer = served
    backend = make_backend("openai", tokenizer, GenerationConfig(base_url=server.base_url), model_name="tiny")
    with pytest.raises(OmrlError, match="only with generation.weight_sync=files, nccl or lora"):
        backend.update_weights(trainer.state_dict())


@pytest.mark.slow
def test_grpo_trains_with_rollouts_from_the_server(served, tmp_path, tiny_model_dir, register_plugin):
    """Two GRPO steps whose episodes the server samples: it gets the starting weights, then each
    update's, and ends serving exactly the weights the run saved."""
    from omrl.training.rl import run_rl

    server, _, _ = served
    register_plugin(SampleIndexReward(), name="sample-index")  # rewards that differ within a group
    out = tmp_path / "run"
    run_rl(served_grpo_config(server.base_url, tmp_path, "files", "steps=2", "optim.learning_rate=1e-3"))
    assert server.weight_version == "2"  # the starting weights (version 0), then one update per step
    assert server.calls == UPDATE * 3
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [1, 2]  # both steps updated
    saved, _ = load_model(str(out))
    served_state = server.backend.model.state_dict()
    for name, tensor in saved.state_dict().items():
        assert torch.equal(served_state[name], tensor), name
    start, _ = load_model(tiny_model_dir)
    assert any(not torch.equal(served_state[n], t) for n, t in start.state_dict().items())  # it trained
