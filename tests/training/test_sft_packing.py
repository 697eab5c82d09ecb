"""Shifted assistant-only labels, packing layout and isolation, length bucketing."""

from __future__ import annotations

import torch

from omrl.chat import encode_conversation
from omrl.data.conversations import Conversation, record_to_conversation
from omrl.training.packing import (
    IGNORE_INDEX,
    collate,
    micro_batches,
    pack_rows,
    shifted_labels,
    tokenize_conversations,
)
from omrl.training.policy import labelled_nll_sum

from .sample_data import agent_records


def _conversations(n: int = 8) -> list[Conversation]:
    return [record_to_conversation(r, f"test row {i}") for i, r in enumerate(agent_records(n), 1)]


def _segments(row) -> list[tuple[int, int]]:
    """[start, end) of each conversation in a packed row (where the positions restart)."""
    starts = [i for i, pos in enumerate(row.position_ids) if pos == 0]
    return list(zip(starts, starts[1:] + [len(row)]))


def test_labels_are_the_next_token_exactly_where_the_mask_is_on(tiny_model):
    _, tok = tiny_model
    conv = _conversations(1)[0]
    ids, mask = encode_conversation(tok, conv.messages)
    (row,), dropped, _ = tokenize_conversations(tok, [conv], max_seq_length=1024)
    assert dropped == 0 and row.input_ids == ids
    for t in range(len(ids) - 1):
        assert row.labels[t] == (ids[t + 1] if mask[t + 1] else IGNORE_INDEX)
    assert row.labels[-1] == IGNORE_INDEX
    learned = tok.decode([label for label in row.labels if label != IGNORE_INDEX])
    replies = [m["content"] for m in conv.messages if m["role"] == "assistant"]
    assert learned == "".join(r + tok.eos_token for r in replies)  # assistant text + end-of-turn, nothing else


def test_truncation_drops_conversations_left_without_assistant_tokens(tiny_model):
    _, tok = tiny_model
    convs = _conversations(2)
    prompt_len = encode_conversation(tok, convs[0].messages)[1].index(1)
    rows, dropped, truncated = tokenize_conversations(tok, convs, max_seq_length=prompt_len - 1)
    assert rows == [] and dropped == 2 and truncated == 0  # dropped, not counted as cut too
    rows, dropped, truncated = tokenize_conversations(tok, convs, max_seq_length=prompt_len + 3)
    assert dropped == 0 and truncated == 2 and all(len(r) == prompt_len + 3 for r in rows)


def test_pack_rows_layout(tiny_model):
    _, tok = tiny_model
    rows, _, _ = tokenize_conversations(tok, _conversations(8), max_seq_length=512)
    lengths = sorted(len(r) for r in rows)
    packed = pack_rows(rows, max_seq_length=2 * lengths[-1] + 5)
    assert len(packed) < len(rows) and all(len(p) <= 2 * lengths[-1] + 5 for p in packed)
    unpacked = []
    for p in packed:
        segments = _segments(p)
        assert len(segments) == p.num_conversations  # positions restart per conversation
        for _, end in segments:
            assert p.labels[end - 1] == IGNORE_INDEX  # no conversation predicts the next one's first token
        unpacked += [tuple(p.input_ids[a:b]) for a, b in segments]
    assert sorted(unpacked) == sorted(tuple(r.input_ids) for r in rows)  # every conversation once, intact


def test_packed_row_attends_only_within_each_conversation(tiny_model):
    """transformers turns reset position_ids into a block-diagonal mask for sdpa on CPU (no attention_mask)."""
    model, tok = tiny_model
    model.train()  # the recipe's mode: use_cache=False keeps the packed-sequence detection on
    rows, _, _ = tokenize_conversations(tok, _conversations(3), max_seq_length=512)
    packed = pack_rows(rows, max_seq_length=sum(len(r) for r in rows))
    assert len(packed) == 1 and packed[0].num_conversations == 3
    with torch.no_grad():
        batch = {k: v.to(model.device) for k, v in collate(packed, tok.pad_token_id).items()}
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        for start, end in _segments(packed[0]):
            alone = model(
                input_ids=torch.tensor([packed[0].input_ids[start:end]], device=model.device), use_cache=False
            )
            alone = alone.logits[0]
            assert torch.allclose(logits[start:end], alone, atol=1e-4)


