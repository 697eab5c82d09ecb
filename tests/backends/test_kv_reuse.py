"""KV reuse in the hf backend: the same ids and log-probs as plain generate, less prefill, bounded memory.

Reuse on and off are compared token for token through whole multi-turn rollouts
(sampled with a fixed seed, and greedy) for the tiny model with its own tokenizer
and for SmolLM2 with its tokenizer; log-probs may differ by float rounding only.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omrl.backends import SamplingParams, make_backend
from omrl.backends.hf import HFBackend
from omrl.backends.kv_cache import PrefixCache, common_prefix
from omrl.config.options import GenerationConfig
from omrl.rollout import RolloutLimits
from tests.helpers import play_keys


def play(
    model,
    tokenizer,
    reuse: bool,
    *,
    tasks=(0, 1, 2),
    group_size=2,
    temperature=1.0,
    max_new_tokens=12,
    max_turns=4,
    cache_bytes=None,
    batching="turns",
    batch_size=3,
    max_parallel=0,
    seed=5,
):
    """A rollout of the keys env; returns (episodes, the backend's stats, the backend)."""
    backend = HFBackend(model, tokenizer, batch_size=batch_size, kv_reuse=reuse, batching=batching)
    if cache_bytes is not None:
        backend.kv_cache.max_bytes = cache_bytes
    limits = RolloutLimits(
        max_new_tokens=max_new_tokens, max_context=1024, max_turns=max_turns, temperature=temperature
    )
    episodes = play_keys(
        tokenizer,
        backend,
        tasks,
        group_size=group_size,
        seed=seed,
        limits=limits,
        max_parallel=max_parallel,
    )
    return episodes, backend.take_stats(), backend


def assert_same_rollouts(on, off):
    assert [ep.token_ids for ep in on] == [ep.token_ids for ep in off]
    for a, b in zip(on, off):
        assert a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_reuse_samples_what_generate_samples_tiny(tiny_hf):
    model, tokenizer = tiny_hf
    on, stats_on, backend = play(model, tokenizer, True)
    off, stats_off, _ = play(model, tokenizer, False)
    assert_same_rollouts(on, off)
    assert sum(len(ep.turns) for ep in on) > len(on)  # multi-turn: later turns had something to reuse
    assert stats_on["decode_tokens"] == stats_off["decode_tokens"]
    # every prompt token is either computed or reused; reuse computed fewer than plain generate
    assert stats_on["prefill_computed"] + stats_on["prefill_reused"] == stats_off["prefill_computed"]
    assert stats_on["prefill_computed"] < 0.5 * stats_off["prefill_computed"]
    # the episodes ended: only the shared opening is left
    assert backend.kv_cache.entries and all(e.shared for e in backend.kv_cache.entries)


def test_reuse_picks_what_generate_picks_greedy(tiny_hf):
    """Greedy turns by hand (the tiny model's greedy replies are blank, which would end a rollout)."""
    model, tokenizer = tiny_hf
    reuse, plain = HFBackend(model, tokenizer, batch_size=2), HFBackend(model, tokenizer, kv_reuse=False)
    greedy = SamplingParams(max_new_tokens=[4, 7, 5], temperature=0)
    chats = [chat(tokenizer, text) for text in ("open it", "take the key now", "look around the room")]
    for _turn in range(3):
        got, expected = reuse.generate(chats, greedy), plain.generate(chats, greedy)
        assert [g.token_ids for g in got] == [g.token_ids for g in expected]
        for a, b in zip(got, expected):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        chats = [continued(c, g) for c, g in zip(chats, got)]
    assert reuse.take_stats()["prefill_reused"] > 0


@pytest.mark.slow  # the real 135M model
def test_reuse_samples_what_generate_samples_smollm2(smollm2_dir):
    from omrl.models import load_model

    model, tokenizer = load_model(smollm2_dir)
    kwargs = dict(tasks=(0, 1), group_size=2, max_new_tokens=6, max_turns=3)
    on, stats_on, _ = play(model, tokenizer, True, **kwargs)
    off, _, _ = play(model, tokenizer, False, **kwargs)
    assert_same_rollouts(on, off)
    assert stats_on["prefill_reused"] > stats_on["prefill_computed"]


def test_a_small_cache_evicts_and_still_samples_the_same(tiny_hf):
    model, tokenizer = tiny_hf
    cap = 40_000  # bytes: room for a few dozen tokens of the tiny model's states
    on, stats_on, backend = play(model, tokenizer, True, cache_bytes=cap)
    off, stats_off, _ = play(model, tokenizer, False)
    assert_same_rollouts(on, off)
    assert backend.kv_cache.nbytes <= cap
    assert 0 < stats_on["prefill_reused"] and stats_on["prefill_computed"] < stats_off["prefill_computed"]


def count_rows(backend: HFBackend) -> list[int]:
    """The rows of every model call the backend makes from now on (filled as it goes)."""
    rows_fed: list[int] = []
    forward = backend._forward

    def counting(ids, *args):
        keep = args[3] if len(args) > 3 else None  # a ragged step: one flat row, a kept position per row fed
        rows_fed.append(ids.shape[0] if keep is None else len(keep))
        return forward(ids, *args)

    backend._forward = counting
    return rows_fed


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
    )


def continued(prompt: list[int], gen) -> list[int]:
    """The conversation after a turn: the prompt, the reply and a short new user message."""
    return prompt + gen.token_ids + [5, 6, 7]


