"""A ragged step (rows feeding one id or a prompt's rest in one flat forward, each attending to its own states)
gives each row the logits and states the same tokens give run alone."""

from __future__ import annotations

import pytest
import torch

from omrl.backends.hf import HFBackend
from omrl.backends.kv_cache import from_dynamic_cache, kv_length
from omrl.backends.kv_ragged import RaggedBatch
from omrl.errors import ConfigError


def alone(model, ids: list[int]):
    """The model on ``ids`` by itself: (the last position's logits, its states of batch 1)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), cache=cache, use_cache=True).logits[0, -1].float()
    return logits, from_dynamic_cache(cache)


def ragged_forward(model):
    """A ragged step's model call for a bare model (no backend, no tokenizer): logits at the kept positions."""

    def forward(ids, positions, cache, mask, keep):
        return model(
            input_ids=ids, position_ids=positions, cache=cache, attention_mask=mask, logits_to_keep=keep
        ).logits[0]

    return forward


def sequences(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (length,), generator=generator).tolist() for _ in range(count)]


def test_a_prompt_riding_a_decode_step_gets_the_logits_and_states_it_gets_alone(tiny_hf):
    model, tokenizer = tiny_hf
    forward = HFBackend(model, tokenizer)._forward
    # three decoding rows of different lengths and a joining row with 6 cached tokens and 9 to feed
    held = [ids[:n] for ids, n in zip(sequences(4, 40, seed=1), (30, 7, 19, 6))]
    feeds = [[11], [12], [13], list(range(20, 29))]
    batch = RaggedBatch(model, max_rows=4, device=torch.device("cpu"))
    for ids in held:
        assert batch.add(alone(model, ids)[1]) == held.index(ids)
    with torch.no_grad():
        logits = batch.step(forward, feeds)
    assert logits.shape == (4, model.config.vocab_size)
    for row, (ids, fed) in enumerate(zip(held, feeds)):
        want_logits, want_states = alone(model, ids + fed)
        assert logits[row] == pytest.approx(want_logits, abs=1e-4)
        assert batch.lengths[row] == kv_length(want_states) == len(ids) + len(fed)
        for (keys, values), (want_keys, want_values) in zip(batch.row(row), want_states):
            assert torch.allclose(keys, want_keys, atol=1e-5) and torch.allclose(values, want_values, atol=1e-5)


def test_rows_leave_join_and_grow_past_the_buffers_and_keep_their_own_states(tiny_hf):
    model, tokenizer = tiny_hf
    forward = HFBackend(model, tokenizer)._forward
    batch = RaggedBatch(model, max_rows=3, device=torch.device("cpu"))
    first, second, third = sequences(3, 12, seed=2)
    played = {0: first[:5], 1: [], 2: second[:9]}  # row 1 starts with no states at all
    for row in sorted(played):
        batch.add(alone(model, played[row])[1] if played[row] else [])
    feeds = {0: first[5:], 1: [7, 8, 9], 2: [second[9]]}
    with torch.no_grad():
        for step in range(300):  # far past the first buffers' columns
            batch.step(forward, [feeds[row] for row in range(batch.rows)])
            for row in range(batch.rows):
                played[row] = played[row] + feeds[row]
                feeds[row] = [3 + (step + row) % 50]
            if step == 2:  # row 0 leaves: the last row takes its place, then a new row joins
                batch.remove(0)
                played, feeds = {0: played[2], 1: played[1]}, {0: feeds[2], 1: feeds[1]}
                batch.add(alone(model, third[:4])[1])
                played[2], feeds[2] = third[:4], third[4:]
        logits = batch.step(forward, [feeds[row] for row in range(batch.rows)])
    for row in range(batch.rows):
        want_logits, want_states = alone(model, played[row] + feeds[row])
        assert batch.lengths[row] == len(played[row]) + len(feeds[row]) > 300
        assert logits[row] == pytest.approx(want_logits, abs=1e-4)


def test_a_step_must_feed_every_row(tiny_hf):
    model, tokenizer = tiny_hf
    batch = RaggedBatch(model, max_rows=2, device=torch.device("cpu"))
    batch.add([])
    with pytest.raises(ValueError, match="every row one or more ids; row 0 got none"):
        batch.step(HFBackend(model, tokenizer)._forward, [[]])
    with pytest.raises(ValueError, match="feeds each of the 1 rows, got 2 feeds"):
        batch.step(HFBackend(model, tokenizer)._forward, [[1], [2]])


def test_attention_it_does_not_do_is_refused_not_computed_otherwise():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, sliding_window=4, max_position_embeddings=64,
    )  # fmt: skip
    model = MistralForCausalLM(config).eval()

    forward = ragged_forward(model)

    batch = RaggedBatch(model, max_rows=1, device=torch.device("cpu"))
    batch.add([])
    with (
        torch.no_grad(),
        pytest.raises(ConfigError, match="cannot run this model's attention.*valid: generation.batching=turns"),
    ):
        batch.step(forward, [[1, 2, 3]])
    assert model.config._attn_implementation != "omrl_ragged"  # switched back


def test_a_model_whose_config_names_no_key_value_heads_runs_ragged():
    """GPT-2's config has query heads only (as many key-value heads): the batch sizes its buffers from them."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=128)).eval()

    forward = ragged_forward(model)

    held, fed = [5, 6, 7, 8], [9, 10, 11]
    batch = RaggedBatch(model, max_rows=2, device=torch.device("cpu"))
    batch.add(alone(model, held)[1])
    batch.add([])
    with torch.no_grad():
        logits = batch.step(forward, [fed, [12, 13]])
    assert logits[0] == pytest.approx(alone(model, held + fed)[0], abs=1e-4)
    assert logits[1] == pytest.approx(alone(model, [12, 13])[0], abs=1e-4)
