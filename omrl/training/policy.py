"""The policy's forward pass: per-token log-probs, entropy and values for RL, aligned with input_ids;
and SFT's summed loss on labelled tokens. Both run the LM head only where tokens are trained."""

from __future__ import annotations

import inspect

import torch
import torch.utils.checkpoint
from torch import nn

from omrl.training.logits import entropy_from_logits, token_log_probs
from omrl.training.packing import IGNORE_INDEX
from omrl.training.shared_prefix import PackedSuffixes, SharedPrefix, mask_for, no_logits


class ValueHead(nn.Module):
    """A scalar value per position on top of the policy's last hidden state (PPO's critic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)  # start at V = 0: the first advantages are plain returns
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def _align(per_next_token: torch.Tensor, start: int = 0) -> torch.Tensor:
    """[bs, L-1-start] values about tokens start+1..L-1 -> [bs, L] aligned with input_ids (0 before)."""
    return torch.nn.functional.pad(per_next_token, (start + 1, 0))


# Config fields of models whose logits are not just lm_head(last hidden state).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


def _output_head(model: nn.Module) -> nn.Module | None:
    """The LM head when the logits are exactly ``head(last hidden state)``, else None."""
    config = model.config.get_text_config()
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return None
    return model.get_output_embeddings()


def policy_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    value_head: ValueHead | None = None,
    token_mask: torch.Tensor | None = None,
    prefix: SharedPrefix | None = None,
    position_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Log-probs (and optionally entropy and values) of every token given the tokens before it.

    Returns tensors [bs, L]: ``log_probs[:, t]`` = log p(input_ids[t] | input_ids[:t]) under the
    sampling temperature; ``values[:, t]`` is the critic's value of the state that produced token t.

    ``token_mask`` [bs, L] names the tokens whose log-probs (and entropy) are needed, e.g. the
    response mask; the LM head and the vocabulary-sized softmax then run only at the positions
    predicting them (a fraction of a multi-turn episode), and the other positions hold 0.

    ``prefix``: the rows' first ``prefix.length`` tokens already ran (omrl.training.shared_prefix):
    only the rest runs, on the prefix's keys and values; the prefix's positions hold 0 (they are
    prompt tokens, never trained). Several rows on a prefix run as one packed sequence
    (:class:`~omrl.training.shared_prefix.PackedSuffixes`).

    ``position_ids`` [bs, L]: rows packed from several sequences (an episode split by
    ``chat.history=as_template``), positions restarting at each. The model then runs with no
    attention mask, and transformers turns the restarts into a block-diagonal causal mask, so
    no sequence sees another (right padding is seen by no real token). On a shared prefix (which
    lies in the first sequence) transformers builds no such mask, so it is given one
    (:func:`packed_mask`).
    """
    head = _output_head(model) if token_mask is not None else None
    need_hidden = value_head is not None or head is not None
    start = prefix.length if prefix is not None else 0
    suffixes = None
    if prefix is not None and input_ids.shape[0] > 1:  # several rows on one prefix: their suffixes packed
        if position_ids is not None:
            raise ValueError("rows of several sequences (position_ids) run on a shared prefix one at a time")
        suffixes = PackedSuffixes(model, input_ids, attention_mask, start)
        packed = {
            "input_ids": suffixes.input_ids,
            "position_ids": suffixes.position_ids,
            "attention_mask": suffixes.attention_mask,
        }
    elif position_ids is None:
        packed = {"input_ids": input_ids[:, start:], "attention_mask": attention_mask}
    elif prefix is None:
        packed = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": None}
    else:
        packed = {
            "input_ids": input_ids[:, start:],
            "position_ids": position_ids[:, start:],
            "attention_mask": packed_mask(model, position_ids, start),
        }
    out = model(
        **packed,
        use_cache=False,
        output_hidden_states=need_hidden,
        **(no_logits(model) if head is not None else {}),
        **(prefix.cache_kwargs() if prefix is not None else {}),
    )

    def rows(per_position: torch.Tensor) -> torch.Tensor:  # the model's outputs in the rows' layout
        return suffixes.unpack(per_position) if suffixes is not None else per_position

    hidden = rows(out.hidden_states[-1]) if need_hidden else None
    targets = input_ids[:, start + 1 :]
    if head is not None:  # only the positions asked for, in chunks recomputed in backward
        chosen = token_mask[:, start + 1 :].bool()
        log_probs, entropy = _head_stats(head, hidden[:, :-1][chosen], targets[chosen], temperature, with_entropy)
        result = {"log_probs": _place(log_probs, chosen, start)}
        if with_entropy:
            result["entropy"] = _place(entropy, chosen, start)
    else:
        logits = rows(out.logits)[:, :-1].float()
        if temperature and temperature != 1.0:
            logits = logits / temperature
        result = {"log_probs": _align(token_log_probs(logits, targets), start)}
        if with_entropy:
            result["entropy"] = _align(entropy_from_logits(logits), start)
    if value_head is not None:
        result["values"] = _align(value_head(hidden[:, :-1]), start)
    return result


