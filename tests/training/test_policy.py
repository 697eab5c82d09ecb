"""policy_forward: per-token log-probs, entropy and values aligned with input_ids."""

from __future__ import annotations

import torch

from omrl.training.policy import ValueHead, _output_head, policy_forward


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