def test_micro_batches_group_similar_lengths_and_collate_pads_safely():
    from omrl.training.packing import Row

    rows = [Row(list(range(1, n + 1)), [7] * n, list(range(n))) for n in (9, 2, 8, 3, 10, 1)]
    groups = micro_batches(rows, size=2)
    assert [[len(rows[i]) for i in g] for g in groups] == [[1, 2], [3, 8], [9, 10]]
    batch = collate([rows[i] for i in groups[1]], pad_token_id=0)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["labels"][0, 3:].eq(IGNORE_INDEX).all() and batch["input_ids"][0, 3:].eq(0).all()
    assert batch["position_ids"][0].tolist() == list(range(8))  # padding continues the positions


def test_shifted_labels_are_the_next_token_under_the_mask():
    assert shifted_labels([5, 6, 7, 8], [0, 0, 1, 1]) == [IGNORE_INDEX, 7, 8, IGNORE_INDEX]


def test_the_loss_on_labelled_positions_only_equals_cross_entropy_on_full_logits(tiny_model):
    """The LM head runs only where labels are; loss and gradients match the full-vocabulary path."""
    model, tok = tiny_model
    rows, _, _ = tokenize_conversations(tok, _conversations(3), max_seq_length=1024)
    batch = {k: v.to(model.device) for k, v in collate(rows, pad_token_id=tok.pad_token_id).items()}
    args = (batch["input_ids"], batch["position_ids"])

    model.zero_grad()
    logits = model(input_ids=args[0], position_ids=args[1], use_cache=False).logits.float()
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    expected.backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    got = labelled_nll_sum(model, *args, batch["labels"])
    got.backward()
    assert torch.allclose(got, expected, rtol=1e-5)
    for p, want in zip(model.parameters(), expected_grads):
        # atol relative to the largest gradient: a GPU sums the full and the labelled-only paths in other orders
        assert torch.allclose(p.grad, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    model.zero_grad()


def test_a_huge_message_is_cut_before_tokenizing_to_the_same_row(tiny_model):
    _, tok = tiny_model
    long_reply = "Act: " + "go north and look around. " * 4_000  # ~100 KB
    conv = Conversation(
        [{"role": "user", "content": "Find the key."}, {"role": "assistant", "content": long_reply}], "test row 1"
    )
    ids, mask = encode_conversation(tok, conv.messages)  # the whole conversation, uncut
    (row,), dropped, truncated = tokenize_conversations(tok, [conv], max_seq_length=64)
    assert (dropped, truncated) == (0, 1)
    assert row.input_ids == ids[:64] and row.labels == shifted_labels(ids, mask)[:64]
    huge = Conversation([conv.messages[0], {"role": "assistant", "content": "x" * 30_000_000}], "test row 2")
    (row,), _, truncated = tokenize_conversations(tok, [huge], max_seq_length=64)  # 30 MB: read only as far as needed
    assert len(row) == 64 and truncated == 1


def test_a_conversation_cut_before_its_first_reply_is_dropped(tiny_model):
    _, tok = tiny_model
    conv = Conversation(
        [{"role": "user", "content": "y" * 1_000_000}, {"role": "assistant", "content": "Act: go"}], "test row 1"
    )
    assert tokenize_conversations(tok, [conv], max_seq_length=32) == ([], 1, 0)


def test_trls_prompt_completion_records_train_on_the_completion_alone(tiny_model):
    """TRL's data was refused: it holds a prompt and a completion, not a list of messages."""
    import pytest

    from omrl.data.record_files import DatasetFormatError

    _, tok = tiny_model
    text = record_to_conversation({"prompt": "Walk to the goal.", "completion": "Act: up", "id": 7}, "row 1")
    chat = record_to_conversation(
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Walk to the goal."}],
            "completion": [{"role": "assistant", "content": "Act: up"}],
        },
        "row 2",
    )
    assert text.messages == [
        {"role": "user", "content": "Walk to the goal."},
        {"role": "assistant", "content": "Act: up"},
    ]
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"] and text.id == "7"
    for conv in (text, chat):
        (row,), _, _ = tokenize_conversations(tok, [conv], max_seq_length=1024)
        assert tok.decode([label for label in row.labels if label != IGNORE_INDEX]) == "Act: up" + tok.eos_token
    with pytest.raises(DatasetFormatError, match=r"row 3: 'completion' must be text or a non-empty list of messages"):
        record_to_conversation({"prompt": "hi", "completion": []}, "row 3")
