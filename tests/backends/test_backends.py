"""Generation backends: hf on the tiny model, openai against a local fake server, the factory."""

from __future__ import annotations

import pytest
import torch

from omrl.backends import SamplingParams, make_backend
from omrl.backends.base import Generation, generation_metrics
from omrl.backends.hf import HFBackend
from omrl.backends.openai import EndpointError, OpenAIBackend
from omrl.config.options import GenerationConfig
from omrl.errors import OmrlError, UnknownNameError
from omrl.rollout import RolloutLimits, token_exact
from tests.helpers import play_keys

from .fake_openai import FakeOpenAIServer


def chat_prompt(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
    )


@pytest.fixture(scope="module")
def prompts(tiny_hf):
    _, tokenizer = tiny_hf
    return [chat_prompt(tokenizer, "hi"), chat_prompt(tokenizer, "a much longer question about keys and chests")]


def tempered_logprobs(model, prompt, ids, temperature):
    """Log-probs of ``ids`` after ``prompt`` under softmax(logits / temperature), by one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids], device=model.device)).logits[0, len(prompt) - 1 : -1]
    chosen = torch.tensor(ids, device=logits.device)[:, None]
    return torch.log_softmax(logits / temperature, -1).gather(1, chosen).squeeze(1).tolist()


def test_hf_greedy_batch_equals_one_prompt_at_a_time(tiny_hf, prompts):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=8)
    together = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    alone = [backend.generate([p], SamplingParams(max_new_tokens=8, temperature=0))[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert together[0].token_ids != together[1].token_ids  # left padding did not blur the prompts together


def test_hf_logprobs_are_those_of_the_sampling_distribution(tiny_hf, prompts):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    (gen,) = backend.generate(prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.7, seed=3))
    assert gen.logprobs == pytest.approx(tempered_logprobs(model, prompts[0], gen.token_ids, 0.7), abs=1e-4)
    (nucleus,) = backend.generate(prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.5, seed=3))
    plain = tempered_logprobs(model, prompts[0], nucleus.token_ids, 0.7)
    assert all(a > b for a, b in zip(nucleus.logprobs, plain))  # renormalized over the nucleus


def test_hf_per_prompt_limits_seeds_and_state(tiny_hf, prompts):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=1)
    model.train()
    gens = backend.generate(prompts, SamplingParams(max_new_tokens=[3, 7], seed=0))
    assert model.training  # the caller's train/eval mode is restored
    assert [len(g.token_ids) for g in gens] == [3, 7] and {g.finish_reason for g in gens} == {"length"}
    again = backend.generate(prompts, SamplingParams(max_new_tokens=[3, 7], seed=0))
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    with pytest.raises(OmrlError, match="2 limits for 1 prompts"):
        backend.generate(prompts[:1], SamplingParams(max_new_tokens=[3, 7]))
    model.eval()


def test_hf_ignores_the_models_own_sampling_defaults(tiny_hf, prompts):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    clean = backend.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0))
    saved = model.generation_config
    model.generation_config = saved.__class__(**saved.to_dict())
    model.generation_config.repetition_penalty = 50.0
    model.generation_config.top_k = 1
    try:
        assert [g.token_ids for g in backend.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0))] == [
            g.token_ids for g in clean
        ]
        assert model.generation_config.repetition_penalty == 50.0
    finally:
        model.generation_config = saved


def test_hf_update_weights_loads_a_state_dict(tiny_model_dir, prompts):
    from omrl.models import load_model

    model, tokenizer = load_model(tiny_model_dir)
    backend = HFBackend(model, tokenizer)
    before = backend.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0))
    backend.update_weights(model.state_dict())  # its own weights: nothing to copy
    changed = {k: v * 1.5 for k, v in model.state_dict().items()}  # tied weights stay tied
    backend.update_weights(changed)
    assert torch.equal(model.model.embed_tokens.weight, changed["model.embed_tokens.weight"])
    after = backend.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0))
    assert [g.logprobs for g in after] != [g.logprobs for g in before]


def test_generations_stop_at_the_end_of_turn_token(tiny_hf):
    _, tokenizer = tiny_hf
    backend = HFBackend(None, tokenizer)
    eos = tokenizer.eos_token_id
    assert backend._cut([5, eos, 7], [-1.0, -2.0, -3.0], 10) == Generation([5, eos], [-1.0, -2.0], "stop")
    assert backend._cut([5, 6, 7], [-1.0, -2.0, -3.0], 2) == Generation([5, 6], [-1.0, -2.0], "length")
    with pytest.raises(OmrlError, match="3 ids but 2 log-probs"):
        Generation([1, 2, 3], [0.0, 0.0], "stop")


def test_make_backend_names_and_errors(tiny_hf):
    model, tokenizer = tiny_hf
    assert isinstance(make_backend("hf", tokenizer, GenerationConfig(), model=model), HFBackend)
    with pytest.raises(UnknownNameError, match="valid: hf, vllm, openai"):
        make_backend("llamacpp", tokenizer, GenerationConfig())
    with pytest.raises(OmrlError, match="pip install 'omrl\\[vllm\\]'"):
        make_backend("vllm", tokenizer, GenerationConfig(), model_name="tiny")
    with pytest.raises(OmrlError, match="needs generation.base_url"):
        make_backend("openai", tokenizer, GenerationConfig(), model_name="tiny")


@pytest.fixture(scope="module")
def server(tiny_hf):
    model, tokenizer = tiny_hf
    srv = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["vllm", "logprob_tokens"])
def test_openai_backend_returns_the_servers_sampled_ids(server, tiny_hf, prompts, mode):
    model, tokenizer = tiny_hf
    server.mode = mode
    backend = OpenAIBackend(server.base_url, "tiny", tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=[4, 6], temperature=0)
    remote = backend.generate(prompts, params)
    local = HFBackend(model, tokenizer).generate(prompts, params)
    assert [g.token_ids for g in remote] == [g.token_ids for g in local]
    assert all(g.token_exact for g in remote) and not backend.chat_only
    assert remote[1].logprobs == pytest.approx(local[1].logprobs, abs=1e-4)
    path, body = server.requests[-1]
    assert path == "/completions" and isinstance(body["prompt"], list) and body["logprobs"] == 1


@pytest.mark.parametrize("kv_reuse", [True, False])
def test_hf_times_prefill_apart_from_decoding(tiny_hf, prompts, kv_reuse):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, kv_reuse=kv_reuse)
    backend.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    stats = backend.take_stats()
    assert 0 < stats["prefill_seconds"] < stats["generate_seconds"]
    assert stats["prefill_computed"] + stats["prefill_reused"] == sum(len(p) for p in prompts)
    assert stats["decode_tokens"] > 0
    metrics = generation_metrics(stats)
    assert metrics["decode_tokens_per_s"] > 0 and metrics["prefill_tokens_per_s"] > 0


def test_openai_backend_counts_tokens_and_the_servers_prefix_cache_hits(server, tiny_hf, prompts):
    _, tokenizer = tiny_hf
    server.mode = "vllm"
    backend = OpenAIBackend(server.base_url, "tiny", tokenizer, batch_size=1)
    params = SamplingParams(max_new_tokens=3, temperature=0)
    first = backend.generate(prompts[:1], params)
    again = backend.generate(prompts[:1], params)  # the server's cache holds this prompt now
    stats = backend.take_stats()
    assert stats["decode_tokens"] == len(first[0].token_ids) + len(again[0].token_ids)
    assert stats["generate_seconds"] > 0
    assert stats["prefill_computed"] + stats["prefill_reused"] == 2 * len(prompts[0])
    assert stats["prefill_reused"] >= len(prompts[0]) - 1  # all of the second call's prompt but its last token
    # no usage, or usage without the cache's share: the prompt counts stay unknown (0), not a 0% hit rate
    for mode, details in (("logprob_tokens", True), ("vllm", False)):
        server.mode, server.cache_details = mode, details
        try:
            backend.generate(prompts[:1], params)
        finally:
            server.mode, server.cache_details = "vllm", True
        stats = backend.take_stats()
        assert stats["prefill_computed"] == stats["prefill_reused"] == 0 and stats["decode_tokens"] > 0


def test_openai_backend_falls_back_to_chat_and_marks_episodes_not_token_exact(server, tiny_hf):
    _, tokenizer = tiny_hf
    server.mode = "text_only"
    try:
        backend = OpenAIBackend(server.base_url, "tiny", tokenizer)
        episodes = play_keys(
            tokenizer,
            backend,
            limits=RolloutLimits(max_new_tokens=5, max_turns=2),
        )
    finally:
        server.mode = "vllm"
    assert backend.chat_only and server.requests[-1][0] == "/chat/completions"
    (ep,) = episodes
    assert ep.num_turns == 2 and not token_exact(ep)
    assert all(t.info["rollout"]["token_exact"] is False for t in ep.turns)
    with pytest.raises(EndpointError, match="no chat messages"):
        backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))


def test_openai_backend_retries_then_reports(server, tiny_hf, prompts):
    _, tokenizer = tiny_hf
    backend = OpenAIBackend(server.base_url, "tiny", tokenizer, retries=2, backoff=0.0)
    server.fail_next = 2
    (gen,) = backend.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0))
    assert len(gen.token_ids) == 3 and server.fail_next == 0
    server.fail_next = 3
    with pytest.raises(EndpointError, match="HTTP 503"):
        backend.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0))
    server.fail_next = 0
    unreachable = OpenAIBackend("http://127.0.0.1:9/v1", "tiny", tokenizer, retries=0, timeout=2.0)
    with pytest.raises(EndpointError, match="cannot reach"):
        unreachable.generate(prompts[:1], SamplingParams(max_new_tokens=3))
