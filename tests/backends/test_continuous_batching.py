"""Continuous batching (``generation.batching=continuous``): turns join the decode batch as their
episodes are ready, and what each samples does not depend on which turns shared its batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omrl.backends import SamplingParams, make_backend
from omrl.backends.hf import HFBackend
from omrl.errors import OmrlError
from tests.backends import test_kv_reuse as kv_reuse
from tests.backends.test_kv_reuse import chat, count_rows


def play(model, tokenizer, **kwargs):
    """A continuous rollout of the keys env, 3 tasks x 2 samples; returns (episodes, the backend's stats)."""
    episodes, stats, _ = kv_reuse.play(
        model, tokenizer, True, batching="continuous", batch_size=8, max_new_tokens=10, **kwargs
    )
    return episodes, stats


def test_a_reply_does_not_depend_on_the_turns_beside_it(tiny_hf):
    model, tokenizer = tiny_hf
    together, stats = play(model, tokenizer)
    alone, _ = play(model, tokenizer, max_parallel=1)  # each episode decoded by itself
    assert sum(len(ep.turns) for ep in together) > len(together)  # multi-turn
    assert [ep.token_ids for ep in together] == [ep.token_ids for ep in alone]
    for a, b in zip(together, alone):
        assert a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # later turns came from the KV cache, as turn by turn
    assert stats["prefill_reused"] > stats["prefill_computed"]
    assert stats["decode_tokens"] == sum(sum(ep.loss_mask) for ep in together)


def test_the_same_seed_samples_the_same_and_another_seed_differs(tiny_hf):
    model, tokenizer = tiny_hf
    first, _ = play(model, tokenizer)
    again, _ = play(model, tokenizer)
    other, _ = play(model, tokenizer, seed=6)
    assert [ep.token_ids for ep in first] == [ep.token_ids for ep in again]
    assert [ep.token_ids for ep in first] != [ep.token_ids for ep in other]


def test_greedy_replies_equal_turn_by_turn_ones(tiny_hf):
    """Greedy draws nothing at random, so the two batchings must agree id for id."""
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batching="continuous")
    params = SamplingParams(temperature=0)
    prompts = [chat(tokenizer, text) for text in ("open it", "take the key now", "look around the room")]
    stream = backend.stream(params)
    caps = [3, 9, 5]
    tickets = [stream.submit(p, cap, seed=None) for p, cap in zip(prompts, caps)]
    got = {}
    while stream.pending:
        done = stream.advance()
        assert done  # every call ends at least one turn
        got.update(done)
    expected = HFBackend(model, tokenizer, kv_reuse=False).generate(prompts, SamplingParams(caps, temperature=0))
    for ticket, want in zip(tickets, expected):
        assert got[ticket].token_ids == want.token_ids
        assert got[ticket].logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert stream.advance() == []  # nothing pending: nothing to do
    with pytest.raises(ValueError, match="a prompt needs one or more ids"):
        stream.submit([], 3, seed=None)


def test_a_turn_joins_the_batch_while_others_decode(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=2, batching="continuous")
    backend.stop_token_ids = [len(tokenizer) + 1]  # never sampled: only the limits end the rows
    rows_fed = count_rows(backend)
    stream = backend.stream(SamplingParams(temperature=0))
    short, long = stream.submit(chat(tokenizer, "short"), 2, None), stream.submit(chat(tokenizer, "long"), 6, None)
    waiting = stream.submit(chat(tokenizer, "third"), 3, None)  # batch_size 2: waits for a free row
    assert [t for t, _ in stream.advance()] == [short]
    assert [t for t, _ in stream.advance()] == [waiting]
    assert [t for t, _ in stream.advance()] == [long]
    # every call is one step, a prompt riding it: the short prompt alone (the long one shares its opening, so
    # waits a step to continue its states), then the long prompt beside the short row's first id, which ends it;
    # the third's prompt joins the long row's step, the two decode until the third ends, the long row goes on
    assert rows_fed == [1, 2, 2, 2, 2, 1, 1]
    assert backend.stats["prefill_computed"] < sum(len(chat(tokenizer, t)) for t in ("short", "long", "third"))


def test_a_tasks_samples_run_their_shared_prompt_once_and_join_together(tiny_hf):
    """Identical prompts (a task's samples): the first joins alone, the others all at the next step, each
    feeding only the prompt's last id on the first one's states."""
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=8, batching="continuous")
    backend.stop_token_ids = [len(tokenizer) + 1]  # never sampled: only the limit ends the rows
    rows_fed = count_rows(backend)
    stream = backend.stream(SamplingParams(temperature=0))
    prompt = chat(tokenizer, "the same task for every sample")
    tickets = [stream.submit(prompt, 3, None) for _ in range(4)]
    done = {}
    while stream.pending:
        done.update(stream.advance())
    assert rows_fed == [1, 4, 4, 3]
    assert backend.stats["prefill_computed"] == len(prompt) + 3
    assert len({tuple(done[t].token_ids) for t in tickets}) == 1  # greedy: the same reply four times


