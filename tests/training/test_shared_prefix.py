"""Shared prompt prefixes in the RL update: the grouping, and the same loss and gradients as whole rows."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from omrl import clock
from omrl.data.batch import Batch
from omrl.models import load_model
from omrl.training.metrics import read_metrics
from omrl.training.policy import policy_forward
from omrl.training.rl import RLRecipe, run_rl
from omrl.training.shared_prefix import (
    MIN_SHARED_TOKENS,
    PACKED_SUFFIX_TOKENS,
    SharedPrefix,
    packs,
    packs_suffixes,
    shared_prefix_groups,
    supports_shared_prefix,
)
from tests.training.helpers import gridworld_config

QUIET = Console(file=io.StringIO())


def rows_batch(rows: list[tuple[list[int], int]]) -> Batch:
    """A right-padded batch of (ids, prompt length) rows: tokens after the prompt are trained."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    loss = torch.zeros(len(rows), width)
    for i, (row, prompt) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        loss[i, prompt : len(row)] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "loss_mask": loss})


def test_groups_share_a_tasks_prompt_or_everyones_opening():
    opening = list(range(100, 160))  # 60 tokens every row starts with
    task_a, task_b = opening + [1] * 50, opening + [2] * 50
    batch = rows_batch([(task_a + [7, 8], 110), (task_b + [9], 110), (task_a + [5, 6, 7], 110), (task_b + [4], 110)])
    # per task: 2 groups of 2 rows sharing 109 tokens (one kept back) save 218 > 3 x 59 for everyone
    assert shared_prefix_groups(batch) == [([0, 2], 109), ([1, 3], 109)]
    # one row per task: only the common opening is shared
    batch = rows_batch([(task_a + [7], 110), (task_b + [9], 110), (opening + [3] * 50 + [1], 110)])
    assert shared_prefix_groups(batch) == [([0, 1, 2], 59)]
    # a prefix shorter than MIN_SHARED_TOKENS is not worth a pass: every row alone
    short = list(range(MIN_SHARED_TOKENS - 5))
    batch = rows_batch([(short + [1, 2], len(short)), (short + [3, 4], len(short))])
    assert shared_prefix_groups(batch) == [([0], 0), ([1], 0)]
    # trained tokens are never shared: the prefix stops before the earliest trained token
    batch = rows_batch([(task_a + [7], 70), (task_a + [8], 110)])
    assert shared_prefix_groups(batch) == [([0, 1], 69)]
    # a row packed from two sequences (positions restarting) shares only where its attention takes the mask
    batch = rows_batch([(task_a + [7], 110), (task_a + [8], 110), (task_a + [9], 110)])
    positions = torch.arange(batch["input_ids"].shape[1]).repeat(3, 1)
    positions[2, 100:] -= 100
    batch.tensors["position_ids"] = positions
    assert shared_prefix_groups(batch) == [([0, 1], 109), ([2], 0)]
    assert shared_prefix_groups(batch, packed_rows_share=True) == [([0, 1, 2], 109)]


def test_a_prefix_rows_are_packed_up_to_the_micro_batch_and_the_token_bound():
    half = PACKED_SUFFIX_TOKENS // 2
    assert packs([4, 5, 6, 7, 8], [10] * 5, size=2) == [[4, 5], [6, 7], [8]]
    # the bound: suffixes that add up past it start a new pack; one longer than it goes alone
    assert packs([1, 2, 3, 4], [half, half, 1, PACKED_SUFFIX_TOKENS + 1], size=8) == [[1, 2], [3], [4]]
    assert packs([1, 2], [5, 5], size=1) == [[1], [2]]


def test_only_attention_that_takes_the_mask_as_given_packs():
    """sdpa and eager take the 4-D mask; a sliding-window layer would be handed it too and see past its
    window, so such models run a prefix's rows one at a time."""
    from transformers import MistralConfig, MistralForCausalLM

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    full = MistralForCausalLM(MistralConfig(sliding_window=None, num_key_value_heads=2, **small))
    windowed = MistralForCausalLM(MistralConfig(sliding_window=8, num_key_value_heads=2, **small))
    for attention in ("sdpa", "eager"):
        full.config._attn_implementation = windowed.config._attn_implementation = attention
        assert packs_suffixes(full) and not packs_suffixes(windowed)
    full.config._attn_implementation = "flex_attention"
    assert not packs_suffixes(full)


