"""policy_forward: per-token log-probs, entropy and values aligned with input_ids."""

from __future__ import annotations

import torch

from omrl.training import policy
from omrl.training.policy import ValueHead, _output_head, policy_forward
from omrl.training.shared_prefix import no_logits


def _inputs(vocab: int):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 40), generator=generator)
    attention = torch.ones_like(ids)
    attention[2, 25:] = 0  # a right-padded row
    response = (torch.rand(3, 40, generator=generator) < 0.3).long() * attention
    response[:, 0] = 0  # position 0 is never predicted
    return ids, attention, response


def test_log_probs_match_a_manual_log_softmax(tiny_model):
    model, _ = tiny_model
    ids, attention, _ = (t.to(model.device) for t in _inputs(model.config.vocab_size))
    out = policy_forward(model, ids, attention, temperature=0.5)
    logits = model(input_ids=ids, attention_mask=attention).logits.float() / 0.5
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(out["log_probs"][:, 1:], want)
    assert torch.all(out["log_probs"][:, 0] == 0)


def test_response_only_head_gives_the_same_values_and_gradients(tiny_model):
    model, _ = tiny_model
    ids, attention, response = (t.to(model.device) for t in _inputs(model.config.vocab_size))
    head = ValueHead(model.config.hidden_size).to(model.device)
    results, grads = [], []
    for token_mask in (None, response):
        model.zero_grad()
        out = policy_forward(model, ids, attention, 0.7, with_entropy=True, value_head=head, token_mask=token_mask)
        ((out["log_probs"] + 0.1 * out["entropy"]) * response).sum().backward()
        results.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    full, masked = results
    chosen = response.bool()
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(masked[key][chosen], full[key][chosen])
        assert torch.all(masked[key][~chosen] == 0)  # unasked positions hold 0
    torch.testing.assert_close(masked["values"], full["values"])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6)


def test_models_with_transformed_logits_keep_the_full_head(tiny_model):
    model, _ = tiny_model
    assert _output_head(model) is model.get_output_embeddings()
    model.config.final_logit_softcapping = 30.0  # logits = cap * tanh(head / cap): not head alone
    try:
        assert _output_head(model) is None
    finally:
        model.config.final_logit_softcapping = None


def _chosen_backward(model, ids, attention, response, temperature=0.7):
    """policy_forward on the response positions, then backward of a loss on their log-probs and entropy."""
    model.zero_grad()
    out = policy_forward(model, ids, attention, temperature, with_entropy=True, token_mask=response)
    ((out["log_probs"] + 0.1 * out["entropy"]) * response).sum().backward()
    return out


def test_backward_recomputes_every_head_chunk_but_the_last(tiny_model, monkeypatch):
    model, _ = tiny_model
    ids, attention, response = (t.to(model.device) for t in _inputs(model.config.vocab_size))
    monkeypatch.setattr(policy, "HEAD_CHUNK", 8)
    calls = []
    chunk_stats = policy._chunk_stats
    monkeypatch.setattr(policy, "_chunk_stats", lambda *args: calls.append(1) or chunk_stats(*args))
    _chosen_backward(model, ids, attention, response)
    chunks = -(-int(response[:, 1:].sum()) // 8)
    assert chunks >= 3
    # each chunk once in forward; backward recomputes all but the last, which it reaches first
    assert len(calls) == chunks + chunks - 1


def test_a_tied_head_gets_the_module_path_gradients_summed_in_place(tiny_model):
    model, _ = tiny_model
    head = model.get_output_embeddings()
    assert head.weight is model.get_input_embeddings().weight  # tiny ties them
    ids, attention, response = (t.to(model.device) for t in _inputs(model.config.vocab_size))
    hook = head.register_forward_pre_hook(lambda *args: None)  # a watched head runs as the module
    try:
        module_out = _chosen_backward(model, ids, attention, response)
        module_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    finally:
        hook.remove()
    with torch.profiler.profile(record_shapes=True) as profile:
        out = _chosen_backward(model, ids, attention, response)
    for key in ("log_probs", "entropy"):
        assert torch.equal(out[key], module_out[key])
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, module_grads[name]), name
    # the head's and the embedding's gradients meet in one tensor, not in a new sum of both
    shape = list(head.weight.shape)
    copies = [e for e in profile.key_averages(group_by_input_shape=True) if e.key == "aten::add"]
    assert not [e for e in copies if e.input_shapes[:2] == [shape, shape]]


def test_no_logits_makes_a_transformers_model_compute_none(tiny_model):
    model, _ = tiny_model
    ids = torch.arange(1, 9, device=model.device)[None]
    out = model(input_ids=ids, output_hidden_states=True, **no_logits(model))
    assert out.logits.shape == (1, 0, model.config.vocab_size)
    assert out.hidden_states[-1].shape[1] == 8
    assert no_logits(torch.nn.Module()) == {"logits_to_keep": 1}  # others: the last position's