@pytest.mark.parametrize(
    ("backend", "settings", "message"),
    [
        ("hf", {"batching": "eager"}, "unknown generation.batching 'eager'; valid: turns, continuous"),
        ("hf", {"batching": "continuous", "kv_reuse": False}, "needs the KV-reusing engine"),
        ("openai", {"batching": "continuous"}, "needs the hf backend"),
        ("vllm", {"batching": "continuous"}, "needs the hf backend"),
    ],
)
def test_settings_it_cannot_serve_are_refused(tiny_hf, backend, settings, message):
    model, tokenizer = tiny_hf
    generation = SimpleNamespace(**{"batch_size": 4, "kv_reuse": True, "kv_cache_mb": 64, **settings})
    with pytest.raises(OmrlError, match=message):
        make_backend(backend, tokenizer, generation, model=model)


def test_turn_by_turn_is_the_default_and_has_no_stream(tiny_hf):
    model, tokenizer = tiny_hf
    assert HFBackend(model, tokenizer).stream(SamplingParams()) is None


@pytest.fixture(autouse=True)
def _one_thread():
    """Decode steps of different batch shapes round alike on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_omrl_rollout_plays_with_continuous_batching(fake_plugins, tmp_path, capsys):
    from omrl.data import read_episodes
    from tests.helpers import FAST, cli_exit, invoke, keys_rollout

    out = tmp_path / "cb.parquet"
    args = (*FAST, "--group-size", "2", "generation.batching=continuous", "--output", str(out))
    result = invoke(*keys_rollout(3, *args))
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert [(ep.group, ep.sample) for ep in episodes] == [(g, s) for g in range(3) for s in range(2)]
    assert all(ep.num_turns == 2 and sum(ep.loss_mask) > 0 for ep in episodes)
    code, _, err = cli_exit(capsys, *keys_rollout(1, "generation.batching=eager", "-o", str(tmp_path / "x.parquet")))
    assert code != 0 and "unknown generation.batching 'eager'; valid: turns, continuous" in err
    assert not (tmp_path / "x.parquet").exists()


def prefilled(backend: HFBackend, ids: torch.Tensor):
    """The states of ``ids`` less its last id (batch 1), as the KV store hands a row to a slot batch."""
    from omrl.backends.kv_cache import from_dynamic_cache, to_dynamic_cache

    cache = to_dynamic_cache([])
    with torch.no_grad():
        backend._forward(ids[:-1][None], torch.arange(len(ids) - 1, device=ids.device)[None], cache)
    return from_dynamic_cache(cache)


def step_alike(batch, backend: HFBackend, rows: list[torch.Tensor], times: int) -> None:
    """Decode ``times`` steps; each row's logits must equal those of its whole sequence run alone. Each
    row then takes a next id (the last id of each row is the one the next step feeds)."""
    for _ in range(times):
        with torch.no_grad():
            logits = batch.step(backend._forward, [int(ids[-1]) for ids in rows])
            for index, ids in enumerate(rows):
                alone = backend.model(input_ids=ids[None]).logits[0, -1].float()
                assert torch.allclose(logits[index], alone, atol=1e-4)
                rows[index] = torch.cat([ids, torch.tensor([7 + index], device=ids.device)])


def test_a_stacked_slot_batch_keeps_its_rows_in_order_and_its_columns(tiny_hf, monkeypatch):
    """The turn-by-turn engine's batch: rows stacked right-aligned to the longest (a left-padded
    stack's layout) and, as rows end, kept in their order without dropping a column; every step's
    logits equal those of each row's whole sequence run alone."""
    from omrl.backends import kv_slots

    monkeypatch.setattr(kv_slots, "HEADROOM", 2)  # outgrow the buffers while decoding
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)
    model.eval()
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 200, (n,), generator=generator).to(model.device) for n in (9, 4, 13, 6)]
    batch = kv_slots.SlotBatch.stack([prefilled(backend, ids) for ids in rows], model.device)
    assert (batch.end, batch.rows) == (12, 4)
    assert batch.mask[:4, :12].sum(dim=1).tolist() == [8, 3, 12, 5]  # right-aligned: pads on the left

    step_alike(batch, backend, rows, 3)
    batch.keep([1, 3])  # rows 0 and 2 ended: 1 and 3 move up, in order
    rows = [rows[1], rows[3]]
    assert (batch.end, batch.rows) == (15, 2)  # the longest row's columns stay, unused now
    step_alike(batch, backend, rows, 3)
    assert batch.row(0)[0][0].shape[2] == len(rows[0]) - 1  # its own tokens only
