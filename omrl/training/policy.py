"""The policy's forward pass for RL: per-token log-probs, entropy and values, aligned with input_ids."""

from __future__ import annotations

import torch
from torch import nn

from omrl_plugins.algos import entropy_from_logits, token_log_probs


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


def policy_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   value_head: ValueHead | None = None) -> dict[str, torch.Tensor]:
    """Log-probs (and optionally entropy and values) of every token given the tokens before it.

    Returns tensors [bs, L]: ``log_probs[:, t]`` = log p(input_ids[t] | input_ids[:t]) under the
    sampling temperature; ``values[:, t]`` is the critic's value of the state that produced token t.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                output_hidden_states=value_head is not None)
    logits = out.logits[:, :-1].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    result = {"log_probs": _align(token_log_probs(logits, input_ids[:, 1:]))}
    if with_entropy:
        result["entropy"] = _align(entropy_from_logits(logits))
    if value_head is not None:
        result["values"] = _align(value_head(out.hidden_states[-1][:, :-1]))
    return result