def fused_adamw_step(model) -> None:
    """One training step whose in-place update bumps no version counter."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model(torch.tensor([[1, 2, 3]], device=model.device)).logits.sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def scale_in_place(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)


@pytest.mark.parametrize("change", [scale_in_place, fused_adamw_step], ids=["in_place", "fused_adamw"])
def test_new_weights_are_never_served_old_states(tiny_model, change):
    model, tokenizer = tiny_model
    backend = HFBackend(model, tokenizer)
    plain = HFBackend(model, tokenizer, kv_reuse=False)
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    prompt = chat(tokenizer, "open the chest")
    (first,) = backend.generate([prompt], greedy)
    backend.take_stats()
    change(model)  # the trainer's update, without any call to update_weights
    (second,) = backend.generate([continued(prompt, first)], greedy)
    assert backend.take_stats()["prefill_reused"] == 0
    (expected,) = plain.generate([continued(prompt, first)], greedy)
    assert second.token_ids == expected.token_ids
    assert second.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    # update_weights (a no-op copy when the trainer trains this very model) drops the cache too
    backend.update_weights(model.state_dict())
    assert backend.kv_cache.entries == []


def test_a_turn_prefills_only_its_new_tokens_and_release_frees_it(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=1)
    prompt = chat(tokenizer, "a locked chest")
    (first,) = backend.generate([prompt], params)
    backend.take_stats()
    conversation = continued(prompt, first)
    (second,) = backend.generate([conversation], params)
    stats = backend.take_stats()
    # the last sampled id was never fed to the model, so it is computed with the new user message
    assert stats["prefill_computed"] == 1 + 3
    assert stats["prefill_reused"] == len(conversation) - 4
    assert len(backend.kv_cache.entries) == 1  # the first turn's entry was superseded by the second's
    backend.release([continued(conversation, second)])  # the episode ended after its next message
    assert backend.kv_cache.entries == []


def test_finished_rows_stop_costing_compute(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    backend.eos_token_id = len(tokenizer) + 1  # never sampled: only the per-prompt limits end the rows
    rows_fed = count_rows(backend)
    prompts = [chat(tokenizer, "short"), chat(tokenizer, "a longer one"), chat(tokenizer, "the longest question")]
    gens = backend.generate(prompts, SamplingParams(max_new_tokens=[1, 2, 5], temperature=0))
    assert [len(g.token_ids) for g in gens] == [1, 2, 5]
    # one prefill a prompt; then the rows left: two, then the longest alone (generate would feed 3 rows 4 times)
    assert rows_fed == [1, 1, 1, 2, 1, 1, 1]


def test_samples_of_a_task_share_their_first_prompt_and_tasks_their_opening(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    system = {"role": "system", "content": "You play a text game. Reply with one action, and think first."}
    a, b = [
        tokenizer.apply_chat_template(
            [system, {"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        for text in ("find the key", "open chest two")
    ]
    backend.generate([a, a, b, b], SamplingParams(max_new_tokens=3, seed=0))
    stats = backend.take_stats()
    opening = common_prefix(torch.tensor(a), torch.tensor(b))
    assert stats["prefill_computed"] == len(a) + len(b) - opening
    assert [len(e.ids) for e in backend.kv_cache.entries if e.shared] == [opening]


def test_prefix_cache_matching_sharing_and_eviction():
    def kv(n: int):  # one layer, one head, head_dim 2: 16 bytes a token
        return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]

    cache = PrefixCache(max_bytes=16 * 20)
    first = cache.put(torch.arange(8), kv(8))
    entry, n = cache.longest(torch.tensor([0, 1, 2, 9, 9]))
    assert entry is first and n == 3
    assert cache.longest(torch.arange(8))[1] == 7  # one token is always left to run
    assert cache.longest(torch.tensor([5, 1]))[0] is None
    shared = cache.share(first, 3)
    assert shared is None  # shorter than the minimum worth sharing
    cache.min_shared = 2
    shared = cache.share(first, 3)
    assert shared.shared and shared.ids.tolist() == [0, 1, 2] and cache.share(first, 3) is None
    cache.tick()
    second = cache.put(torch.arange(100, 109), kv(9))  # 8 + 3 + 9 = 20 tokens: just fits
    assert cache.entries == [first, shared, second]
    cache.tick()
    cache.put(torch.arange(200, 204), kv(4))  # no room: the oldest episode entry goes, the opening stays
    assert first not in cache.entries and shared in cache.entries and cache.nbytes <= cache.max_bytes
    cache.release()
    assert cache.entries == [shared]
    assert cache.check_version("v1") and cache.entries == [] and not cache.check_version("v1")


def test_make_backend_reads_kv_reuse_when_the_config_has_it(tiny_hf):
    model, tokenizer = tiny_hf
    assert make_backend("hf", tokenizer, GenerationConfig(), model=model).kv_cache is not None
    off = SimpleNamespace(batch_size=4, kv_reuse=False, kv_cache_mb=64)
    assert make_backend("hf", tokenizer, off, model=model).kv_cache is None
    small = SimpleNamespace(batch_size=4, kv_reuse=True, kv_cache_mb=64)
    assert make_backend("hf", tokenizer, small, model=model).kv_cache.max_bytes == 64 * 2**20


def test_stats_are_taken_and_reset(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, kv_reuse=False)
    prompt = chat(tokenizer, "hi")
    backend.generate([prompt], SamplingParams(max_new_tokens=3, temperature=0))
    stats = backend.take_stats()
    assert stats["prefill_computed"] == len(prompt) and stats["prefill_reused"] == 0
    assert 1 <= stats["decode_tokens"] <= 3 and stats["generate_seconds"] > 0
    assert set(backend.take_stats().values()) == {0}
