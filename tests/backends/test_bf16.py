"""``bf16=true``: the hf backend generates under bfloat16 autocast, in each of its engines, and leaves the
weights as they are."""

from __future__ import annotations

import contextlib

import pytest
import torch

from omrl.backends import SamplingParams, make_backend
from omrl.backends.hf import HFBackend
from omrl.config.options import GenerationConfig

from .test_backends import chat_prompt, tempered_logprobs


@contextlib.contextmanager
def projection_dtypes(model):
    """The dtypes the first layer's query projection computed in, call by call."""
    seen: list[torch.dtype] = []
    handle = model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    try:
        yield seen
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def prompt(tiny_hf):
    return chat_prompt(tiny_hf[1], "a question about keys and chests")


@pytest.mark.parametrize("engine", [{"kv_reuse": True}, {"kv_reuse": False}])
@pytest.mark.parametrize("bf16", [False, True])
def test_generation_runs_in_the_precision_asked_for(tiny_hf, prompt, engine, bf16):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, bf16=bf16, **engine)
    with projection_dtypes(model) as seen:
        (gen,) = backend.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.7, seed=3))
    assert seen and set(seen) == {torch.bfloat16 if bf16 else torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the weights are not cast
    exact = tempered_logprobs(model, prompt, gen.token_ids, 0.7)  # float32, one forward pass
    gap = max(abs(a - b) for a, b in zip(gen.logprobs, exact))
    if bf16:
        assert 1e-6 < gap < 0.05  # bfloat16 products: close to float32's, not equal to them
    else:
        assert gap < 1e-4


def test_continuous_batching_decodes_in_bfloat16(tiny_hf, prompt):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, bf16=True, batching="continuous")
    stream = backend.stream(SamplingParams(max_new_tokens=5, temperature=0.7))
    tickets = [stream.submit(prompt, 5, seed) for seed in (1, 2)]
    done: dict[int, object] = {}
    with projection_dtypes(model) as seen:
        while stream.pending:
            done.update(stream.advance())
    assert sorted(done) == tickets and set(seen) == {torch.bfloat16}
    for gen in done.values():
        exact = tempered_logprobs(model, prompt, gen.token_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, exact)) < 0.05


def test_make_backend_hands_bf16_to_the_hf_backend(tiny_hf):
    model, tokenizer = tiny_hf
    assert make_backend("hf", tokenizer, GenerationConfig(), model=model, bf16=True).bf16
    assert not make_backend("hf", tokenizer, GenerationConfig(), model=model).bf16