def twin_models(attention: str):
    """Two copies of the tiny model (float32, CPU, training mode) with ``attention``: one runs whole rows,
    the other on a shared prefix."""
    models = []
    for _ in range(2):
        model, _ = load_model("tiny", dtype="float32", device="cpu")
        model.config._attn_implementation = attention
        model.train()
        models.append(model)
    return models


@pytest.fixture
def rows():
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(5, 200, (48,), generator=generator)
    suffixes = [torch.randint(5, 200, (n,), generator=generator) for n in (20, 33, 9)]
    return prefix, [torch.cat([prefix, suffix]) for suffix in suffixes]


def test_the_prefix_passes_count_as_the_updates_forward_and_backward(rows, tiny_model):
    model, _ = tiny_model
    prefix, (row, *_) = rows
    prefix, row = prefix.to(model.device), row.to(model.device)  # the model is on OMRL_TEST_DEVICE
    mask = torch.zeros(1, len(row), device=model.device)
    mask[0, len(prefix) :] = 1
    clock.take()
    with SharedPrefix(model, prefix[:-1]) as shared:
        assert set(clock.take()) == {"forward"}  # the prefix's own forward, not time/other
        out = policy_forward(model, row[None], torch.ones_like(row)[None], token_mask=mask, prefix=shared)
        (out["log_probs"] * mask).sum().backward()
    assert set(clock.take()) == {"backward"}  # its backward, when the block ends


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_shared_prefix_gives_the_gradients_of_whole_rows(rows, checkpointing):
    prefix, full_rows = rows
    models = []
    for _ in range(2):
        model, _ = load_model("tiny", dtype="float32", device="cpu")
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)(
                {"use_reentrant": False}
            )
        model.train()
        models.append(model)
    whole, shared = models
    assert supports_shared_prefix(shared)
    length = len(prefix) - 1

    def loss_of(model, row, **kwargs):
        mask = torch.zeros(1, len(row))
        mask[0, len(prefix) :] = 1
        out = policy_forward(
            model, row[None], torch.ones(1, len(row), dtype=torch.long), token_mask=mask, with_entropy=True, **kwargs
        )
        assert out["log_probs"].shape == (1, len(row)) and not out["log_probs"][0, : len(prefix)].any()
        return -(out["log_probs"] * mask).sum() - 0.01 * (out["entropy"] * mask).sum(), out["log_probs"]

    expected = []
    for row in full_rows:
        loss, log_probs = loss_of(whole, row)
        loss.backward()
        expected.append(log_probs.detach())
    embedded = []
    hook = shared.get_input_embeddings().register_forward_hook(lambda m, args, out: embedded.append(args[0].numel()))
    with SharedPrefix(shared, prefix[:length]) as shared_prefix:
        for row, want in zip(full_rows, expected):
            loss, log_probs = loss_of(shared, row, prefix=shared_prefix)
            loss.backward()
            torch.testing.assert_close(log_probs.detach(), want, atol=1e-5, rtol=0)
    hook.remove()
    assert embedded == [length] + [len(row) - length for row in full_rows]  # the prefix ran once
    for (name, a), b in zip(whole.named_parameters(), shared.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=2e-5, rtol=1e-4, msg=name)
    # the checkpointing switch the prefix turned on is back as it was
    assert all("_can_checkpoint_with_cache" not in m.__dict__ for m in shared.modules())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_rows_packed_on_a_shared_prefix_give_the_gradients_of_whole_rows(rows, attention):
    """A micro-batch of rows on one prefix runs as one sequence of their suffixes: each sees the
    prefix and itself only, and the log-probs, entropy and gradients are those of whole rows."""
    prefix, full_rows = rows
    whole, shared = twin_models(attention)
    batch = rows_batch([(row.tolist(), len(prefix)) for row in full_rows])
    ids, mask, trained = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]

    def loss_of(out):
        return -(out["log_probs"] * trained).sum() - 0.01 * (out["entropy"] * trained).sum()

    expected = policy_forward(whole, ids, mask, token_mask=trained, with_entropy=True)
    loss_of(expected).backward()
    passes = []
    hook = shared.get_input_embeddings().register_forward_hook(lambda m, args, out: passes.append(args[0].shape))
    with SharedPrefix(shared, prefix[:-1]) as shared_prefix:
        got = policy_forward(shared, ids, mask, token_mask=trained, with_entropy=True, prefix=shared_prefix)
        loss_of(got).backward()
    hook.remove()
    suffixes = sum(len(row) for row in full_rows) - len(full_rows) * (len(prefix) - 1)
    assert passes == [(1, len(prefix) - 1), (1, suffixes)]  # the prefix once, then every suffix in one pass
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(got[key] * trained, expected[key] * trained, atol=1e-5, rtol=0, msg=key)
    for (name, a), b in zip(whole.named_parameters(), shared.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_grpo_with_shared_prefixes_learns_what_whole_rows_learn(tiny_model_dir, tmp_path, monkeypatch):
    """Two steps of GRPO: the run that shares prompts takes the same steps, to float rounding."""
    passes = []
    real = RLRecipe._update_micro_batches

    def counting(self, mini, mb_size):
        for mb, prefix in real(self, mini, mb_size):
            passes.append(prefix is not None)
            yield mb, prefix

    monkeypatch.setattr(RLRecipe, "_update_micro_batches", counting)

    def run(share: bool, out: str):
        cfg = gridworld_config(
            tiny_model_dir,
            tmp_path / out,
            *("generation.max_new_tokens=6", "algorithm.entropy_coef=0.01"),
            f"optim.share_prefix={str(share).lower()}",
        )
        run_rl(cfg, console=QUIET)
        return read_metrics(cfg.logging.output_dir), load_model(cfg.logging.output_dir)[0]

    shared_metrics, shared_model = run(True, "shared")
    assert passes and all(passes)  # every row ran on its task's prompt
    passes.clear()
    whole_metrics, whole_model = run(False, "whole")
    assert passes and not any(passes)
    for a, b in zip(shared_metrics, whole_metrics, strict=True):
        for key in ("loss", "pg_loss", "entropy", "reward_mean", "grad_norm"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    for (name, p), q in zip(shared_model.state_dict().items(), whole_model.state_dict().values()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_on_a_shared_prefix_give_the_gradients_of_whole_packed_rows(rows, attention):
    """A split episode (chat.history=as_template) is one row of several sequences, positions restarting at
    each; on a shared prefix it runs with the block-diagonal mask omrl builds, and trains as without one."""
    prefix, full_rows = rows
    generator = torch.Generator().manual_seed(2)
    packed = []  # each row: the first sequence (the prefix, then its reply), then a second whole sequence
    for row in full_rows:
        second = torch.randint(5, 200, (int(torch.randint(20, 40, (1,), generator=generator)),), generator=generator)
        positions = torch.cat([torch.arange(len(row)), torch.arange(len(second))])
        packed.append((torch.cat([row, second]), positions, len(row)))
    whole, shared = twin_models(attention)
    length = len(prefix) - 1

    def loss_of(model, row, positions, **kwargs):
        mask = torch.ones(1, len(row))
        mask[0, : len(prefix)] = 0
        second = int((positions == 0).nonzero()[1])
        mask[0, second : second + 3] = 0  # the second sequence's prompt is not trained
        out = policy_forward(
            model,
            row[None],
            torch.ones(1, len(row), dtype=torch.long),
            token_mask=mask,
            position_ids=positions[None],
            **kwargs,
        )
        return -(out["log_probs"] * mask).sum(), out["log_probs"]

    expected = []
    for row, positions, _ in packed:
        loss, log_probs = loss_of(whole, row, positions)
        loss.backward()
        expected.append(log_probs.detach())
    with SharedPrefix(shared, prefix[:length]) as shared_prefix:
        for (row, positions, _), want in zip(packed, expected):
            loss, log_probs = loss_of(shared, row, positions, prefix=shared_prefix)
            loss.backward()
            torch.testing.assert_close(log_probs.detach(), want, atol=1e-5, rtol=0)
    for (name, a), b in zip(whole.named_parameters(), shared.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=2e-5, rtol=1e-4, msg=name)
    # without the mask the second sequence would see the first: other numbers
    with torch.no_grad():
        row, positions, _ = packed[0]
        leaky = policy_forward(
            whole, row[None], torch.ones(1, len(row), dtype=torch.long), token_mask=torch.ones(1, len(row))
        )["log_probs"]
    assert not torch.allclose(leaky, expected[0], atol=1e-3)
