"""Per-token log-probs and entropies from logits, in chunks of tokens.

A [bs, T, V] logits tensor is large (4 x 2048 x 150k float32 is ~5 GB): a
log_softmax or softmax over all of it at once doubles that. Both functions work
on ``chunk_tokens`` positions at a time, in float32 (bfloat16 logits are upcast
one chunk at a time), and never build a full log_softmax.
"""

from __future__ import annotations

import torch

from omrl.errors import OmrlError

DEFAULT_CHUNK_TOKENS = 1024


def _chunks(logits: torch.Tensor, chunk_tokens: int) -> tuple[torch.Tensor, list[slice]]:
    if logits.dim() != 3:
        raise OmrlError(f"logits must be [bs, T, V], got shape {tuple(logits.shape)}")
    if chunk_tokens <= 0:
        raise OmrlError(f"chunk_tokens must be positive, got {chunk_tokens}")
    flat = logits.reshape(-1, logits.shape[-1])
    return flat, [slice(i, i + chunk_tokens) for i in range(0, flat.shape[0], chunk_tokens)]


def token_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """log softmax(logits)[label] per position: [bs, T, V], [bs, T] -> [bs, T] float32.

    ``logits[:, t]`` must already score ``labels[:, t]``: for a causal LM pass
    ``logits[:, :-1]`` and ``input_ids[:, 1:]``. Computed as
    logit[label] - logsumexp(logit), so no [bs, T, V] log_softmax is built.
    Differentiable.
    """
    if labels.shape != logits.shape[:-1]:
        raise OmrlError(
            f"token_log_probs: labels have shape {tuple(labels.shape)}, logits "
            f"{tuple(logits.shape)}; labels must be logits' shape without V"
        )
    flat, parts = _chunks(logits, chunk_tokens)
    flat_labels = labels.reshape(-1, 1).long()
    pieces = []
    for part in parts:
        chunk = flat[part].float()
        picked = chunk.gather(-1, flat_labels[part]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(pieces).reshape(labels.shape) if pieces else flat.new_zeros(labels.shape, dtype=torch.float32)


def entropy_from_logits(logits: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Entropy of softmax(logits) per position: [bs, T, V] -> [bs, T] float32.

    H = logsumexp(z) - sum_v softmax(z)_v * z_v (equal to -sum p log p, without a
    log_softmax tensor). Differentiable, for an entropy bonus.
    """
    flat, parts = _chunks(logits, chunk_tokens)
    pieces = []
    for part in parts:
        chunk = flat[part].float()
        probs = torch.softmax(chunk, dim=-1)
        pieces.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(-1))
    shape = logits.shape[:-1]
    return torch.cat(pieces).reshape(shape) if pieces else flat.new_zeros(shape, dtype=torch.float32)
