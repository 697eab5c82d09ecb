"""The policy's forward pass for RL: per-token log-probs, entropy and values, aligned with input_ids."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from omrl.training.logits import entropy_from_logits, token_log_probs


class ValueHead(nn.Module):
    """A scalar value per position on top of the policy's last hidden state (PPO's critic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)  # start at V = 0: the first advantages are plain returns
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def _align(per_next_token: torch.Tensor) -> torch.Tensor:
    """[bs, L-1] values about tokens 1..L-1 -> [bs, L] aligned with input_ids (position 0 is 0)."""
    return torch.nn.functional.pad(per_next_token, (1, 0))


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


def policy_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   value_head: ValueHead | None = None, token_mask: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
    """Log-probs (and optionally entropy and values) of every token given the tokens before it.

    Returns tensors [bs, L]: ``log_probs[:, t]`` = log p(input_ids[t] | input_ids[:t]) under the
    sampling temperature; ``values[:, t]`` is the critic's value of the state that produced token t.

    ``token_mask`` [bs, L] names the tokens whose log-probs (and entropy) are needed, e.g. the
    response mask; the LM head and the vocabulary-sized softmax then run only at the positions
    predicting them (a fraction of a multi-turn episode), and the other positions hold 0.
    """
    head = _output_head(model) if token_mask is not None else None
    need_hidden = value_head is not None or head is not None
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                output_hidden_states=need_hidden, **({"logits_to_keep": 1} if head is not None else {}))
    targets = input_ids[:, 1:]
    if head is not None:
        chosen = token_mask[:, 1:].bool()
        logits = head(out.hidden_states[-1][:, :-1][chosen]).float()[None]  # [1, n, V]: only those asked for
    else:
        logits = out.logits[:, :-1].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature

    def place(values: torch.Tensor) -> torch.Tensor:  # back to [bs, L] aligned with input_ids
        if head is None:
            return _align(values)
        full = values.new_zeros(targets.shape)
        full[chosen] = values[0]
        return _align(full)

    picked = targets[chosen][None] if head is not None else targets
    result = {"log_probs": place(token_log_probs(logits, picked))}
    if with_entropy:
        result["entropy"] = place(entropy_from_logits(logits))
    if value_head is not None:
        result["values"] = _align(value_head(out.hidden_states[-1][:, :-1]))
    return result


def sequence_log_prob(model: nn.Module, mb, temperature: float = 1.0) -> torch.Tensor:
    """Summed log-prob of each row's sampled tokens (``mb["loss_mask"]``): [bs]."""
    out = policy_forward(model, mb["input_ids"], mb["attention_mask"], temperature, token_mask=mb["loss_mask"])
    return (out["log_probs"] * mb["loss_mask"]).sum(-1)