def packed_mask(model: nn.Module, position_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
    """The causal, block-diagonal mask of packed rows, for the queries from ``start`` on: [bs, 1, L - start, L].

    A new sequence starts wherever a position does not follow the one before (as transformers reads
    packed rows). Boolean (True: attend) for sdpa, additive for eager attention; other kernels do not
    take a 4-D mask (:func:`omrl.training.shared_prefix.shared_prefix_groups` keeps packed rows alone).
    """
    follows = torch.ones_like(position_ids, dtype=torch.bool)
    follows[:, 1:] = position_ids[:, 1:] == position_ids[:, :-1] + 1
    sequence = (~follows).cumsum(-1)
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return mask_for(model, (causal & (sequence[:, :, None] == sequence[:, None, :]))[:, None, start:, :])


# Positions whose vocabulary-sized logits exist at once: [HEAD_CHUNK, V] float32 is 50 MB for a
# 49k vocabulary, where a whole episode's ([n, V], kept for backward) took a gigabyte or more.
HEAD_CHUNK = 256


def _head_stats(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` [n] (and entropy) from ``hidden`` [n, H] through the LM head, HEAD_CHUNK
    positions at a time; with gradients, each chunk's logits but the last are recomputed in backward
    instead of kept. The last chunk is the first that backward reaches, while everything else is still
    alive: keeping its logits adds nothing to the peak that recomputing them there would not."""
    log_probs, entropies = [], []
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[0], HEAD_CHUNK):
        args = (
            head,
            hidden[start : start + HEAD_CHUNK],
            targets[start : start + HEAD_CHUNK],
            temperature,
            with_entropy,
        )
        if recompute and start + HEAD_CHUNK < hidden.shape[0]:
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk_stats, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_stats(*args)
        log_probs.append(lp)
        entropies.append(ent)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    log_probs_all = torch.cat(log_probs) if log_probs else empty
    return log_probs_all, (torch.cat(entropies) if entropies else empty) if with_entropy else None


def _chunk_stats(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _head_logits(head, hidden).float()[None]  # [1, c, V]
    if temperature and temperature != 1.0:
        logits = logits / temperature
    entropy = entropy_from_logits(logits)[0] if with_entropy else logits.new_zeros(0)
    return token_log_probs(logits, targets[None])[0], entropy


def _head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)``; through :class:`_HeadLinear` where that is the same computation: a bias-free
    Linear that no hook watches (ZeRO-3 and FSDP fetch weights in hooks), outside autocast."""
    if _plain_linear(head) and not torch.is_autocast_enabled(hidden.device.type):
        return _HeadLinear.apply(hidden, head.weight)
    return head(hidden)


def _plain_linear(module: nn.Module) -> bool:
    """Whether calling ``module`` is exactly ``F.linear(x, module.weight)`` (the hooks torch's own
    fast path checks)."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    watched = [getattr(module, kind) for kind in kinds]
    watched += [getattr(nn.modules.module, f"_global{kind}") for kind in kinds]
    return type(module) is nn.Linear and module.bias is None and not any(watched)


class _HeadLinear(torch.autograd.Function):
    """``hidden @ weight.T`` whose weight gradient is a tensor of its own (autograd's is a transposed
    view), so that the input embedding's gradient, with a tied weight, adds into it in place instead of
    both being copied into a new vocabulary-sized tensor for every micro-batch. The products are those
    autograd computes for ``F.linear``, bit for bit."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight)
        return torch.nn.functional.linear(hidden, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        hidden, weight = ctx.saved_tensors
        grad_hidden = grad.mm(weight) if ctx.needs_input_grad[0] else None
        grad_weight = grad.t().mm(hidden) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight


def _place(values: torch.Tensor, chosen: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Values [n] of the ``chosen`` [bs, L-1-start] positions -> [bs, L] aligned with input_ids (0 elsewhere)."""
    full = values.new_zeros(chosen.shape)
    full[chosen] = values
    return _align(full, start)


def labelled_nll_sum(
    model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Summed cross-entropy of the labelled positions (SFT's loss before its normalisation): a scalar.

    ``labels`` [bs, L] are already shifted (``labels[:, t]`` is the token after position t, -100 where
    nothing is trained). The LM head and the softmax run only at labelled positions, in recomputed
    chunks: an agent conversation trains on its replies, a fraction of its tokens, and the
    vocabulary-sized logits of every position would dominate memory. Models whose logits are not
    ``head(last hidden state)`` take the plain path on full logits.
    """
    head = _output_head(model)
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        use_cache=False,
        output_hidden_states=head is not None,
        **(no_logits(model) if head is not None else {}),
    )
    chosen = labels != IGNORE_INDEX
    if head is None:
        return torch.nn.functional.cross_entropy(out.logits.float()[chosen], labels[chosen], reduction="sum")
    log_probs, _ = _head_stats(head, out.hidden_states[-1][chosen], labels[chosen], 1.0, False)
    return -log_probs.sum()


def sequence_log_prob(model: nn.Module, mb, temperature: float = 1.0) -> torch.Tensor:
    """Summed log-prob of each row's sampled tokens (``mb["loss_mask"]``): [bs]."""
    out = policy_forward(
        model,
        mb["input_ids"],
        mb["attention_mask"],
        temperature,
        token_mask=mb["loss_mask"],
        position_ids=mb.get("position_ids"),
    )
    return (out["log_probs"] * mb["loss_mask"]).sum(-1)
